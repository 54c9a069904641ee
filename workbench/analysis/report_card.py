"""Task scores of a run, by step, and the report card of one checkpoint (torch-free).

Scores come from two files of the run directory, as typed task records (:class:`rundir.TaskRecord`):
``metrics.jsonl`` (the trainer scores ``train.eval_tasks`` while training: the current timeline only, so
a kill -9 and resume never shows a step twice) and ``tasks.jsonl`` (``workbench eval``). Where both
scored a task at one step, the record over more items wins (``workbench eval`` scores every item, the
trainer its first ``train.task_limit``).

The report card of a checkpoint lists every task scored at its step with its headline metric (centered
accuracy for multiple choice, exact match, bits per byte for text), the difference from the previous
scored step, and from the weights the run started from: a branch's parent checkpoint, or for a run
fine-tuned with ``--init-from``, its source checkpoint (or this run's own step-0 score, which is the
source's weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench.config import PresetError, parse_toml
from workbench.rundir import (
    METRICS_FILE,
    PRESET_FILE,
    TASKS_FILE,
    TaskRecord,
    current_timeline,
    last_records,
    parent_of,
    read_metrics,
)

# A task's headline metric: the first of these it has.
HEADLINE = ("centered", "exact", "bpb")
LOWER_IS_BETTER = ("bpb", "loss")

Scores = dict[int, dict[tuple[str, str], TaskRecord]]   # step -> (task, metric) -> record


def _task_records(run_dir: Path) -> list[TaskRecord]:
    run_dir = Path(run_dir)
    recs = [r for r in current_timeline(read_metrics(run_dir / METRICS_FILE)) if isinstance(r, TaskRecord)]
    return recs + [r for r in read_metrics(run_dir / TASKS_FILE) if isinstance(r, TaskRecord)]


def _best(recs: list[TaskRecord]) -> Scores:
    out: Scores = {}
    for r in recs:
        at = out.setdefault(r.step, {})
        old = at.get((r.task, r.metric))
        if old is None or r.n >= old.n:
            at[(r.task, r.metric)] = r
    return dict(sorted(out.items()))


def task_scores(run_dir: Path) -> Scores:
    """Every task score of the run, by step (over the most items where a step was scored more than once)."""
    return _best(_task_records(run_dir))


def headline(scores: dict[tuple[str, str], TaskRecord]) -> dict[str, TaskRecord]:
    """task -> its headline record, tasks in the order first seen."""
    out: dict[str, TaskRecord] = {}
    for task in dict.fromkeys(t for t, _ in scores):
        metric = next((m for m in HEADLINE if (task, m) in scores), None)
        if metric is None:
            metric = next(m for t, m in scores if t == task)
        out[task] = scores[(task, metric)]
    return out


def latest_headline(run_dir: Path, tail_bytes: int = 65536) -> tuple[int, dict[str, TaskRecord]] | None:
    """The newest scored step and its headline scores, from the end of metrics.jsonl and from tasks.jsonl
    (``workbench runs``, cheap for a long run)."""
    run_dir = Path(run_dir)
    recs = [r for r in current_timeline(last_records(run_dir / METRICS_FILE, tail_bytes))
            if isinstance(r, TaskRecord)]
    recs += [r for r in read_metrics(run_dir / TASKS_FILE) if isinstance(r, TaskRecord)]
    if not recs:
        return None
    step = max(r.step for r in recs)
    at: dict[tuple[str, str], TaskRecord] = {}
    for r in recs:
        if r.step != step:
            continue
        old = at.get((r.task, r.metric))
        if old is None or r.n >= old.n:
            at[(r.task, r.metric)] = r
    return step, headline(at)


@dataclass(frozen=True)
class CardRow:
    task: str
    metric: str
    value: float | None
    n: int
    prev: float | None          # the same metric at the previous scored step
    base: float | None          # ... in the weights the run started from

    @property
    def d_prev(self) -> float | None:
        return None if self.value is None or self.prev is None else self.value - self.prev

    @property
    def d_base(self) -> float | None:
        return None if self.value is None or self.base is None else self.value - self.base


@dataclass(frozen=True)
class ReportCard:
    run: str
    step: int
    rows: tuple[CardRow, ...]
    prev_step: int | None       # the previous scored step of this run (or of its parent, for a branch)
    base_label: str | None      # "parent tiny@540", "source smol@0", "step 0 (the source's weights)"

    @property
    def mean_centered(self) -> float | None:
        vals = [r.value for r in self.rows if r.metric == "centered" and r.value is not None]
        return sum(vals) / len(vals) if vals else None


def _origin(run_dir: Path) -> tuple[str, str, int] | None:
    """("parent" | "source", run id, step): where the run's first weights came from."""
    p = parent_of(run_dir)
    if p:
        return "parent", p[0], p[1]
    try:
        data = parse_toml((run_dir / PRESET_FILE).read_text(encoding="utf-8"), str(run_dir))
    except (OSError, PresetError):
        return None
    init = data.get("init")
    if isinstance(init, dict) and isinstance(init.get("run"), str) and isinstance(init.get("step"), int):
        return "source", init["run"], init["step"]
    return None


