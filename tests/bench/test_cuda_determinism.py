"""bench/cuda_determinism.py: each variant trained twice side by side and the first also killed (kill -9) half-way
and resumed, compared step by step. On the CPU (CI) the harness runs an eager variant, where every run is
deterministic, so each comparison must say every step is equal; on a GPU (`pytest -m gpu`) cpu-small's recipe as
shipped (Muon + wsd, QK-norm, per-block compile), which agreed on 4 of 30 steps before the trainer put inductor in
its deterministic mode under hardware.deterministic."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _bench(tmp_path: Path, *args: str) -> str:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "cuda_determinism.py"), "--runs-dir",
                          str(tmp_path / "runs"), *args], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _equal_lines(text: str, steps: int) -> list[str]:
    lines = [ln for ln in text.splitlines() if "steps bitwise equal" in ln]
    assert len(lines) == 2, text                       # the same run twice, and killed + resumed
    for ln in lines:
        assert re.search(rf": {steps}/{steps} steps bitwise equal, first different step None", ln), ln
    return lines


def test_the_harness_on_the_cpu_reports_every_step_equal(tmp_path):
    text = _bench(tmp_path, "--device", "cpu", "--steps", "9", "--variant", "eager=hardware.compile=false")
    lines = _equal_lines(text, 9)
    assert lines[0].startswith("eager (hardware.compile=false): the same run twice")
    assert "killed at step 4 and resumed" in lines[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_check.sh)")
def test_cpu_smalls_compiled_recipe_is_bitwise_reproducible_on_cuda(tmp_path):
    _equal_lines(_bench(tmp_path, "--steps", "30", "--variant", "shipped="), 30)
