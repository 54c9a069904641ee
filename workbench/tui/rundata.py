"""What the TUI knows about one run, built from the records the tailer reads.

Plain Python (no textual, no torch) so it is easy to test: ``RunData.feed`` takes
the new ``metrics.jsonl`` records (typed, see ``workbench.rundir.records``, or as the
parsed JSON lines the tailer reads) and keeps the series the panes draw plus the
latest record of each kind. Task scores come from both ``metrics.jsonl`` (fed, as the
trainer writes them) and ``tasks.jsonl`` (``workbench eval``; ``set_task_file`` with the
whole file, which the tailer re-reads when it changes: it is small).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from workbench.analysis.report_card import headline
from workbench.rundir import (
    TIMELINE_EVENTS,
    EvalRecord,
    EventRecord,
    Record,
    RewardRecord,
    RunStatus,
    RunView,
    TaskRecord,
    TrainRecord,
    parse_record,
)

# step -> (task, metric, items scored) -> record: scores over different numbers of items (the trainer's
# first train.task_limit, `workbench eval`'s all or --limit) are not the same measurement, so both are kept
Scores = dict[int, dict[tuple[str, str, int], TaskRecord]]

# Events worth a marker on screen, with the style they are shown in.
EVENT_STYLES = {
    "start": "green", "resume": "green", "compile_done": "cyan", "checkpoint": "blue",
    "early_stop": "yellow", "nonfinite_skip": "bold yellow", "rollback": "bold red",
    "error": "bold red", "stop": "yellow", "finish": "green",
}

# Records kept for the rate estimate: enough to smooth, few enough to follow changes.
RATE_WINDOW = 20


@dataclass
class RunData(RunView):
    run_id: str
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_train: list[float | None] = field(default_factory=list)
    eval_val: list[float] = field(default_factory=list)
    eval_val_bpb: list[float | None] = field(default_factory=list)    # bits per byte (None in older runs)
    eval_train_bpb: list[float | None] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    # a mixture's val loss of each source at the evals: {source: [(step, loss), ...]} (eval records' val_sources)
    eval_sources: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    task_fed: Scores = field(default_factory=dict)    # task scores from metrics.jsonl (current timeline)
    task_file: Scores = field(default_factory=dict)   # ... from tasks.jsonl (workbench eval)
    # a GRPO run's reward records by split (train: each logged step; val: the held-out prompts at each eval)
    rewards: dict[str, list[RewardRecord]] = field(default_factory=lambda: {"train": [], "val": []})
    last_train: TrainRecord | None = None
    last_eval: EvalRecord | None = None
    status: RunStatus = field(default_factory=RunStatus)
    skipped_total: int = 0
    # (step, elapsed_s) of train records since the last (re)start, warm-up record left out
    _rate_points: list[tuple[int, float]] = field(default_factory=list)
    _skip_next_for_rate: bool = True

    def feed(self, records: Sequence[Record | dict]) -> bool:
        """Add new records; True when anything changed."""
        for raw in records:
            r = parse_record(raw) if isinstance(raw, dict) else raw
            if isinstance(r, TrainRecord):
                self._feed_train(r)
            elif isinstance(r, EvalRecord):
                if r.val_loss is None:
                    continue
                self.eval_steps.append(r.step)
                self.eval_val.append(r.val_loss)
                self.eval_train.append(r.train_loss)
                self.eval_val_bpb.append(r.val_bpb)
                self.eval_train_bpb.append(r.train_bpb)
                for name, loss in (r.extra.get("val_sources") or {}).items():
                    self.eval_sources.setdefault(name, []).append((r.step, loss))
                self.last_eval = r
            elif isinstance(r, RewardRecord):
                self.rewards.setdefault(r.split, []).append(r)
            elif isinstance(r, TaskRecord):
                self.task_fed.setdefault(r.step, {})[(r.task, r.metric, r.n)] = r
            elif isinstance(r, EventRecord):
                self.events.append(r)
                if r.event in TIMELINE_EVENTS:
                    self._rewind(r.step)
                if r.event in ("start", "resume", "compile_done"):
                    # the first steps after a (re)start or compile are slow: leave them out of the rate
                    self._rate_points.clear()
                    self._skip_next_for_rate = True
        return bool(records)

    def _rewind(self, step: int) -> None:
        """A resume or rollback continues from ``step``: records after it belong to the timeline it
        abandoned (steps trained and logged after the checkpoint it went back to), so they go."""
        while self.steps and self.steps[-1] > step:
            self.steps.pop()
            self.losses.pop()
            self.tokens.pop()
        while self.eval_steps and self.eval_steps[-1] > step:
            self.eval_steps.pop()
            self.eval_val.pop()
            self.eval_train.pop()
            self.eval_val_bpb.pop()
            self.eval_train_bpb.pop()
        for name, pts in self.eval_sources.items():
            self.eval_sources[name] = [(s, v) for s, v in pts if s <= step]
        for s in [s for s in self.task_fed if s > step]:
            del self.task_fed[s]
        for split, recs in self.rewards.items():
            self.rewards[split] = [r for r in recs if r.step <= step]

    def set_task_file(self, records: Sequence[Record | dict]) -> None:
        """Every record of ``tasks.jsonl`` (the whole file: it replaces what was read before)."""
        self.task_file = {}
        for raw in records:
            r = parse_record(raw) if isinstance(raw, dict) else raw
            if isinstance(r, TaskRecord):
                self.task_file.setdefault(r.step, {})[(r.task, r.metric, r.n)] = r

    def task_scores(self) -> Scores:
        """Every task score, by step, from both files (``workbench eval``'s where both scored the same task,
        metric and number of items at one step)."""
        out: Scores = {s: dict(v) for s, v in self.task_fed.items()}
        for step, at in self.task_file.items():
            out.setdefault(step, {}).update(at)
        return dict(sorted(out.items()))

    def task_names(self) -> list[str]:
        """The tasks scored in this run, in the order first seen (by step)."""
        return list(dict.fromkeys(t for at in self.task_scores().values() for t, _m, _n in at))

    def last_reward(self, split: str = "train") -> RewardRecord | None:
        """The latest reward record of ``split`` (None for a run that is not GRPO, or before its first)."""
        recs = self.rewards.get(split)
        return recs[-1] if recs else None

    def reward_points(self, measure: str, split: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one of a reward record's measures (``RewardRecord.FIELDS``) in ``split``, the
        records without it (KL with beta 0, the held-out records' KL and clip share) left out."""
        pts = [(r.step, v) for r in self.rewards.get(split, []) if (v := getattr(r, measure)) is not None]
        return [s for s, _ in pts], [v for _, v in pts]

    def task_points(self, task: str, metric: str) -> dict[int, tuple[list[int], list[float]]]:
        """items scored -> (steps, values) of one task's metric: one series per number of items, so that
        every line compares like with like (as the report card does)."""
        out: dict[int, tuple[list[int], list[float]]] = {}
        for step, at in self.task_scores().items():
            for (t, m, n), r in at.items():
                if t == task and m == metric and r.value is not None:
                    steps, values = out.setdefault(n, ([], []))
                    steps.append(step)
                    values.append(r.value)
        return out

    def _feed_train(self, r: TrainRecord) -> None:
        if r.loss is not None:
            self.steps.append(r.step)
            self.losses.append(r.loss)
            self.tokens.append(r.tokens_seen)
        self.skipped_total = max(self.skipped_total, r.skipped)
        self.last_train = r
        if r.elapsed_s is None:
            return
        point = (r.step, r.elapsed_s)
        if self._skip_next_for_rate:
            self._skip_next_for_rate = False
            self._rate_points = [point]  # the baseline; its own interval is not counted
            return
        if self._rate_points and (r.step < self._rate_points[-1][0] or r.elapsed_s < self._rate_points[-1][1]):
            self._rate_points = []  # a rollback or restart without an event
        self._rate_points.append(point)
        del self._rate_points[:-RATE_WINDOW]

    def start_event(self) -> EventRecord | None:
        """The latest start or resume event: the device, precision and size the run trains with."""
        return next((e for e in reversed(self.events) if e.event in ("start", "resume")), None)

    # ------------------------------------------------------------------ derived numbers

    @property
    def compiling(self) -> bool:
        return self.status.compiling and self.status.live

    def steps_per_s(self) -> float | None:
        """Measured over recent records, leaving out compile and warm-up steps."""
        pts = self._rate_points
        if len(pts) < 2:
            return None
        (s0, t0), (s1, t1) = pts[0], pts[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)

    def eta_s(self) -> float | None:
        rate = self.steps_per_s()
        if rate is None or not self.max_iters:
            return None
        return max(0.0, (self.max_iters - self.step) / rate)

    def best_val(self) -> float | None:
        if self.status.best_val_loss is not None:
            return self.status.best_val_loss
        return min(self.eval_val) if self.eval_val else None