Index = dict[int, dict[tuple, TaskRecord]]   # step -> (task, metric, items, digest) -> record


def _key(r: TaskRecord) -> tuple:
    return r.task, r.metric, r.n, r.extra.get("digest")


def _index(recs: list[TaskRecord]) -> Index:
    out: Index = {}
    for r in recs:
        out.setdefault(r.step, {})[_key(r)] = r
    return out


def _latest_with(index: Index, keys: set, below: int | None = None, at_most: int | None = None) -> int | None:
    """The newest step (< ``below`` or <= ``at_most``) scored on any of ``keys``: scores are compared only
    between the same task, metric, number of items and items (digest)."""
    steps = [s for s, at in index.items() if (below is None or s < below) and (at_most is None or s <= at_most)
             and keys & at.keys()]
    return max(steps) if steps else None


def report_card(root: Path, run_id: str, step: int) -> ReportCard:
    """The report card of ``run_id``'s checkpoint at ``step`` (rows empty when nothing was scored there).
    A difference is shown only against a score of the same items (their number and the task's digest)."""
    run_dir = Path(root) / run_id
    recs = _task_records(run_dir)
    here = _best(recs).get(step, {})
    index = _index(recs)
    origin = _origin(run_dir)
    other = _index(_task_records(Path(root) / origin[1])) if origin else {}
    rows_here = headline(here)
    keys = {_key(r) for r in rows_here.values()}

    prev_at, prev_index = _latest_with(index, keys, below=step), index
    if prev_at is None and origin and origin[0] == "parent":  # a branch's first checkpoint: the parent's before it
        prev_at, prev_index = _latest_with(other, keys, at_most=origin[2]), other
    base, label = None, None
    if origin:
        kind, rid, ostep = origin
        found = _latest_with(other, keys, at_most=ostep) if kind == "parent" else (
            ostep if keys & other.get(ostep, {}).keys() else None)
        if found is not None:
            base, label = other[found], f"{kind} {rid}@{found}"
        elif kind == "source" and step != 0 and keys & index.get(0, {}).keys():
            base, label = index[0], "step 0 (the source's weights)"
    prev = prev_index.get(prev_at, {}) if prev_at is not None else {}
    rows = []
    for task, rec in rows_here.items():
        key = _key(rec)
        p, b = prev.get(key), (base or {}).get(key)
        rows.append(CardRow(task, rec.metric, rec.value, rec.n, p.value if p else None, b.value if b else None))
    return ReportCard(run_id, step, tuple(rows), prev_at, label)


def card_lines(card: ReportCard) -> list[str]:
    """The card as plain text lines (``workbench eval``, the Runs pane)."""
    if not card.rows:
        return [f"no task scores at step {card.step}; score it with `workbench eval {card.run} --checkpoint "
                f"{card.step} --task builtin` or set train.eval_tasks"]

    def d(x: float | None) -> str:
        return "—" if x is None else f"{x:+.3f}"

    prev = f"Δ step {card.prev_step}" if card.prev_step is not None else "Δ prev"
    base = f"Δ {card.base_label}" if card.base_label else "Δ base"
    rows = [("task", "metric", "score", "n", prev, base)]
    rows += [(r.task, r.metric, "—" if r.value is None else f"{r.value:.3f}", str(r.n), d(r.d_prev), d(r.d_base))
             for r in card.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    out = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
           for row in rows]
    if card.mean_centered is not None:
        out.append(f"mean centered accuracy: {card.mean_centered:.3f}")
    return out


__all__ = ["CardRow", "HEADLINE", "ReportCard", "card_lines", "headline", "latest_headline",
           "report_card", "task_scores"]
