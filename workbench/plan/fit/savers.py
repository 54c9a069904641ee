"""The memory savers ``auto`` decides: the fused loss (``hardware.chunked_loss``) and activation checkpointing
(``hardware.activation_checkpointing``), and what a compile covers with them. The rule: the fastest pair whose
memory estimate (``plan.fit.memory``, the one ``estimate`` and ``fit`` print) fits the device's free memory with
``SAVERS_HEADROOM`` spare; on a CPU the fused loss first, since it is the faster there. ``resolve_settings``
(plan.settings) asks this once, for every consumer of a run's settings. Torch-free.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from workbench.config import Preset
from workbench.fmt import human_bytes
from workbench.machine.detect import Machine

if TYPE_CHECKING:
    from workbench.plan.settings import RunSettings


def loss_chunk_tokens(batch_size: int, seq_len: int, vocab_size: int, device: str = "cpu") -> int:
    """Tokens per chunk of the fused loss (FusedLinearCrossEntropy) when it is on. CPU: 512 tokens a chunk
    (at most 64 MiB of fp32 logits); GPU / MPS: ~256 MiB of fp32 logits a chunk."""
    n_tok = batch_size * seq_len
    if not (device.startswith("cuda") or device == "mps"):
        return min(n_tok, 512, max(64, (2**26) // (4 * vocab_size)))
    return max(256, min(n_tok, (2**28) // (4 * vocab_size)))


def auto_loss_chunk(batch_size: int, seq_len: int, vocab_size: int, setting: str, device: str = "cpu") -> int:
    """Tokens per chunk of the fused loss, or 0 for the plain loss, where memory is not known (the memory
    rule, :func:`choose_memory_savers`, decides where it is).

    CPU: always on (auto): it is faster there. Measured in one process against the plain loss: cpu-small
    +11 % (256 and 512 rows alike), medium +6 % at 512 rows, +5 % at 128 or 256. GPU / MPS with memory
    unknown: only when the step's fp32 logits would exceed 1 GiB.
    """
    if setting == "false":
        return 0
    chunk = loss_chunk_tokens(batch_size, seq_len, vocab_size, device)
    if setting == "auto" and (device.startswith("cuda") or device == "mps") and \
            batch_size * seq_len * vocab_size * 4 <= 2**30:
        return 0
    return chunk


# The memory savers auto chooses between on a GPU or MPS, fastest first (H100, bf16, compiled; README, GPU
# numbers): neither (the whole model one graph); the fused loss alone (x0.81 at ~124 M: the loss outside
# the graph, chunked); checkpointing alone (x~0.77: one more forward in backward, each block compiled
# alone); both (gpu-8gb x0.62). On a CPU the fused loss is the faster one, so it comes first whatever.
SAVER_ORDER = ((False, False), (True, False), (False, True), (True, True))   # (fused loss, checkpointing)
SAVERS_HEADROOM = 0.10   # the share of free memory kept spare, as `workbench fit` keeps by default


def saver_choices(chunked_loss: str, checkpointing: str | bool, device_type: str) -> list[tuple[bool, bool]]:
    """The (fused loss, checkpointing) pairs the settings allow, in the order auto tries them."""
    def allowed(value: bool, setting: str | bool) -> bool:
        setting = str(setting).lower()  # a HardwareConfig made in code may hold a bool
        return setting == "auto" or (setting == "true") == value
    order: tuple[tuple[bool, bool], ...] = SAVER_ORDER
    if device_type == "cpu" and chunked_loss == "auto":
        order = tuple((True, ck) for _, ck in SAVER_ORDER[::2])   # the fused loss is faster on a CPU
    return [(f, c) for f, c in order if allowed(f, chunked_loss) and allowed(c, checkpointing)]


def with_savers(s: RunSettings, fused_loss: bool, checkpointing: bool, chunk: int, reason: str) -> RunSettings:
    """``s`` with the fused loss (``chunk`` tokens a chunk) or not and activation checkpointing or not, and
    what the compile covers then."""
    loss_chunk = chunk if fused_loss else 0
    return dataclasses.replace(s, loss_chunk_tokens=loss_chunk, activation_checkpointing=checkpointing,
                               compile_mode=compile_mode(checkpointing, loss_chunk) if s.compile else "off",
                               savers_reason=reason)


def choose_memory_savers(p: Preset, s: RunSettings, machine: Machine) -> RunSettings:
    """The fused loss and activation checkpointing under ``auto``: the fastest pair whose memory estimate
    (``plan.fit.memory``, the same one `estimate` and `fit` print) fits the device's free memory with
    ``SAVERS_HEADROOM`` spare; where none fits, the pair that saves the most (`estimate` then says what else
    to change). The device's memory unknown (an estimate for a GPU of no name): the preset's
    ``hardware.expected_memory_gb``, else the fused loss when the logits pass 1 GiB and no checkpointing."""
    h, m = p.hardware, p.model
    kind = s.device_type
    chunk = loss_chunk_tokens(s.micro_batch, m.seq_len, m.vocab_size, kind)
    choices = saver_choices(h.chunked_loss, h.activation_checkpointing, kind)
    if len(choices) == 1:
        f, c = choices[0]
        return with_savers(s, f, c, chunk, "as set (hardware.chunked_loss, hardware.activation_checkpointing)")
    avail, what = machine.memory(s.device)
    if not avail and h.expected_memory_gb:
        avail, what = int(h.expected_memory_gb * 2**30), "(hardware.expected_memory_gb; the device's is unknown)"
    if not avail:
        f = bool(auto_loss_chunk(s.micro_batch, m.seq_len, m.vocab_size, h.chunked_loss, kind))
        c = str(h.activation_checkpointing).lower() == "true"
        return with_savers(s, f, c, chunk, "auto: the device's memory unknown; the fused loss where the logits "
                                           "pass 1 GiB")
    from workbench.plan.fit.memory import estimate_memory  # lazily: estimate imports settings, which imports this
    limit = (1 - SAVERS_HEADROOM) * avail
    for f, c in choices:
        trial = with_savers(s, f, c, chunk, "")
        total = estimate_memory(p, settings=trial).total
        if total <= limit:
            what_fits = {(False, False): "the plain loss without checkpointing fits",
                         (True, False): "the fused loss fits", (False, True): "checkpointing fits",
                         (True, True): "the fused loss and checkpointing fit"}[(f, c)]
            return dataclasses.replace(trial, savers_reason=(
                f"auto: {what_fits}: estimate {human_bytes(total)} of {human_bytes(avail)} {what}, "
                f"{SAVERS_HEADROOM:.0%} kept spare" + ("" if (f, c) == choices[0] else
                                                       "; faster choices do not fit")))
    f, c = choices[-1]
    return with_savers(s, f, c, chunk, f"auto: nothing fits {human_bytes(avail)} {what} by the estimate; the most "
                                       "memory-saving choice")


def compile_mode(activation_checkpointing: bool, loss_chunk_tokens: int) -> str:
    """What is compiled. Measured on an H100 (gpu-8gb, bf16): compiling the whole model is fastest
    (358k tok/s) but its graph ignores activation checkpointing and the chunked loss (9.6 GB peak
    vs 3.5 GB eager). Compiling each block keeps checkpointing outside the compiled graphs (3.3 GB,
    247k tok/s). With the fused loss (hand-written, chunked) everything before it is one graph."""
    if activation_checkpointing:
        return "per block"
    if loss_chunk_tokens:
        return "all but the loss"
    return "whole model"