def task_names(runs: list[RunData]) -> list[str]:
    """The tasks scored in any of ``runs``, in the order first seen."""
    return list(dict.fromkeys(t for d in runs for t in d.task_names()))


def task_metric(runs: list[RunData], task: str) -> str | None:
    """The metric a task is plotted by: its headline (``report_card.HEADLINE``: centered accuracy, exact
    match, bits per byte), chosen over every score of it in ``runs`` so that every run draws the same."""
    seen = {(t, m): r for d in runs for at in d.task_scores().values() for (t, m, _n), r in at.items() if t == task}
    return headline(seen)[task].metric if seen else None


def ema(values: list[float], alpha: float) -> list[float]:
    """Exponential moving average with bias correction (as TensorBoard smooths)."""
    if alpha <= 0 or not values:
        return list(values)
    out, acc = [], 0.0
    for i, v in enumerate(values, 1):
        acc = alpha * acc + (1 - alpha) * v
        out.append(acc / (1 - alpha ** i))
    return out


def downsample(xs: list, ys: list, n: int) -> tuple[list, list]:
    """At most about ``n`` points, evenly strided, always keeping the last one."""
    if len(xs) <= n or n < 2:
        return list(xs), list(ys)
    stride = math.ceil(len(xs) / n)
    ix = list(range(0, len(xs), stride))
    if ix[-1] != len(xs) - 1:
        ix.append(len(xs) - 1)
    return [xs[i] for i in ix], [ys[i] for i in ix]


