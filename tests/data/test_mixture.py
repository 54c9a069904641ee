"""The mixture's plan (workbench.data.mixture.mixture_plan): counts by apportionment, every prefix within one sequence
of the weights, a pure function of the config and the seed, each source's epochs reshuffled, and the sampler's
counter."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from workbench.data.mixture.mixture_plan import (
    MixtureError,
    MixtureSampler,
    SourceSpec,
    apportion,
    blend_order,
    check_resume,
    plan_mixture,
    prefix_deviation,
)


def _counts(order: np.ndarray, k: int, s: int) -> int:
    return int(np.count_nonzero(order[:k] == s))


def test_apportionment_is_largest_remainder():
    assert apportion([1, 1, 1], 10) == [4, 3, 3]          # a tie of remainders: the earlier source
    assert apportion([0.5, 0.3, 0.2], 7) == [4, 2, 1]      # 3.5 2.1 1.4: the .5 gets the one left
    assert apportion([2, 0, 1], 9) == [6, 0, 3]
    assert apportion([1, 0], 5) == [5, 0]                  # a weight of 0 gets nothing
    for _ in range(200):
        w = [random.random() * random.choice([1, 10, 0]) for _ in range(random.randint(1, 6))] + [0.1]
        n = random.randint(0, 1000)
        c = apportion(w, n)
        assert sum(c) == n
        assert all(abs(ci - wi / sum(w) * n) < 1 for ci, wi in zip(c, w))
    with pytest.raises(MixtureError):
        apportion([0, 0], 4)
    with pytest.raises(MixtureError):
        apportion([1, -1], 4)


@pytest.mark.parametrize("weights,n", [([0.5, 0.5], 64), ([0.7, 0.2, 0.1], 1000), ([3, 1], 4096),
                                       ([1 / 3, 1 / 3, 1 / 3], 999), ([0.01, 0.99], 517), ([5, 0, 1, 2], 300),
                                       ([0.6180339, 0.3819661], 2000)])
def test_every_prefix_is_within_one_sequence_and_the_horizon_gives_the_apportionment(weights, n):
    order, counts, exact = blend_order(weights, n, seed=7)
    assert exact and counts == apportion(weights, n)
    assert np.bincount(order, minlength=len(weights)).tolist() == counts
    total = sum(weights)
    for s, w in enumerate(weights):   # every prefix, by hand (prefix_deviation is checked against this)
        c = np.cumsum(order == s)
        k = np.arange(1, n + 1)
        assert np.all(np.abs(c - w / total * k) <= 1 + 1e-9), (s, np.max(np.abs(c - w / total * k)))
    assert prefix_deviation(order, weights) <= 1 + 1e-9
    if 0 in weights:
        assert not np.any(order == weights.index(0))      # a weight of 0 excludes the source


def test_random_mixtures_keep_the_bound():
    rng = random.Random(3)
    for _ in range(150):
        w = [rng.choice([rng.random(), rng.randint(1, 5), 0.05]) for _ in range(rng.randint(1, 5))]
        n = rng.randint(1, 400)
        order, counts, exact = blend_order(w, n, seed=rng.randint(0, 99))
        assert prefix_deviation(order, w) <= 1 + 1e-9
        assert sum(counts) == n and all(abs(c - wi / sum(w) * n) < 1 for c, wi in zip(counts, w))
        assert exact or counts != apportion(w, n)


def test_same_config_and_seed_is_byte_identical_another_seed_the_same_counts_in_another_order():
    src = [SourceSpec("web", 0.6, 50, content="a"), SourceSpec("code", 0.3, 20, content="b"),
           SourceSpec("mine", 0.1, 5, content="c")]
    a, b = plan_mixture(src, 32, 1000, seed=1), plan_mixture(src, 32, 1000, seed=1)
    assert a.order.tobytes() == b.order.tobytes() and a.digest == b.digest
    assert [a.at(i) for i in range(3000)] == [b.at(i) for i in range(3000)]
    c = plan_mixture(src, 32, 1000, seed=2)
    assert c.counts == a.counts == apportion([0.6, 0.3, 0.1], 1000)
    assert c.order.tobytes() != a.order.tobytes()
    assert c.digest == a.digest  # the digest is the config's; the seed is the other half of the order's key
    changed = plan_mixture([src[0], SourceSpec("code", 0.35, 20, content="b"), src[2]], 32, 1000, seed=1)
    assert changed.digest != a.digest


@pytest.mark.parametrize("weights,horizons", [([0.7, 0.3], [40, 100]), ([1, 1, 1], [10, 11, 500]),
                                              ([0.5, 0.3, 0.2], [333, 1000, 1001])])
def test_an_extended_horizon_keeps_what_was_planned_and_reaches_the_new_apportionment(weights, horizons):
    order, counts, exact = blend_order(weights, horizons, seed=4)
    for i, h in enumerate(horizons):
        first, c, e = blend_order(weights, horizons[:i + 1], seed=4)
        assert order[:h].tobytes() == first.tobytes()              # never changes what was planned before
        assert e and c == apportion(weights, h)                    # each horizon's apportionment
    assert prefix_deviation(order, weights) <= 1 + 1e-9 and exact


@pytest.mark.parametrize("weights", [[0.7, 0.3], [0.5, 0.3, 0.2], [1, 1, 1, 5]])
def test_a_budget_moving_its_end_re_plans_from_the_counter_keeping_what_was_drawn(weights):
    """A time budget's end estimate moves back and forth: each re-plan keeps the order drawn so far, and wherever the
    run ends on a horizon last planned, its counts are that horizon's apportionment; every prefix within one."""
    src = [SourceSpec(f"s{i}", w, 40) for i, w in enumerate(weights)]
    plan = plan_mixture(src, 16, 400, seed=3)
    moves = [(37, 380), (120, 900), (500, 610), (600, 604), (601, 640), (640, 700)]   # (drawn, the end moved to)
    for done, h in moves:
        again = plan.replanned(done, h)
        assert again.order[:done].tobytes() == plan.order[:done].tobytes()      # what was trained is kept
        assert again.counts == apportion(weights, h) and again.exact            # the new end's apportionment
        assert prefix_deviation(again.order, weights) <= 1 + 1e-9
        plan = again
    # the same plan from its list of horizons and starts (what a resume rebuilds from the sampler's state)
    fresh = plan_mixture(src, 16, plan.horizons, seed=3, starts=plan.starts)
    assert fresh.order.tobytes() == plan.order.tobytes() and fresh.exact
    assert plan.horizons == [400, 380, 900, 610, 604, 640, 700] and plan.starts == [0, 37, 120, 500, 600, 601, 640]
    # a sampler follows: far from the end a small move changes nothing, near it (or a fifth off) it re-plans
    s = MixtureSampler(plan_mixture(src, 16, 400, seed=3), [np.arange(700, dtype=np.uint16)] * len(weights), 4)
    for _ in range(10):
        s.next_batch()
    assert not s.follow(420, near=64) and s.plan.horizons == [400]
    assert s.follow(520, near=64) and s.plan.horizons == [400, 520] and s.plan.starts == [0, 40]
    for _ in range(100):
        s.next_batch()
    assert s.follow(450, near=64) and s.plan.horizon == 450                 # within 64 of the end: follows
    st = s.state()
    assert st["starts"] == [0, 40, 440] and st["drawn"] == s.plan.drawn(440)
    back = MixtureSampler(plan_mixture(src, 16, 400, seed=3), s.parts, 4)   # a resume: the same plan rebuilt
    back.set_state(st)
    assert back.plan.order.tobytes() == s.plan.order.tobytes()
    assert [back.next_batch().inputs.tobytes() for _ in range(5)] == [s.next_batch().inputs.tobytes() for _ in range(5)]


