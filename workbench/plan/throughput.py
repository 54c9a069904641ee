"""Tokens/s of a preset on a GPU of the table: the GPU's dense peak x an MFU, where the MFU is
measured if we have a measurement of that setup, else taken from the closest measurement.

MFU is ``tokens/s x flops_per_token / peak`` (the convention of :mod:`workbench.plan.fit.flops`, the
peak from :mod:`workbench.machine.gpus` at the run's precision). The measurements are few, all on
one H100 (the GPU table in docs/performance/gpu.md); what they say about other setups is an assumption, stated
with every number it produces:

* The same model, batch and compile mode as a measurement: its MFU ("measured").
* Otherwise the measurement compiled the same way (``RunSettings.compile_mode``: whole model, all
  but the loss, per block under activation checkpointing, off), scaled by model size as
  ``(N / N_measured) ** 0.35``: on the H100, eager steps reached 10 % (medium, 32 M parameters),
  16 % (~124 M) and 25 % (datacenter-80gb, 386 M) of the bf16 peak, which that power fits within
  a point. Small models are launch- and memory-bound; large ones keep the tensor cores busy.
* The same MFU on every GPU. The H100 is the hardest GPU to keep busy (the most FLOPs per byte of
  memory bandwidth), so on smaller cards this errs on the slow side.
* MPS: no measurement; the H100's eager figure, scaled the same way (MPS does not compile).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from workbench.config import ModelConfig, Preset
from workbench.fmt import millions
from workbench.machine.gpus import GpuSpec, find_gpu
from workbench.plan.fit.flops import count_params, flops_per_token
from workbench.plan.settings import RunSettings

SIZE_EXPONENT = 0.35
MFU_CAP = 0.6  # no scaling beyond what well-tuned large-model training reaches

# The ~124 M config of bench/gpu_check.sh; gpu-8gb's model as measured. Both were measured without QK-norm
# (before it became the presets' default), so a QK-norm model is scaled from them, not matched.
GPT_124M = ModelConfig(vocab_size=32768, dim=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_hidden=2560,
                       seq_len=1024, dropout=0.0, qk_norm=False)
GPU_8GB = ModelConfig(vocab_size=32768, dim=768, n_layers=12, n_heads=12, n_kv_heads=6, seq_len=1024, dropout=0.1,
                      qk_norm=False)
# The same two with QK-norm, the presets' recipe since 2026-11-23, measured on 2026-11-24 (listed first: the scaled
# estimates start from the first measurement of a compile mode).
GPT_124M_QK = replace(GPT_124M, qk_norm=True)
GPU_8GB_QK = replace(GPU_8GB, qk_norm=True)
# The GPU issue's size (nanoGPT's GPT-2 small matrices: ffn 2048), gpu-24gb's recipe; measured on an H200 (2026-11-27)
GPT_110M_QK = replace(GPT_124M_QK, ffn_hidden=2048)


@dataclass(frozen=True)
class Measurement:
    """One measured training throughput on a real GPU."""
    gpu: str                   # its name in the GPU table
    what: str                  # the setup, in words
    model: ModelConfig
    batch_size: int
    compile_mode: str          # RunSettings.compile_mode of that run
    precision: str
    tokens_per_s: float
    source: str

    @property
    def params(self) -> int:
        return count_params(self.model)

    def mfu(self, peak_flops: float) -> float:
        return self.tokens_per_s * flops_per_token(self.model) / peak_flops


H100_README = "docs/performance/gpu.md (H100 80GB, torch 2.11; bench/gpu_check.sh mfu)"
H200_PEERS = "docs/performance/gpu.md (H200, torch 2.11 + CUDA 13.0, 2026-11-27; bench/gpu_check.sh peers)"
H100_QK = "docs/performance/gpu.md (H100 80GB, torch 2.11 + CUDA 13.0, 2026-11-24; bench/gpu_check.sh numbers)"
MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement("H100 SXM 80GB", "~124 M config with QK-norm, whole-model compile", GPT_124M_QK, 32, "whole model",
                "bf16", 421_544, H100_QK),
    Measurement("H100 SXM 80GB", "~124 M config with QK-norm, eager", GPT_124M_QK, 32, "off", "bf16", 160_768, H100_QK),
    Measurement("H100 SXM 80GB", "gpu-8gb (QK-norm), activation checkpointing, fused loss, compile per block",
                GPU_8GB_QK, 24, "per block", "bf16", 246_726, H100_QK),
    Measurement("H100 SXM 80GB", "gpu-8gb (QK-norm) without activation checkpointing, plain loss, whole-model compile",
                GPU_8GB_QK, 24, "whole model", "bf16", 412_386, H100_QK),
    Measurement("H100 SXM 80GB", "~124 M config, whole-model compile", GPT_124M, 32, "whole model", "bf16",
                467_315, H100_README),
    Measurement("H100 SXM 80GB", "~124 M config, eager", GPT_124M, 32, "off", "bf16", 183_517,
                H100_README + ", an earlier session"),
    Measurement("H100 SXM 80GB", "gpu-8gb, activation checkpointing, fused loss, compile per block", GPU_8GB, 24,
                "per block", "bf16", 272_530, H100_README),
    Measurement("H100 SXM 80GB", "~124 M config, fused loss, compile all but the loss", GPT_124M, 32,
                "all but the loss", "bf16", 379_067, H100_README),
    Measurement("H100 SXM 80GB", "gpu-8gb without activation checkpointing, plain loss, whole-model compile",
                GPU_8GB, 24, "whole model", "bf16", 457_189, H100_README),
    Measurement("H200 141GB", "~110 M (nanoGPT's size) with QK-norm, plain loss, whole-model compile", GPT_110M_QK, 32,
                "whole model", "bf16", 521_274, H200_PEERS),
    Measurement("H200 141GB", "~110 M (nanoGPT's size) with QK-norm, fused loss, compile all but the loss",
                GPT_110M_QK, 32, "all but the loss", "bf16", 407_807, H200_PEERS),
    Measurement("H200 141GB", "gpu-8gb, no checkpointing, plain loss, whole-model compile (auto there)", GPU_8GB_QK,
                24, "whole model", "bf16", 467_353, H200_PEERS),
    Measurement("H200 141GB", "gpu-8gb, activation checkpointing, fused loss, compile per block", GPU_8GB_QK, 24,
                "per block", "bf16", 293_166, H200_PEERS),
)


@dataclass(frozen=True)
class Mfu:
    """An MFU and where it comes from."""
    value: float
    basis: str                 # given | measured | measured elsewhere | scaled | none
    why: str                   # one line for the user

    def to_dict(self) -> dict:
        return {"value": self.value, "basis": self.basis, "why": self.why}


def _reference(m: Measurement) -> float:
    """The measurement's MFU against its GPU's peak in the table."""
    peak = find_gpu(m.gpu).peak_flops(m.precision)
    if peak is None:  # a measurement at a precision its GPU lacks: the table or MEASUREMENTS is wrong
        raise ValueError(f"the GPU table has no {m.precision} peak for the {m.gpu} that {m.what} was measured on")
    return m.mfu(peak)


def mfu_for(preset: Preset, settings: RunSettings, gpu: GpuSpec, given: float | None = None) -> Mfu:
    """The MFU to expect for ``preset`` run with ``settings`` on ``gpu`` (see the module docstring)."""
    if given is not None:
        return Mfu(given, "given", "given with --mfu")
    mode = "off" if settings.device_type == "mps" else settings.compile_mode
    same_mode = [m for m in MEASUREMENTS if m.compile_mode == mode]
    if not same_mode:
        return Mfu(0.0, "none", f"no measurement of compile mode {mode!r}")
    model = preset.model
    alike = [m for m in same_mode if m.model == model and m.batch_size == settings.micro_batch
             and settings.device_type == "cuda"]
    for m in sorted(alike, key=lambda m: m.gpu != gpu.name):  # this GPU's own measurement first
        if m.gpu == gpu.name:
            return Mfu(_reference(m), "measured", f"measured on this GPU: {m.what} ({m.source})")
        return Mfu(_reference(m), "measured elsewhere", f"measured on the {m.gpu}: {m.what} ({m.source})")
    m = same_mode[0]
    n = count_params(model)
    value = min(MFU_CAP, _reference(m) * (n / m.params) ** SIZE_EXPONENT)
    prefix = "MPS unmeasured: " if settings.device_type == "mps" else ""
    return Mfu(value, "scaled", f"{prefix}{_reference(m):.1%} measured on the {m.gpu} ({m.what}) x "
                                f"({millions(n, '.0f')} / {millions(m.params, '.0f')} params)^{SIZE_EXPONENT}")


def tokens_per_s(preset: Preset, settings: RunSettings, mfu: Mfu) -> float | None:
    """peak x MFU / FLOPs per token, or None without a peak (a precision the GPU lacks) or an MFU."""
    if not settings.peak_flops or mfu.value <= 0:
        return None
    return settings.peak_flops * mfu.value / flops_per_token(preset.model)


def describe(preset: Preset, settings: RunSettings, gpu: GpuSpec, mfu: Mfu) -> str:
    """How a tokens/s from the GPU table's peak and an MFU was reached, in one line (for a :func:`tokens_per_s`
    that was not None: the settings have a peak)."""
    assert settings.peak_flops is not None
    return (f"estimate: {settings.peak_flops / 1e12:.4g} TFLOP/s ({gpu.name} {settings.precision} peak, GPU table) "
            f"x {mfu.value:.1%} MFU ({mfu.why}) / {flops_per_token(preset.model) / 1e6:.4g} MFLOP per token")
