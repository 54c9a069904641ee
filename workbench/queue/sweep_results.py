"""A sweep's results: its spec read back from the queue (``load``), every trial ranked by what it reached
(``results``), what pruning saved, the GPU memory between trials, and what keeps the ranking from meaning what it
says (``caveats``: trials too short to compare, trials beside other processes). Read by ``sweep show``, the Queue
tab, ``sweep save-best`` and the runner's last line of a sweep."""

from __future__ import annotations

import dataclasses
import difflib
import time
from dataclasses import dataclass
from typing import Any

from workbench import rundir
from workbench.queue.outcome import Metric, beside_note, final_metric, short_note, unspent_seconds
from workbench.queue.store import QueueError, QueueStore, trial_name
from workbench.queue.sweep_spec import SweepSpec


def load(store: QueueStore, name: str) -> SweepSpec:
    d = store.sweep_spec(name)
    if d is None:
        close = difflib.get_close_matches(name, store.sweep_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise QueueError(f"no sweep {name!r} in {store.root}{hint}; `workbench sweep ls` lists them")
    return SweepSpec.from_dict(d)


def sweep_metric(store: QueueStore, name: str) -> Metric:
    return load(store, name).metric



@dataclass(frozen=True)
class Result:
    number: int
    name: str
    params: dict[str, Any]
    state: str                 # the run's queue state, or refused / removed
    metric: float | None       # what it reached (a running trial: so far)
    rank: int | None           # 1 = best, among finished trials with the metric
    seconds: float | None      # wall-clock from start to end (or so far)
    note: str
    fit: str = ""              # how it was auto-fitted to this machine ("auto-fitted: batch 32 -> 8, ...")
    unspent: float | None = None   # a pruned trial: the seconds of its budget it did not use (what pruning saved)
    others_cpu: float | None = None   # other processes' mean share of the CPU while it trained
    beside: str = ""           # "ran beside other processes (...)": not comparable with the others ('' ran alone)
    short: str = ""            # "never left its warmup (...)": trained too little to compare ('' a complete run)
    gpu_free: tuple[float | None, float | None] = (None, None)   # its GPU's free MiB before it started, after it
    where: str = ""            # where it trains: the queue's place ("cpu slot 1/2 ..."); a shared study's "HOST: gpu 0"

    def to_dict(self) -> dict[str, Any]:
        return {"trial": self.number, "run": self.name, "params": self.params, "state": self.state,
                "metric": self.metric, "rank": self.rank, "seconds": self.seconds, "note": self.note,
                "fit": self.fit, "unspent_s": self.unspent, "others_cpu": self.others_cpu, "beside": self.beside,
                "short": self.short,
                "gpu_free_before_mib": self.gpu_free[0], "gpu_free_after_mib": self.gpu_free[1], "where": self.where}


def results(store: QueueStore, name: str, now: float | None = None) -> list[Result]:
    """Every trial of the sweep, in trial order, ranked by the spec's metric."""
    spec = load(store, name)
    items = {i.id: i for i in store.items()}
    out = []
    for t in store.trials(name):
        it = items.get(t.item) if t.item is not None else None
        if it is None:
            state = "refused" if t.note and t.item is None and "removed" not in t.note else "removed"
            out.append(Result(t.number, trial_name(name, t.number), t.params, state, None, None, None, t.note or ""))
            continue
        metric = it.metric
        if metric is None and it.state == "running" and (store.root / it.name / rundir.PRESET_FILE).is_file():
            metric = final_metric(store.root / it.name, spec.metric)
        secs = ((it.ended or now or time.time()) - it.started) if it.started else None
        unspent = unspent_seconds(store.root / it.name, secs) if it.state == "pruned" else None
        short = short_note(rundir.read_status(store.root / it.name)) if it.state == "finished" else ""
        out.append(Result(t.number, it.name, t.params, it.state, metric, None, secs, it.note or "", t.note or "",
                          unspent, it.others_cpu, beside_note(it.others_cpu, it.others), short,
                          (it.gpu_free_before, it.gpu_free_after), it.place or ""))
    done = [r for r in out if r.state == "finished" and r.metric is not None]
    sign = 1.0 if spec.metric.goal == "minimize" else -1.0
    done.sort(key=lambda r: sign * (r.metric or 0.0))  # (done: every metric is a number)
    ranks = {r.number: k for k, r in enumerate(done, 1)}
    return [dataclasses.replace(r, rank=ranks.get(r.number)) for r in out]


def compute_saved(rows: list[Result]) -> dict[str, float]:
    """The trial-seconds the sweep spent, what they would have been had every pruned trial used its whole budget,
    and the share pruning saved."""
    spent = sum(r.seconds or 0.0 for r in rows)
    full = spent + sum(r.unspent or 0.0 for r in rows)
    return {"spent_s": spent, "full_s": full, "saved_s": full - spent, "saved_share": (full - spent) / full
            if full else 0.0}


def gpu_memory_line(rows: list[Result]) -> str | None:
    """What the GPU had free between the trials against before the first: each trial is its own process, so
    its memory should all come back ("within N MiB of the start"); None when no trial measured it (no GPU)."""
    start = next((r.gpu_free[0] for r in rows if r.gpu_free[0] is not None), None)
    after = [(r.name, r.gpu_free[1]) for r in rows if r.gpu_free[1] is not None]
    if start is None or not after:   # no GPU, or not both ends measured yet
        return None
    name, worst = max(after, key=lambda a: abs(a[1] - start))
    return (f"GPU memory free: {start:,.0f} MiB before the first trial; after each of {len(after)} trial(s) within "
            f"{abs(worst - start):,.0f} MiB of it (furthest: {worst:,.0f} MiB after {name})")


def best(rows: list[Result]) -> Result | None:
    return next((r for r in rows if r.rank == 1), None)


def caveats(rows: list[Result]) -> list[str]:
    """What keeps a sweep's ranking from meaning what it says, one line each ([] for none): trials that trained
    too little to compare, trials that ran beside other processes (every one of them: then their times and
    results are comparable with no quiet machine's); the best trial among either named as such."""
    out = []
    ranked = [r for r in rows if r.state == "finished"]
    for flag, what in (("short", "trained too little to compare (inside their warmup, or fewer steps than a "
                                 "complete run)"),
                       ("beside", "ran beside other processes")):
        hit = [r for r in ranked if getattr(r, flag)]
        if not hit:
            continue
        who = ", ".join(r.name for r in hit)
        if len(hit) == len(ranked):
            out.append(f"all {len(hit)} finished trials {what} ({who}): the ranking may be noise")
        else:
            out.append(f"{len(hit)} of {len(ranked)} finished trials {what} ({who}): not comparable with the "
                       "others'")
    top = best(rows)
    if top is not None and (top.short or top.beside):
        out.append(f"the best, {top.name}, is one of them: train it again "
                   + ("with more time" if top.short else "on a quiet machine") + " before trusting it")
    return out


def sweep_states(store: QueueStore) -> list[tuple[str, SweepSpec, list[Result]]]:
    """Every sweep of the queue, with its results (the TUI's and `sweep ls`'s view)."""
    out = []
    for name in store.sweep_names():
        spec = load(store, name)
        out.append((name, spec, results(store, name)))
    return out
