"""Spikes in a series of logged values (gradient norm, training loss), found as the records arrive.

A value is a spike when it stands far above the median of the values just before it. The median
and its median absolute deviation (MAD) are robust: one earlier spike does not raise the bar for
the next. Each value is compared once, when it arrives, so a live run costs O(window) per record.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

# Values compared with: the previous SPIKE_WINDOW finite ones, and none before SPIKE_MIN_POINTS of them
# (the first steps of a run move fast; a median of three is no trend).
SPIKE_WINDOW = 20
SPIKE_MIN_POINTS = 10
# A MAD times this is ~6 standard deviations of normal noise: a tiny run's batch-to-batch scatter
# (a 4 x 32-token batch moves the loss by ~0.2 nats) stays far below it.
MAD_SIGMAS = 6.0 * 1.4826

# Gradient norms: a spike is at least GRAD_SPIKE_FACTOR x the recent median. Norms of a healthy run
# wander within ~3x of their median (tiny CPU runs: 0.7-3.1 around ~0.9); an order of magnitude is a
# step the optimizer should not have taken at full size.
GRAD_SPIKE_FACTOR = 10.0
# Losses: a spike is at least LOSS_SPIKE_FRACTION above the recent median (0.5 nats at a loss of 2.5,
# 1 nat at 5): far beyond batch noise, what a too-large update or a bad batch does to the loss.
LOSS_SPIKE_FRACTION = 0.2


@dataclass(frozen=True)
class Spike:
    step: int
    value: float
    median: float         # of the values just before it
    lr: float | None = None  # the learning rate the trainer logged with it

    @property
    def ratio(self) -> float:
        return self.value / self.median if self.median else float("inf")

    def to_dict(self) -> dict:
        return {"step": self.step, "value": round(self.value, 4), "median": round(self.median, 4)}


class SpikeFinder:
    """Feed (step, value) in step order; spikes are collected in ``spikes``."""

    def __init__(self, kind: str, after_step: int = 0):
        """``kind``: "grad_norm" (a factor of the median) or "loss" (a share above it); values logged at or
        before ``after_step`` (the warmup) only fill the window."""
        self.kind, self.after_step = kind, after_step
        self.window: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self.spikes: list[Spike] = []

    def _bar(self, median: float, mad: float) -> float:
        if self.kind == "grad_norm":
            return max(GRAD_SPIKE_FACTOR * median, median + MAD_SIGMAS * mad)
        return max(median * (1 + LOSS_SPIKE_FRACTION), median + MAD_SIGMAS * mad)

    def add(self, step: int, value: float | None, lr: float | None = None) -> None:
        if value is None:
            return  # not finite: the non-finite guard reports it (an event of its own)
        if self.kind == "grad_norm" and value == 0:
            return  # no gradient at all (a GRPO step whose groups all scored alike): not a point of the norm's scale
        if len(self.window) >= SPIKE_MIN_POINTS and step > self.after_step:
            median = statistics.median(self.window)
            mad = statistics.median(abs(v - median) for v in self.window)
            if value > self._bar(median, mad):
                self.spikes.append(Spike(step, value, median, lr))
                return  # kept out of the window: a spike must not raise the bar for the next one
        self.window.append(value)

    def rewind(self, step: int) -> None:
        """The run went back to ``step`` (a resume or rollback): forget what came after it."""
        self.spikes = [s for s in self.spikes if s.step <= step]
        self.window.clear()
