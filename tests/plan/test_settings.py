"""Every `auto` is decided once: the trainer, `estimate` and `fit` resolve a preset to the same settings
on the same machine, for a CUDA, an MPS and a CPU machine described by hand (no hardware needed)."""

from __future__ import annotations

import pytest

from workbench.config import resolve_preset
from workbench.machine.detect import Gpu, Machine
from workbench.plan import report
from workbench.plan.settings import SettingsError, resolve_settings
from workbench.train.batch_probe import fit_target
from workbench.train.loop import run_settings

GiB = 2**30
A100 = Machine(gpus=(Gpu(0, "NVIDIA A100-SXM4-80GB", 80 * GiB, 78 * GiB, (8, 0)),), physical_cores=16,
               ram_total=256 * GiB, ram_available=200 * GiB)
T4 = Machine(gpus=(Gpu(0, "Tesla T4", 16 * GiB, 15 * GiB, (7, 5)),), physical_cores=8)
M4 = Machine(mps=True, physical_cores=12, ram_total=48 * GiB, ram_available=40 * GiB,
             fused_optimizer_devices=frozenset({"cuda", "cpu", "mps"}))
LAPTOP = Machine(physical_cores=2, ram_total=24 * GiB, ram_available=20 * GiB, cpu_native_bf16=False)


def peak(device: str, precision: str) -> float | None:
    """A measured peak, as the trainer and `estimate` would calibrate it (CPU: 200 GFLOP/s)."""
    return 2e11 if device == "cpu" else None


def consumers(preset_name: str, machine: Machine, *overrides: str) -> dict[str, dict]:
    p = resolve_preset(preset_name, list(overrides))
    return {
        "trainer": run_settings(p, machine, world_size=1, steps_done=0, peak=peak).to_dict(),
        "estimate": report.build_report(p, machine, peak=peak)["settings"],
        "fit": fit_target(p, "auto", machine, peak)[1].to_dict(),
    }


@pytest.mark.parametrize("machine,expected", [
    (A100, dict(device="cuda", precision="bf16", autocast="bf16", grad_scaler=False, tf32=True, attention="flash",
                fused_optimizer=True, loss_chunk_tokens=0, compile=True, compile_mode="whole model",
                # host: medium's Muon is no single fused kernel (fused AdamW alone checks on the device)
                nonfinite_check="host", attention_kernel="auto", deterministic=False)),
    (T4, dict(device="cuda", precision="fp16", autocast="fp16", grad_scaler=True, fused_optimizer=True,
              nonfinite_check="host")),  # fp16's GradScaler keeps its own check
    (M4, dict(device="mps", precision="bf16", autocast="bf16", tf32=False, attention="math", fused_optimizer=False,
              loss_chunk_tokens=0, compile=False, compile_mode="off")),
    (LAPTOP, dict(device="cpu", precision="fp32", autocast=None, tf32=False, attention="flash", fused_optimizer=True,
                  loss_chunk_tokens=512, compile=True, compile_mode="all but the loss")),
], ids=["cuda-a100", "cuda-t4", "mps", "cpu"])
def test_trainer_estimate_and_fit_agree(machine, expected):
    got = consumers("medium", machine)
    assert got["trainer"] == got["estimate"] == got["fit"]
    assert {k: got["trainer"][k] for k in expected} == expected


def test_they_agree_where_the_rules_turn():
    # gpu-8gb's 24 x 1024 x 32768 logits pass 1 GiB: the fused loss on CUDA, compiled per block under checkpointing
    got = consumers("gpu-8gb", A100)
    assert got["trainer"] == got["estimate"] == got["fit"]
    assert got["trainer"]["loss_chunk_tokens"] == 2048 and got["trainer"]["compile_mode"] == "per block"
    # a 200-step cpu-small run is too short for a compile to pay back; its 2000 steps are not
    short = consumers("cpu-small", LAPTOP, "train.max_iters=200")
    assert short["trainer"] == short["estimate"] == short["fit"] and short["trainer"]["compile"] is False
    assert consumers("cpu-small", LAPTOP)["trainer"]["compile"] is True
    # the fused AdamW kernel is used on MPS only when asked for
    assert consumers("medium", M4, "hardware.fused_adamw=true")["trainer"]["fused_optimizer"] is True


def test_impossible_requests_are_refused_by_the_one_resolver():
    p = resolve_preset("gpu-8gb", [])
    with pytest.raises(SettingsError, match="CUDA is not available here"):
        resolve_settings(p, LAPTOP)
    with pytest.raises(SettingsError, match="not supported on CPU"):
        resolve_settings(resolve_preset("cpu-small", ["hardware.precision=fp16"]), LAPTOP)
    with pytest.raises(SettingsError, match="does not split over 3 processes"):
        resolve_settings(resolve_preset("cpu-small", []), LAPTOP, world_size=3)
    # a process layout of 0 is auto: one process per GPU, or per physical core on a CPU
    s = resolve_settings(resolve_preset("cpu-small", ["hardware.nproc=0"]), LAPTOP)
    assert (s.nproc, s.world_size, s.micro_batch) == (2, 2, 4)


def test_kernel_choices_reach_the_settings_and_determinism_picks_the_attention_kernel():
    """hardware.compile_kernels and attention_kernel are passed on as they are (on CUDA); hardware.deterministic
    on CUDA means the memory-efficient attention kernel unless one is named, and nothing on a CPU."""
    def s(machine, *over):
        return resolve_settings(resolve_preset("medium", list(over)), machine, peak=peak)
    assert s(A100, "hardware.compile_kernels=max-autotune").compile_kernels == "max-autotune"
    assert s(A100, "hardware.attention_kernel=cudnn").attention_kernel == "cudnn"
    det = s(A100, "hardware.deterministic=true")
    assert det.deterministic and det.attention_kernel == "efficient"
    assert s(A100, "hardware.deterministic=true", "hardware.attention_kernel=flash").attention_kernel == "flash"
    cpu = s(LAPTOP, "hardware.deterministic=true", "hardware.attention_kernel=cudnn")
    assert (cpu.deterministic, cpu.attention_kernel) == (False, "auto")


def test_compile_auto_on_a_cpu_follows_the_budget_not_max_iters():
    """README: `hardware.compile = auto` decides from the budget (a budgeted run takes its budget, whatever
    max_iters says; the budget's clock starts after the compile: tests/train/test_time_budget.py)."""
    def settings(*sets: str):
        return resolve_settings(resolve_preset("cpu-small", list(sets)), LAPTOP, world_size=1, peak=peak)

    long = settings("train.time_budget=20m", "train.max_iters=40")
    assert long.compile and long.compile_reason == "auto: ~20 min eager, >= 10 min, where a compile pays back"
    short = settings("train.time_budget=5m", "train.max_iters=10000000")
    assert not short.compile and short.compile_reason == "auto: ~5 min eager, < 10 min, where a compile pays back"
    assert settings("train.max_iters=10000000").compile and not settings("train.max_iters=40").compile
