"""Weighted data mixtures: several corpora ("sources") trained on in stated shares, exact at every step.

The unit is the **sequence**: one training row of ``model.seq_len`` tokens, cut from a source's token stream
(documents joined by the end-of-document token) as non-overlapping windows. Every row of a text batch is exactly
``seq_len`` trained tokens whatever the documents' lengths, so a share of sequences *is* a share of tokens: a
source's token share is within one sequence (``seq_len`` tokens) of its weight after any number of sequences.

The plan for a horizon of ``N`` sequences (the run's ``max_iters x batch_size x grad_accum``):

1. **counts** by apportionment: ``n_s = floor(w_s N)`` plus one for the sources of the largest remainders
   (ties: the earlier source) so that they sum to ``N`` (:func:`apportion`); a weight of 0 is no sequence (and
   the source is not read).
2. **order**: which source each of the ``N`` sequences comes from, such that after every prefix ``k`` each
   source's count is within one sequence of ``w_s k``. Each source's ``j``-th sequence has a window of positions
   where placing it keeps ``|count_s(k) - w_s k| <= 1`` (from ``(j-1)/w_s`` to ``j/w_s + 1``); the order is the
   earliest deadline first among the released ones (optimal for unit jobs with release times and deadlines), ties
   broken by a random key per sequence from the seed (:func:`blend_order`). The order is checked; in the rare
   case (many sources, several of tiny weight) where the apportioned counts admit no order within one sequence, the
   counts are the ones the earliest-deadline order reaches unconstrained (each still ``floor`` or ``ceil`` of
   ``w_s N``) and the plan says so (``exact_counts`` False).
3. **within a source**: its train windows in a shuffled order, a new permutation each epoch, from a seed of its own
   (the run's seed and the source's name).

The plan is a pure function of the mixture's digest (names, weights, the sources' prepared contents, seq_len), the
horizon and the seed, so a sampler's state is a counter (with the digest and horizon: a resume goes on with the plan
the run began with, and one of other sources or weights is refused unless asked, see :func:`check_resume`). A
run extended past its horizon (``resume --more``) keeps the order planned so far and plans the new steps from there
to the longer horizon's apportionment (every prefix still within one sequence); past the last horizon the plan
repeats block after block (within two sequences at a block's boundary).

No torch.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from workbench.data.train_data import Batch
from workbench.errors import WorkbenchError

__all__ = ["MixtureError", "MixturePlan", "MixtureSampler", "SourceSpec", "apportion", "blend_order",
           "plan_mixture", "prefix_deviation", "source_seed"]


class MixtureError(WorkbenchError):
    pass


# --corpus NAME=PATH:WEIGHT: a name first (as data.mixture's names), the weight after the last colon
_NAMED = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]{0,39})=(.+):([^:/\\]*)$")


def named_source(item: str) -> tuple[str, str, str] | None:
    """``NAME=PATH:WEIGHT`` split (the weight as given), or None for a plain path."""
    m = _NAMED.match(item)
    return (m.group(1), m.group(2), m.group(3)) if m else None


def corpus_arguments(items: Sequence[str]) -> dict[str, Any]:
    """``--corpus`` items as [data] values: plain paths as data.corpus (as before), or ``NAME=PATH:WEIGHT`` items
    as data.mixture's sources. Why this syntax: one argument per source reads as the preset's table does (the name
    a source's loss is shown under, its files, its share), and a weight after the last colon leaves paths with
    colons in their middle alone. The two kinds may not be mixed; a weight that is not a number is refused."""
    named = [named_source(i) for i in items]
    if not items:
        return {}
    if all(n is None for n in named):
        return {"corpus": items[0] if len(items) == 1 else list(items), "mixture": []}  # a preset's mixture too
    if any(n is None for n in named):
        plain = items[named.index(None)]
        raise MixtureError(f"--corpus {plain!r} has no name and weight while others do; give every source as "
                           "NAME=PATH:WEIGHT (e.g. --corpus web=web.jsonl:0.7 code=src/:0.3)")
    sources: list[dict[str, Any]] = []
    for item, (name, path, weight) in zip(items, named):  # type: ignore[misc]
        try:
            w = float(weight)
        except ValueError:
            raise MixtureError(f"--corpus {item!r}: the weight {weight!r} is not a number; give NAME=PATH:WEIGHT, "
                               "e.g. web=web.jsonl:0.7") from None
        if not math.isfinite(w) or w < 0:
            raise MixtureError(f"--corpus {item!r}: the weight {weight} must be a number >= 0 (0 leaves the source "
                               "out)")
        sources.append({"name": name, "corpus": path, "weight": w})
    if not any(s["weight"] > 0 for s in sources):
        raise MixtureError("--corpus: every source's weight is 0; give at least one a weight above 0")
    return {"mixture": sources}


@dataclass(frozen=True)
class SourceSpec:
    """One source of a mixture as the plan sees it: its name, weight (any non-negative number; the weights are
    normalised), the repeats allowed (0: no limit) and its train windows (sequences it holds)."""
    name: str
    weight: float
    windows: int
    max_repeat: float = 0.0
    content: str = ""          # what it is (its prepared text's digest): part of the mixture's digest


def apportion(weights: Sequence[float], n: int) -> list[int]:
    """Integer counts summing to ``n`` in the shares ``weights`` (normalised) by the largest-remainder method:
    each gets ``floor(w n)``, then one more for the largest remainders (ties: the earlier source). A weight of 0
    gets 0."""
    total = float(sum(weights))
    if n < 0 or total <= 0 or any(w < 0 for w in weights):
        raise MixtureError("the weights must be non-negative and not all zero")
    quotas = [w / total * n for w in weights]
    base = [int(math.floor(q)) for q in quotas]
    left = n - sum(base)
    by_remainder = sorted((i for i in range(len(weights)) if weights[i] > 0), key=lambda i: (-(quotas[i] - base[i]), i))
    for i in by_remainder[:left]:
        base[i] += 1
    return base


def _edf(shares: np.ndarray, caps: Sequence[int], n: int, seed: int, start: int = 0,
         taken: Sequence[int] | None = None) -> np.ndarray:
    """``n`` source indices for positions ``start + 1 .. start + n``, earliest deadline first: source ``s``'s
    ``j``-th sequence (1-based, counted from the stream's start: ``taken`` were placed before ``start``) is released
    at position ``ceil((j-1)/w_s)`` and due by ``floor(j/w_s + 1)``; at most ``caps[s]`` of each in all."""
    eps = 1e-9
    rng = np.random.Generator(np.random.PCG64([seed, 0x6d6978, start]))
    keys = [rng.random(c) if c else np.zeros(0) for c in caps]   # each sequence's tie-break, from the seed
    done = list(taken) if taken is not None else [0] * len(caps)

    def job(s: int, j: int) -> tuple[int, int, float, int]:    # (release, deadline, tie, source) of the j-th
        w = shares[s]
        return (max(1, math.ceil((j - 1) / w - eps)), math.floor(j / w + 1 + eps), float(keys[s][j - 1]), s)

    waiting = [job(s, done[s] + 1) for s in range(len(caps)) if done[s] < caps[s]]   # by release
    heapq.heapify(waiting)
    ready: list[tuple[int, float, int, int]] = []                    # (deadline, tie, source, release)
    out = np.empty(n, dtype=np.uint16 if len(caps) > 255 else np.uint8)
    for k in range(start + 1, start + n + 1):
        while waiting and waiting[0][0] <= k:
            r, d, t, s = heapq.heappop(waiting)
            heapq.heappush(ready, (d, t, s, r))
        if ready:
            _d, _t, s, _r = heapq.heappop(ready)
        else:  # none released: the earliest to be (only where no order within one exists)
            _r, _d, _t, s = heapq.heappop(waiting)
        out[k - start - 1] = s
        done[s] += 1
        if done[s] < caps[s]:
            heapq.heappush(waiting, job(s, done[s] + 1))
    return out


def prefix_deviation(order: np.ndarray, weights: Sequence[float]) -> float:
    """The largest ``|count_s(k) - w_s k|`` over every prefix ``k`` and source ``s`` (weights normalised)."""
    total = float(sum(weights))
    k = np.arange(1, len(order) + 1, dtype=np.float64)
    worst = 0.0
    for s, w in enumerate(weights):
        counts = np.cumsum(order == s, dtype=np.float64)
        worst = max(worst, float(np.max(np.abs(counts - w / total * k), initial=0.0)))
    return worst


def _segment(done: np.ndarray, weights: Sequence[float], shares: np.ndarray, start: int, h: int,
             seed: int) -> np.ndarray:
    """The order of positions ``start + 1 .. h`` after ``done`` (the ``start`` sequences drawn before them), planned
    to reach ``h``'s apportionment within one sequence at every prefix (else as close as the order allows)."""
    taken = [int(c) for c in np.bincount(done, minlength=len(weights))] if len(done) else [0] * len(weights)
    want = apportion(weights, h)
    part = _edf(shares, [max(a, b) for a, b in zip(want, taken)], h - start, seed, start, taken)
    if prefix_deviation(np.concatenate([done, part]), weights) > 1 + 1e-9:  # no order within one reaches want
        caps = [int(math.floor(w * h)) + 1 if w > 0 else 0 for w in shares]
        part = _edf(shares, [max(a, b) for a, b in zip(caps, taken)], h - start, seed, start, taken)
    return part


def blend_order(weights: Sequence[float], n: int | Sequence[int], seed: int,
                starts: Sequence[int] | None = None) -> tuple[np.ndarray, list[int], bool]:
    """Which source each of ``n`` sequences comes from: (order, counts, exact) where counts are the
    apportionment's (exact True) and every prefix is within one sequence of the weights; see the module's
    documentation for the rare case exact is False. ``n`` a list of horizons, each planned from ``starts``' position
    (default: the horizon before it, a run extended by resume --more): the order before that position is kept and
    the rest is planned to reach that horizon's apportionment (a time budget's end moved: re-planned from the
    sequence it had reached, back or forth; what was drawn before is never changed). exact: the counts at every
    horizon reached (not cut short by the next one's start) are its apportionment."""
    horizons = [n] if isinstance(n, int) else list(n)
    froms = [0] + horizons[:-1] if starts is None else list(starts)
    if len(froms) != len(horizons) or froms[0] != 0:
        raise MixtureError(f"a mixture's plan needs a start for each horizon, the first at 0: {froms}, {horizons}")
    total = float(sum(weights))
    shares = np.asarray([w / total for w in weights], dtype=np.float64)
    order = np.zeros(0, dtype=np.uint16 if len(weights) > 255 else np.uint8)
    for i, (start, h) in enumerate(zip(froms, horizons)):
        if not (start <= len(order) and start < h) or (i and start < froms[i - 1]):
            raise MixtureError(f"a mixture's horizons must grow from where each is planned: {froms}, {horizons}")
        order = np.concatenate([order[:start], _segment(order[:start], weights, shares, start, h, seed)])
    return (order, [int(c) for c in np.bincount(order, minlength=len(weights))],
            reached_apportionment(order, weights, horizons, froms))


def reached_apportionment(order: np.ndarray, weights: Sequence[float], horizons: Sequence[int],
                          starts: Sequence[int]) -> bool:
    """Whether the counts at every horizon the order reached (not cut short by the next one's start) are that
    horizon's apportionment."""
    for i, h in enumerate(horizons):
        if i + 1 == len(horizons) or starts[i + 1] >= h:
            if [int(c) for c in np.bincount(order[:h], minlength=len(weights))] != apportion(weights, h):
                return False
    return True


def source_seed(seed: int, name: str) -> int:
    """A source's own seed for its epochs' shuffles: from the run's seed and the source's name."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{name}".encode()).digest()[:8], "little")


@dataclass
class MixturePlan:
    """Where each of a horizon's sequences comes from (see the module's documentation)."""
    sources: list[SourceSpec]
    seq_len: int
    horizons: list[int]          # sequences planned: the run's first horizon, then each extension's (resume --more)
    seed: int
    digest: str
    order: np.ndarray            # [horizon] source index of each sequence
    nth: np.ndarray              # [horizon] how many of the same source came before it
    counts: list[int]            # sequences of each source in the horizon
    exact: bool                  # counts are the apportionment's (see blend_order)
    starts: list[int] = field(default_factory=list)  # where each horizon was planned from (blend_order)
    _perms: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict, repr=False)

    @property
    def horizon(self) -> int:
        """Sequences planned in all (past them the plan repeats)."""
        return self.horizons[-1]

    def replanned(self, done: int, horizon: int) -> "MixturePlan":
        """This plan with its first ``done`` sequences kept and the rest planned to reach ``horizon``'s
        apportionment (a time budget's end moved): the same plan :func:`plan_mixture` makes of the longer list of
        horizons, without planning again what was planned before."""
        if not 0 <= done < horizon or done > self.horizon:
            raise MixtureError(f"a mixture re-planned from sequence {done:,} needs a horizon past it (and "
                               f"{done:,} within the {self.horizon:,} planned): {horizon:,}")
        weights = [s.weight for s in self.sources]
        total = float(sum(weights))
        shares = np.asarray([w / total for w in weights], dtype=np.float64)
        order = np.concatenate([self.order[:done],
                                _segment(self.order[:done], weights, shares, done, horizon, self.seed)])
        counts = [int(c) for c in np.bincount(order, minlength=len(weights))]
        kept = [i for i, st in enumerate(self.starts) if st < done]
        horizons, starts = [self.horizons[i] for i in kept] + [horizon], [self.starts[i] for i in kept] + [done]
        counts = [int(c) for c in np.bincount(order, minlength=len(weights))]
        return _made(self.sources, self.seq_len, horizons, self.seed, self.digest, order, counts,
                     reached_apportionment(order, weights, horizons, starts), starts)

    def drawn(self, c: int) -> list[int]:
        """How many of each source the first ``c`` sequences of the stream hold (past the horizon too)."""
        block, r = divmod(c, self.horizon)
        head = np.bincount(self.order[:r], minlength=len(self.sources))
        return [block * n + int(h) for n, h in zip(self.counts, head)]

    def repeats(self, s: int) -> float:
        """Epochs of source ``s`` the horizon trains: its sequences over the windows it holds."""
        w = self.sources[s].windows
        return self.counts[s] / w if w else (math.inf if self.counts[s] else 0.0)

    def window(self, s: int, i: int) -> int:
        """Source ``s``'s ``i``-th sequence drawn: the window it is (epoch ``i // windows`` shuffled from the
        source's seed)."""
        w = self.sources[s].windows
        epoch, pos = divmod(i, w)
        cached = self._perms.get(s)
        if cached is None or cached[0] != epoch:
            rng = np.random.Generator(np.random.PCG64([source_seed(self.seed, self.sources[s].name), epoch]))
            cached = self._perms[s] = (epoch, rng.permutation(w))
        return int(cached[1][pos])

    def at(self, c: int) -> tuple[int, int]:
        """The ``c``-th sequence of the stream (0-based, past the horizon too): (source, window)."""
        block, r = divmod(c, self.horizon)
        s = int(self.order[r])
        return s, self.window(s, block * self.counts[s] + int(self.nth[r]))

    def over_limit(self, planned: str = "") -> list[str]:
        """Sources that would repeat more than their max_repeat, one phrase each with the numbers (``planned``:
        what the horizon is, e.g. " for the time budget's first guess of 50 steps")."""
        out = []
        for s, src in enumerate(self.sources):
            if src.max_repeat and self.counts[s] > src.max_repeat * src.windows:
                out.append(f"source {src.name!r} would be repeated {self.repeats(s):.2f} times ({self.counts[s]:,} "
                           f"sequences of {self.seq_len} tokens planned{planned}, it holds {src.windows:,}) but its "
                           f"max_repeat is {src.max_repeat:g}")
        return out

    def within_repeats(self) -> tuple[int, int] | None:
        """How far the stream (counted from the plan's start, past its horizon too) keeps every source within its
        max_repeat: (the sequences before the first one that would take a source past it, that source), the
        earliest over the sources; None when no source would ever pass it (no max_repeat)."""
        first: tuple[int, int] | None = None
        for s, src in enumerate(self.sources):
            if not src.max_repeat or not self.counts[s]:
                continue
            allowed = int(math.floor(src.max_repeat * src.windows + 1e-9))   # sequences of it within the limit
            block, r = divmod(allowed, self.counts[s])                       # the first one past it, in the plan
            at = block * self.horizon + int(np.flatnonzero(self.order == s)[r])
            if first is None or at < first[0]:
                first = (at, s)
        return first


def mixture_digest(sources: Sequence[SourceSpec], seq_len: int) -> str:
    """What the plan depends on besides the seed and the horizon (a sampler's state keeps that), as a digest: a
    resume compares it."""
    what = {"sources": [[s.name, s.weight, s.content, s.windows] for s in sources], "seq_len": seq_len,
            "version": 1}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def plan_mixture(sources: Sequence[SourceSpec], seq_len: int, horizon: int | Sequence[int], seed: int,
                 starts: Sequence[int] | None = None) -> MixturePlan:
    """The plan of ``horizon`` sequences of ``sources`` (a list: a run's horizon and its extensions or re-plans,
    each planned from its ``starts`` position: see :func:`blend_order`)."""
    horizons = [horizon] if isinstance(horizon, int) else list(horizon)
    if horizons[0] < 1:
        raise MixtureError("a mixture needs a horizon of at least one sequence")
    froms = [0] + horizons[:-1] if starts is None else [int(x) for x in starts]
    order, counts, exact = blend_order([s.weight for s in sources], horizons, seed, froms)
    return _made(list(sources), seq_len, horizons, seed, mixture_digest(sources, seq_len), order, counts, exact,
                 froms)


def _made(sources: list[SourceSpec], seq_len: int, horizons: list[int], seed: int, digest: str, order: np.ndarray,
          counts: list[int], exact: bool, starts: list[int]) -> MixturePlan:
    nth = np.zeros(len(order), dtype=np.int64)
    for s in range(len(sources)):
        where = np.flatnonzero(order == s)
        nth[where] = np.arange(len(where))
    for s, src in enumerate(sources):
        if counts[s] and src.windows < 1:
            raise MixtureError(f"source {src.name!r} holds no sequence of {seq_len} tokens")
    return MixturePlan(sources, seq_len, horizons, seed, digest, order, nth, counts, exact, starts)


class MixtureSampler:
    """Batches of ``batch_size`` rows drawn in the plan's order, each row a window of its source's tokens
    (``parts[s]``: that source's train or val tokens). Its state is a counter, with what identifies the plan (its
    digest, horizon and sources) so that a resume draws the same stream or is refused."""

    def __init__(self, plan: MixturePlan, parts: Sequence[np.ndarray], batch_size: int):
        self.plan, self.parts, self.batch_size = plan, list(parts), batch_size
        self.counter = 0
        self.base = 0                        # the counter where this plan began (a resume that changed the mixture)
        self.changed: list | None = None     # the sources before such a change: [[name, weight], ...] or None

    def next_batch(self) -> Batch[np.ndarray]:
        T = self.plan.seq_len
        rows = []
        for c in range(self.counter, self.counter + self.batch_size):
            s, w = self.plan.at(c - self.base)
            rows.append(np.asarray(self.parts[s][w * T:w * T + T + 1], dtype=np.int64))
        self.counter += self.batch_size
        win = np.stack(rows)
        return Batch(win[:, :-1], win[:, 1:])

    def sources(self) -> list[list]:
        return [[s.name, s.weight] for s in self.plan.sources]

    def state(self) -> dict[str, Any]:
        """The counter and what identifies the plan (its digest, horizons, and where each was planned from when a
        time budget re-planned it); ``drawn``: the sequences of each source drawn so far (what the run realized)."""
        plan, done = self.plan, self.counter - self.base
        default = plan.starts == [0] + plan.horizons[:-1]
        return {"mixture": plan.digest, "horizons": plan.horizons, "counter": self.counter, "base": self.base,
                "sources": self.sources(), "drawn": plan.drawn(done)} | ({} if default else {"starts": plan.starts})

    def replan(self, horizon: int) -> bool:
        """Plan the sequences from the counter on to reach ``horizon``'s apportionment (sequences counted from
        this plan's start), keeping what was drawn; False (nothing changed) when it is the plan's already, or the
        counter has reached it or passed the plan's horizon (the plan repeats there)."""
        done = self.counter - self.base
        if horizon == self.plan.horizon or horizon <= done or done > self.plan.horizon:
            return False
        self.plan = self.plan.replanned(done, horizon)
        return True

    def follow(self, horizon: int, near: int) -> bool:
        """A time budget's end moved to ``horizon`` sequences: re-planned when that matters (:meth:`replan`): it
        moved by more than a fifth of the plan's (the table and the repeats say what the run now plans), or the end
        (the plan's or the new one) is within ``near`` sequences, where the counts the run ends with are decided.
        Far from the end the order does not depend on the horizon, so a moving estimate costs nothing there."""
        done = self.counter - self.base
        if abs(horizon - self.plan.horizon) * 5 > self.plan.horizon or min(horizon, self.plan.horizon) - done <= near:
            return self.replan(horizon)
        return False

    def set_state(self, st: dict) -> None:
        """Go on from ``st``: the same plan (its horizons as the run began; a longer horizon now, resume --more,
        plans the steps after them to reach its apportionment, within one sequence at every step still); a
        checkpoint of other sources or weights (a resume allowed to change them: ``--remix``) starts this plan
        where it stopped (``changed`` says from what); the same sources whose text or seq_len changed, refused."""
        old = st.get("sources") if "mixture" in st else None
        if old != self.sources():
            self.changed = old or []
            self.counter = self.base = int(st.get("counter", 0))
            return
        if st["mixture"] != self.plan.digest:
            raise MixtureError(f"the checkpoint's mixture ({st['mixture']}) is not this run's ({self.plan.digest}): "
                               "the same sources and weights, but their text or model.seq_len changed since; "
                               "start a new run (--init-from to keep the weights)")
        began = [int(h) for h in st["horizons"]]
        froms = [int(x) for x in st.get("starts") or [0] + began[:-1]]
        if began != self.plan.horizons or froms != self.plan.starts:
            # the plan the run began with goes on (with a time budget's re-plans); resume --more: extended to this one
            grown, froms = (began + [self.plan.horizon], froms + [began[-1]]) if self.plan.horizon > began[-1] \
                else (began, froms)
            self.plan = plan_mixture(self.plan.sources, self.plan.seq_len, grown, self.plan.seed, froms)
        self.counter, self.base = int(st["counter"]), int(st.get("base", 0))


def describe_sources(sources: list | None) -> str:
    """[[name, weight], ...] as 'web 0.7, code 0.3'; None or none: one corpus."""
    if not sources:
        return "one corpus (no mixture)"
    return ", ".join(f"{n} {w:g}" for n, w in sources)


def check_resume(preset_sources: list | None, sampler_state: dict | None, checkpoint: str, allow: bool) -> list | None:
    """A resume's mixture against its checkpoint's: the same goes on; another (``preset_sources``: the preset's
    [[name, weight]] of a mixture of several sources, None for one corpus) is refused in one line unless
    ``allow`` (--remix). Returns the sources before a change allowed, else None."""
    st = sampler_state or {}
    old = st.get("sources") if "mixture" in st else None
    if old == preset_sources:
        return None
    if old is not None and preset_sources is None:
        raise MixtureError(f"{checkpoint} was trained on a mixture ({describe_sources(old)}) and the preset now names "
                           "one corpus: a run goes on with a mixture; put the mixture back in preset.toml, or start a "
                           "new run from it with `workbench train --init-from`")
    if not allow:
        raise MixtureError(f"{checkpoint} was trained on {describe_sources(old)}, but the preset now says "
                           f"{describe_sources(preset_sources)}: a resume keeps the mixture it began with; put "
                           "preset.toml's [[data.mixture]] back, or resume with --remix to go on with the new mixture "
                           "from this step (recorded in the run's history)")
    return old