def test_each_source_epoch_is_a_fresh_permutation_of_its_windows():
    src = [SourceSpec("a", 1, 7), SourceSpec("b", 1, 5)]
    plan = plan_mixture(src, 16, 200, seed=0)
    for s, w in ((0, 7), (1, 5)):
        epochs = [[plan.window(s, e * w + i) for i in range(w)] for e in range(6)]
        assert all(sorted(e) == list(range(w)) for e in epochs)    # each epoch every window once
        assert len({tuple(e) for e in epochs}) > 1                 # reshuffled
    other = plan_mixture([SourceSpec("a", 1, 7), SourceSpec("c", 1, 5)], 16, 200, seed=0)
    assert [plan.window(0, i) for i in range(7)] == [other.window(0, i) for i in range(7)]  # its own seed
    assert plan.repeats(0) == pytest.approx(100 / 7)


def test_max_repeat_is_reported_with_the_numbers():
    plan = plan_mixture([SourceSpec("big", 3, 1000), SourceSpec("small", 1, 10, max_repeat=4)], 64, 400, seed=0)
    (msg,) = plan.over_limit()
    assert "'small'" in msg and "10.00 times" in msg and "100 sequences" in msg and "max_repeat is 4" in msg
    assert not plan_mixture([SourceSpec("small", 1, 10, max_repeat=10)], 64, 100, seed=0).over_limit()