def joined(parts: list[tuple[RunData, int | None]]) -> RunData:
    """One run drawn with its ancestors: each part's series up to the step where the next part branched
    from it (None: all of it), as one RunData named after the last part."""
    out = RunData(parts[-1][0].run_id)
    for d, upto in parts:
        keep = [i for i, s in enumerate(d.steps) if upto is None or s <= upto]
        out.steps += [d.steps[i] for i in keep]
        out.losses += [d.losses[i] for i in keep]
        out.tokens += [d.tokens[i] for i in keep]
        keep = [i for i, s in enumerate(d.eval_steps) if upto is None or s <= upto]
        out.eval_steps += [d.eval_steps[i] for i in keep]
        out.eval_val += [d.eval_val[i] for i in keep]
        out.eval_train += [d.eval_train[i] for i in keep]
        out.eval_val_bpb += [d.eval_val_bpb[i] for i in keep]
        out.eval_train_bpb += [d.eval_train_bpb[i] for i in keep]
        out.task_fed.update({s: at for s, at in d.task_scores().items() if upto is None or s <= upto})
        for split, recs in d.rewards.items():
            out.rewards.setdefault(split, []).extend(r for r in recs if upto is None or r.step <= upto)
    last = parts[-1][0]
    out.status, out.last_train, out.last_eval, out.events = last.status, last.last_train, last.last_eval, last.events
    return out
