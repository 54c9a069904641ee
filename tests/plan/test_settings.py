"""Every `auto` is decided once: the trainer, `estimate` and `fit` resolve a preset to the same settings
on the same machine, for a CUDA, an MPS and a CPU machine described by hand (no hardware needed)."""

from __future__ import annotations

import pytest

from workbench.config import resolve_preset
from workbench.machine.detect import Gpu, Machine
from workbench.plan import report
from workbench.plan.settings import SettingsError, resolve_settings
from workbench.train.batch_probe import fit_target
from workbench.train.start import run_settings

GiB = 2**30
A100 = Machine(gpus=(Gpu(0, "NVIDIA A100-SXM4-80GB", 80 * GiB, 78 * GiB, (8, 0)),), physical_cores=16,
               ram_total=256 * GiB, ram_available=200 * GiB)
T4 = Machine(gpus=(Gpu(0, "Tesla T4", 16 * GiB, 15 * GiB, (7, 5)),), physical_cores=8)
M4 = Machine(mps=True, physical_cores=12, ram_total=48 * GiB, ram_available=40 * GiB,
             fused_optimizer_devices=frozenset({"cuda", "cpu", "mps"}))
LAPTOP = Machine(physical_cores=2, ram_total=24 * GiB, ram_available=20 * GiB, cpu_native_bf16=False)


def card(gib: float, free_gib: float | None = None, name: str = "NVIDIA GPU") -> Machine:
    """A machine with one CUDA GPU of ``gib`` GiB (``free_gib`` of it free: another process holds the rest)."""
    free = int((gib if free_gib is None else free_gib) * GiB)
    return Machine(gpus=(Gpu(0, name, int(gib * GiB), free, (8, 9)),), physical_cores=8, ram_total=64 * GiB,
                   ram_available=48 * GiB)


CARD_8GB, CARD_24GB, CARD_80GB, CARD_141GB = card(8), card(24), card(80), card(141)


def peak(device: str, precision: str) -> float | None:
    """A measured peak, as the trainer and `estimate` would calibrate it (CPU: 200 GFLOP/s)."""
    return 2e11 if device == "cpu" else None