@pytest.mark.parametrize("sources, horizon", [
    ([SourceSpec("big", 3, 1000), SourceSpec("small", 1, 10, max_repeat=4)], 400),       # past it in the plan
    ([SourceSpec("big", 3, 1000), SourceSpec("small", 1, 10, max_repeat=4)], 30),        # past the plan's horizon
    ([SourceSpec("a", 1, 7, max_repeat=2.5), SourceSpec("b", 2, 5, max_repeat=3), SourceSpec("c", 1, 90)], 64),
])
def test_how_far_the_stream_keeps_every_source_within_its_max_repeat(sources, horizon):
    """within_repeats (what ends a budgeted run first): the sequences before the first one that takes a source past
    its max_repeat, counted over the stream the sampler draws (past the plan's horizon it repeats), and which."""
    plan = plan_mixture(sources, 16, horizon, seed=3)
    at, s = plan.within_repeats()
    drawn = [0] * len(sources)
    for c in range(at):
        drawn[plan.at(c)[0]] += 1
    assert all(not src.max_repeat or n <= src.max_repeat * src.windows for src, n in zip(sources, drawn)), drawn
    nxt = plan.at(at)[0]
    assert nxt == s and drawn[s] + 1 > sources[s].max_repeat * sources[s].windows
    assert plan_mixture([SourceSpec("a", 1, 5), SourceSpec("b", 1, 5)], 16, 40, seed=0).within_repeats() is None


