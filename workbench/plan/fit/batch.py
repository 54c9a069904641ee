"""The micro-batch search and the gradient-accumulation plan that ``workbench fit`` uses.

Pure logic: the trial that says whether a micro-batch fits is passed in (the memory estimate on
a CPU, a real probe on a GPU, see ``workbench.train.batch_probe``).
"""

from __future__ import annotations

from typing import Callable

from workbench.config import Preset, preset_from_dict


def search_batch(trial: Callable[[int], bool], cap: int, start: int = 1) -> tuple[int, list[tuple[int, bool]]]:
    """Largest b in [1, cap] with trial(b) True, assuming trial is monotone (fits below, fails above).

    Powers of two from ``start`` until a failure or ``cap``, then bisection between the last
    success and the first failure. Returns (best, [(b, ok), ...]); best is 0 if nothing fits.
    """
    tried: list[tuple[int, bool]] = []

    def t(b: int) -> bool:
        ok = trial(b)
        tried.append((b, ok))
        return ok

    lo, hi = 0, None  # lo fits, hi fails
    b = max(1, min(start, cap))
    while True:
        if t(b):
            lo = b
            if b >= cap:
                return lo, tried
            b = min(b * 2, cap)
        else:
            hi = b
            break
    if lo == 0 and hi > 1:  # the starting size failed: go down by halves first
        b = hi // 2
        while b >= 1:
            if t(b):
                lo = b
                break
            hi = b
            b //= 2
        if lo == 0:
            return 0, tried
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if t(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried


def plan_accumulation(sequences_per_step: int, max_batch: int) -> tuple[int, int, str]:
    """(batch_size, grad_accum, note) with batch_size <= max_batch and batch_size x grad_accum
    == sequences_per_step when a divisor close to max_batch allows it; otherwise as close as
    possible, and the note says by how much tokens per step change."""
    E = sequences_per_step
    if max_batch >= E:
        return E, 1, ""
    best_div = max(d for d in range(1, max_batch + 1) if E % d == 0)
    if best_div * 2 >= max_batch:  # an exact split costs at most half the micro-batch
        return best_div, E // best_div, ""
    b = max_batch
    a = max(1, round(E / b))
    change = (b * a - E) / E * 100
    note = (f"{E} sequences per step has no divisor near {max_batch} (the largest is {best_div}); "
            f"using {b} x {a} = {b * a} sequences per step ({change:+.1f} % tokens per step)")
    return b, a, note


def fitted_preset(src: Preset, batch: int, accum: int, name: str, device: str | None,
                  note: str) -> Preset:
    d = src.to_dict()
    d["name"] = name
    d["train"]["batch_size"] = batch
    d["train"]["grad_accum"] = accum
    if device:
        d["hardware"]["device"] = device
    d["description"] = (f"{src.name} fitted by `workbench fit`: batch {batch} x accum {accum}"
                        + (f" ({note})" if note else "") + (f". {src.description}" if src.description else ""))
    return preset_from_dict(d, f"fitted preset {name}")