def consumers(preset_name: str, machine: Machine, *overrides: str) -> dict[str, dict]:
    p = resolve_preset(preset_name, list(overrides))
    return {
        "trainer": run_settings(p, machine, world_size=1, steps_done=0, peak=peak).to_dict(),
        "estimate": report.build_report(p, machine, peak=peak).settings.to_dict(),
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
    # gpu-8gb on an 8 GB card needs the fused loss and checkpointing (compiled per block); on an 80 GB one neither
    got = consumers("gpu-8gb", CARD_8GB)
    assert got["trainer"] == got["estimate"] == got["fit"]
    assert got["trainer"]["loss_chunk_tokens"] == 2048 and got["trainer"]["compile_mode"] == "per block"
    got = consumers("gpu-8gb", A100)
    assert got["trainer"] == got["estimate"] == got["fit"]
    assert got["trainer"]["loss_chunk_tokens"] == 0 and got["trainer"]["compile_mode"] == "whole model"
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


# The GPU issue's dims (nanoGPT's GPT-2 small shape, workbench's MLP sized to match its matrix parameters)
ISSUE_DIMS = ["model.dim=768", "model.n_layers=12", "model.n_heads=12", "model.n_kv_heads=12", "model.seq_len=1024",
              "model.vocab_size=32768", "model.ffn_hidden=2048", "train.batch_size=32", "train.grad_accum=1"]


def savers(machine: Machine, preset: str, *over: str) -> tuple[bool, bool]:
    """(fused loss, activation checkpointing) that auto picks for ``preset`` on ``machine``."""
    s = resolve_settings(resolve_preset(preset, list(over)), machine, world_size=1, peak=peak)
    return bool(s.loss_chunk_tokens), s.activation_checkpointing


@pytest.mark.parametrize("machine,preset,over,want", [
    # the issue's measurement: ~22 GiB with the plain loss, so on 80 and 141 GB cards the plain (compiled) loss
    (CARD_141GB, "gpu-24gb", ISSUE_DIMS, (False, False)),
    (CARD_80GB, "gpu-24gb", ISSUE_DIMS, (False, False)),
    # a 24 GB card: the plain loss fits at batch 32 (~20 GiB of 21.6); at 40 only the fused loss does
    (CARD_24GB, "gpu-24gb", ISSUE_DIMS, (False, False)),
    (CARD_24GB, "gpu-24gb", [*ISSUE_DIMS, "train.batch_size=40"], (True, False)),
    (CARD_8GB, "gpu-24gb", ISSUE_DIMS, (True, True)),
    # gpu-8gb's own shape: both savers on its 8 GB card, neither where there is room
    (CARD_8GB, "gpu-8gb", [], (True, True)),
    (CARD_24GB, "gpu-8gb", [], (False, False)),
    (CARD_141GB, "gpu-8gb", [], (False, False)),
    # gpu-24gb's own shape (8 x 2048, 311 M): a 24 GB card needs checkpointing but not the fused loss
    (CARD_24GB, "gpu-24gb", [], (False, True)),
    (CARD_80GB, "gpu-24gb", [], (False, False)),
], ids=["141gb-issue", "80gb-issue", "24gb-issue", "24gb-issue-batch-40", "8gb-issue", "8gb-gpu-8gb", "24gb-gpu-8gb",
        "141gb-gpu-8gb", "24gb-gpu-24gb", "80gb-gpu-24gb"])
def test_auto_memory_savers_are_the_fastest_pair_that_fits(machine, preset, over, want):
    assert savers(machine, preset, *over) == want


def test_auto_memory_savers_flip_where_the_estimate_crosses_the_free_memory():
    """The batch and the vocabulary at which each choice flips on a 24 GB card, checked against the estimate
    itself (fastest pair whose total is within 90 % of free memory), and the free memory (not the total) is
    what counts: a card that another process half fills needs the savers sooner."""
    from workbench.plan.fit.memory import estimate_memory
    from workbench.plan.fit.savers import SAVER_ORDER, with_savers

    def flips(vary: str, values: list[int], machine: Machine = CARD_24GB) -> list[tuple[bool, bool]]:
        out = []
        for v in values:
            p = resolve_preset("gpu-24gb", [*ISSUE_DIMS, f"{vary}={v}"])
            got = resolve_settings(p, machine, world_size=1, peak=peak)
            # the rule restated: the first pair of SAVER_ORDER whose estimate fits 90 % of the free memory
            free = machine.gpus[0].free_memory
            first = next((fc for fc in SAVER_ORDER if estimate_memory(p, settings=with_savers(
                got, *fc, got.loss_chunk_tokens or 2048, "")).total <= 0.9 * free), SAVER_ORDER[-1])
            assert (bool(got.loss_chunk_tokens), got.activation_checkpointing) == first, (vary, v)
            out.append(first)
        return out

    by_batch = flips("train.batch_size", [4, 8, 16, 24, 32, 40, 48, 56, 64, 128])
    assert by_batch[0] == (False, False) and by_batch[-1] == (True, True)
    assert len(set(by_batch)) >= 3, by_batch  # plain -> fused loss -> both as the batch grows
    by_vocab = flips("model.vocab_size", [4096, 16384, 32768, 65536, 131072])
    assert by_vocab[0] == (False, False) and by_vocab[-1][0] is True, by_vocab
    # the same 24 GB card with 12 GB taken by another process
    assert savers(card(24, 12), "gpu-24gb", *ISSUE_DIMS) != savers(CARD_24GB, "gpu-24gb", *ISSUE_DIMS)


def test_explicit_memory_savers_are_kept_and_the_reason_says_why():
    s = resolve_settings(resolve_preset("gpu-8gb", ["hardware.chunked_loss=true",
                                                    "hardware.activation_checkpointing=false"]), CARD_141GB, peak=peak)
    assert (s.loss_chunk_tokens, s.activation_checkpointing, s.compile_mode) == (2048, False, "all but the loss")
    assert s.savers_reason.startswith("as set")
    # one fixed, the other auto: only the auto one is chosen
    s = resolve_settings(resolve_preset("gpu-8gb", ["hardware.chunked_loss=false"]), CARD_8GB, peak=peak)
    assert (s.loss_chunk_tokens, s.activation_checkpointing) == (0, True)
    s = resolve_settings(resolve_preset("gpu-8gb", []), CARD_141GB, peak=peak)
    assert s.savers_reason.startswith("auto: the plain loss without checkpointing fits: estimate ")
    assert "free VRAM, 10% kept spare" in s.savers_reason
    s = resolve_settings(resolve_preset("gpu-8gb", []), CARD_8GB, peak=peak)
    assert "the fused loss and checkpointing fit" in s.savers_reason and "faster choices do not fit" in s.savers_reason
    # nothing fits: the most memory-saving pair, said so
    s = resolve_settings(resolve_preset("gpu-24gb", ["train.batch_size=64", "train.grad_accum=1"]), card(8), peak=peak)
    assert (bool(s.loss_chunk_tokens), s.activation_checkpointing) == (True, True)
    assert s.savers_reason.startswith("auto: nothing fits")
    # a CPU: the fused loss first (faster there), checkpointing only when RAM is short
    s = resolve_settings(resolve_preset("cpu-small", []), LAPTOP, peak=peak)
    assert (s.loss_chunk_tokens, s.activation_checkpointing) == (512, False)
    # memory unknown (an estimate for a CUDA GPU of no name): the preset's expected_memory_gb stands in
    s = resolve_settings(resolve_preset("gpu-8gb", []), Machine.assumed("cuda"), peak=peak)
    assert (s.loss_chunk_tokens, s.activation_checkpointing) == (2048, True)
    assert "hardware.expected_memory_gb" in s.savers_reason


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