def test_token_shares_hold_with_documents_of_any_length():
    """Rows are windows of the joined stream, every row seq_len tokens: the token share of every prefix is within
    one sequence's tokens of the weight, however long the documents (here one of 3 tokens and one of 500)."""
    T = 8
    a = np.arange(1001, dtype=np.uint16) % 50 + 100    # one long document
    b = np.tile(np.array([1, 2, 0], dtype=np.uint16), 100)  # many 3-token documents (0: end of document)
    src = [SourceSpec("long", 0.25, (len(a) - 1) // T), SourceSpec("short", 0.75, (len(b) - 1) // T)]
    plan = plan_mixture(src, T, 120, seed=5)
    sampler = MixtureSampler(plan, [a, b], batch_size=4)
    tokens = [0, 0]
    for step in range(30):
        batch = sampler.next_batch()
        for row in batch.inputs:
            tokens[0 if row.max() >= 100 else 1] += len(row)
        k = (step + 1) * 4
        for s, w in enumerate((0.25, 0.75)):
            assert abs(tokens[s] - w * k * T) <= T
    assert sampler.counter == 120


def test_the_sampler_state_is_a_counter_and_resumes_the_same_stream():
    a = np.arange(400, dtype=np.uint16)
    b = np.arange(400, 700, dtype=np.uint16)
    src = [SourceSpec("a", 2, (len(a) - 1) // 16), SourceSpec("b", 1, (len(b) - 1) // 16)]
    plan = plan_mixture(src, 16, 50, seed=9)
    whole = MixtureSampler(plan, [a, b], 3)
    want = [whole.next_batch().inputs for _ in range(40)]   # past the horizon too
    first = MixtureSampler(plan, [a, b], 3)
    got = [first.next_batch().inputs for _ in range(13)]
    st = first.state()
    assert st == {"mixture": plan.digest, "horizons": [50], "counter": 39, "base": 0,
                  "sources": [["a", 2], ["b", 1]], "drawn": [26, 13]}   # drawn: what the run realized so far
    again = MixtureSampler(plan_mixture(src, 16, 50, seed=9), [a, b], 3)
    again.set_state(st)
    got += [again.next_batch().inputs for _ in range(27)]
    assert all(np.array_equal(x, y) for x, y in zip(want, got)) and again.changed is None
    # cut at random steps (a kill -9 anywhere, resumed from the last state saved), twice in one stream: the same
    for cuts in ([5, 31], [1, 2], [17, 39], *(sorted(random.Random(s).sample(range(1, 40), 2)) for s in range(3))):
        stream, saved = [], None
        for lo, hi in zip([0, *cuts], [*cuts, 40]):
            part = MixtureSampler(plan_mixture(src, 16, 50, seed=9), [a, b], 3)
            if saved is not None:
                part.set_state(saved)
            stream += [part.next_batch().inputs for _ in range(hi - lo)]
            saved = part.state()
        assert len(stream) == 40 and all(np.array_equal(x, y) for x, y in zip(want, stream)), cuts
    longer = MixtureSampler(plan_mixture(src, 16, 80, seed=9), [a, b], 3)   # resume --more: a longer horizon
    longer.set_state(st)
    assert longer.plan.horizons == [50, 80]   # the plan the run began with, extended
    assert longer.plan.order[:50].tobytes() == plan.order.tobytes()
    # other weights (a resume allowed to change them): the new plan starts where the old one stopped
    remixed = MixtureSampler(plan_mixture([src[0], SourceSpec("b", 1.5, src[1].windows)], 16, 50, seed=9), [a, b], 3)
    remixed.set_state(st)
    assert remixed.changed == [["a", 2], ["b", 1]] and remixed.state()["base"] == 39
    # the same sources and weights over other text: refused
    other_text = [src[0], SourceSpec("b", 1, src[1].windows, content="x")]
    moved = MixtureSampler(plan_mixture(other_text, 16, 50, 9), [a, b], 3)
    with pytest.raises(MixtureError, match="text or model.seq_len changed"):
        moved.set_state(st)


def test_a_resume_of_another_mixture_is_refused_unless_asked():
    st = {"mixture": "d", "horizon": 5, "counter": 5, "base": 0, "sources": [["a", 2.0], ["b", 1.0]]}
    assert check_resume([["a", 2.0], ["b", 1.0]], st, "step_1", allow=False) is None
    with pytest.raises(MixtureError, match=r"trained on a 2, b 1, but the preset now says a 2, b 2: .*--remix"):
        check_resume([["a", 2.0], ["b", 2.0]], st, "step_1", allow=False)
    assert check_resume([["a", 2.0], ["b", 2.0]], st, "step_1", allow=True) == [["a", 2.0], ["b", 1.0]]
    with pytest.raises(MixtureError, match="one corpus"):
        check_resume(None, st, "step_1", allow=True)
    with pytest.raises(MixtureError, match="trained on one corpus"):
        check_resume([["a", 1.0], ["b", 1.0]], {"bit_generator": "PCG64"}, "step_1", allow=False)


def test_a_weight_of_zero_and_an_empty_source():
    plan = plan_mixture([SourceSpec("a", 1, 10), SourceSpec("off", 0, 0)], 16, 30, seed=0)
    assert plan.counts == [30, 0] and not np.any(plan.order == 1)
    with pytest.raises(MixtureError, match="holds no sequence"):
        plan_mixture([SourceSpec("a", 1, 10), SourceSpec("tiny", 1, 0)], 16, 30, seed=0)
    assert math.isinf(plan_mixture([SourceSpec("a", 1, 10)], 16, 30, seed=0).repeats(0)) is False
