"""train.eval_iters = 0 (auto): the batches an eval scores follow the val split's size and the loss's noise;
an explicit count is kept; the run-time estimate counts the same batches the trainer scores."""

from __future__ import annotations

import dataclasses
import math

import pytest

from workbench.config import resolve_preset
from workbench.plan.cost import estimate_time
from workbench.plan.schedule.evals import EVAL_SE_NATS, eval_batches, window_sd

TINY = ["model.seq_len=32", "train.batch_size=4"]


def _preset(eval_iters: int = 0, name: str = "cpu-small", extra=()):
    return resolve_preset(name, [*(TINY if name == "cpu-small" else []), f"train.eval_iters={eval_iters}", *extra])


def test_auto_follows_the_val_split_and_never_exceeds_its_windows():
    p = _preset()
    seq, b = p.model.seq_len, p.train.batch_size
    unlimited = eval_batches(p)[0]
    n0 = (window_sd(seq) / EVAL_SE_NATS) ** 2            # windows for the level's standard error
    assert unlimited == math.ceil(n0 / b)
    counts = [eval_batches(p, windows * seq)[0] for windows in (1, 3, 10, 50, 200, 1000, 10**6)]
    assert counts == sorted(counts) and counts[0] == 1     # a larger split: as many batches or more
    for windows, n in zip((1, 3, 10, 50, 200, 1000, 10**6), counts):
        assert n <= math.ceil(windows / b)                 # never more than the split's distinct windows
    assert counts[2] < counts[-1] == unlimited             # a tiny split gets fewer; a huge one what auto wants
    # the sample size of a finite population of N windows: n0 N / (N + n0 - 1), nearly all of a small split
    for windows, n in ((50, counts[3]), (1000, counts[5])):
        assert n == math.ceil(windows * n0 / (windows + n0 - 1) / b)
    assert counts[3] * b >= 0.85 * 50 and counts[5] < unlimited


def test_auto_says_why():
    p = _preset()
    assert "of the val split's 1,000 distinct windows" in eval_batches(p, 1000 * 32)[1]
    small = eval_batches(p, 10 * 32)[1]
    assert "the val split's 10 distinct windows, fewer than" in small and "data.val_split" in small


@pytest.mark.parametrize("n", [1, 7, 200])
def test_an_explicit_count_is_kept_whatever_the_split(n):
    p = _preset(n)
    assert [eval_batches(p, v)[0] for v in (None, 32, 10**7)] == [n, n, n]
    assert eval_batches(p)[1] == f"train.eval_iters = {n}"


@pytest.mark.parametrize("name", ["cpu-small", "gpu-8gb", "datacenter-80gb"])
def test_the_shipped_presets_are_auto_and_the_estimate_counts_the_same_batches(name):
    p = resolve_preset(name)
    assert p.train.eval_iters == 0
    n = eval_batches(p)[0]
    fixed = dataclasses.replace(p, train=dataclasses.replace(p.train, eval_iters=n))
    assert estimate_time(p, 1e4).eval_s == estimate_time(fixed, 1e4).eval_s > 0
    assert estimate_time(p, 1e4).eval_s < estimate_time(dataclasses.replace(
        p, train=dataclasses.replace(p.train, eval_iters=n + 1)), 1e4).eval_s
