"""The Hardware pane's capability table says what the estimate and the trainer do (issue 43: the pane said
"SDPA (math)" for a CPU whose `workbench estimate` said "attention flash"; torch runs its CPU flash kernel)."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from tests.support.canned_runs import HARDWARE
from tests.support.cli import wb
from workbench.config import resolve_preset
from workbench.machine.detect import Machine
from workbench.plan.fit.memory import estimate_settings
from workbench.tui.hwinfo import capabilities

CPU_ONLY = {**HARDWARE, "nvidia": []}


def _cpu_row() -> tuple[str, ...]:
    return next(r for r in capabilities(CPU_ONLY) if r[0] == "cpu")


def test_the_pane_names_the_cpu_attention_kernel_the_estimate_and_torch_use():
    settings = estimate_settings(resolve_preset("cpu-small"), Machine.from_info(CPU_ONLY))
    assert settings.attention == "flash"
    assert _cpu_row()[3] == "SDPA (flash; math with dropout)"
    out = wb("estimate", "cpu-small", "--set", "hardware.device=cpu", check=True).stdout
    assert "attention flash" in out
    # what torch picks for the model's calls on a CPU: causal, a packed row's boolean mask, attention dropout
    q = torch.randn(2, 4, 64, 32)
    mask = torch.ones(64, 64, dtype=torch.bool).tril()
    assert torch._fused_sdp_choice(q, q, q, None, 0.0, True) == int(SDPBackend.FLASH_ATTENTION)
    assert torch._fused_sdp_choice(q, q, q, mask, 0.0, False) == int(SDPBackend.FLASH_ATTENTION)
    assert torch._fused_sdp_choice(q, q, q, None, 0.1, True) == int(SDPBackend.MATH)
