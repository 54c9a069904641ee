"""What a queued run reached, read from its run directory: the metric a sweep ranks trials by (a GRPO run's:
its held-out prompts' mean reward, ``val_reward``), the evals along the way (for the pruner, each at its share
of the run), what a pruned run would still have used (the compute pruning saved), and
the one line a failed run is listed with (its error, and the run doctor's most important finding), and the flag
of a run that trained beside other processes (the runner's record of the machine's load: not comparable)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench import rundir
from workbench.analysis.doctor import diagnose_run
from workbench.analysis.report_card import HEADLINE, LOWER_IS_BETTER, task_scores
from workbench.config.objectives import OBJECTIVES
from workbench.errors import WorkbenchError
from workbench.fs import read_toml
from workbench.machine.activity import HardwareSnapshot
from workbench.machine.rates import BUSY_SHARE
from workbench.plan.schedule.budget_plan import MIN_BUDGET_STEPS
from workbench.rundir import EvalRecord, RewardRecord, RunStatus, TrainRecord, current_timeline, read_metrics

# A metric is one of these, or task:NAME[:METRIC] (a task score from the run's report card).
EVAL_METRICS = ("val_loss", "val_bpb")
# A GRPO run's eval (train.objective = grpo): the mean reward of its held-out prompts' completions (its "val"
# reward records), higher is better; a GRPO run records no val loss, and a run of any other objective no reward.
REWARD = "val_reward"


class MetricError(WorkbenchError):
    pass


@dataclass(frozen=True)
class Metric:
    """What a sweep ranks its trials by."""
    name: str                  # val_loss | val_bpb | val_reward | task:NAME[:METRIC]
    goal: str                  # minimize | maximize

    @property
    def task(self) -> tuple[str, str | None] | None:
        """(task, metric or None for its headline) for a task score; None for an eval metric."""
        if not self.name.startswith("task:"):
            return None
        _, task, *rest = self.name.split(":")
        return task, (rest[0] if rest else None)

    def better(self, a: float, b: float) -> bool:
        return a < b if self.goal == "minimize" else a > b

    @property
    def reward(self) -> bool:
        """The held-out reward: what a GRPO run's evals record (and nothing else's)."""
        return self.name == REWARD


VAL_REWARD = Metric(REWARD, "maximize")
VAL_LOSS = Metric("val_loss", "minimize")


def run_metric(run_dir: Path) -> Metric:
    """A run's own eval, what the queue lists it with: a GRPO run's held-out reward (by its preset's
    train.objective), any other run's val loss."""
    try:
        train = read_toml(Path(run_dir) / rundir.PRESET_FILE, MetricError, "{why}", "{why}").get("train", {})
    except MetricError:
        return VAL_LOSS
    objective = OBJECTIVES.get(str(train.get("objective", ""))) if isinstance(train, dict) else None
    return VAL_REWARD if objective is not None and objective.samples else VAL_LOSS


def parse_metric(name: str, goal: str | None = None) -> Metric:
    """A metric from a spec or ``--metric``: one line saying what is allowed when it is not."""
    name = (name or "val_loss").strip()
    if name not in (*EVAL_METRICS, REWARD) and not (name.startswith("task:") and len(name.split(":")) in (2, 3)
                                          and all(name.split(":")[1:])):
        raise MetricError(f"metric {name!r} is not one the trials record; use val_loss, val_bpb, val_reward (GRPO "
                          "trials' held-out reward), or task:NAME (a task in train.eval_tasks, e.g. "
                          "task:docs-cloze) or task:NAME:METRIC")
    if goal is None:
        lower = name in EVAL_METRICS or name.split(":")[-1] in LOWER_IS_BETTER
        goal = "minimize" if lower else "maximize"
    if goal not in ("minimize", "maximize"):
        raise MetricError(f"metric goal {goal!r} is not minimize or maximize")
    return Metric(name, goal)


def eval_curve(run_dir: Path, metric: str = "val_loss") -> list[tuple[int, float]]:
    """(step, value) of every eval of the run's current timeline that has ``metric``."""
    return [(step, value) for step, value, _ in eval_points(run_dir, metric)]


def eval_points(run_dir: Path, metric: str) -> list[tuple[int, float, float | None]]:
    """(step, value, budget share or None) of every eval of the run's current timeline that has ``metric``: an
    eval record's loss, or for ``val_reward`` a ``val`` reward record's mean reward (a GRPO run's eval; its
    record carries no budget share: None)."""
    out = []
    for r in current_timeline(read_metrics(Path(run_dir) / rundir.METRICS_FILE)):
        if metric == REWARD:
            if isinstance(r, RewardRecord) and r.split == "val" and r.reward is not None:
                share = r.extra.get("budget_share")
                out.append((r.step, float(r.reward), float(share) if isinstance(share, (int, float)) else None))
        elif isinstance(r, EvalRecord) and (v := getattr(r, metric)) is not None:
            out.append((r.step, float(v), r.budget_share))
    return out


def rung_evals(run_dir: Path, metric: str, st: RunStatus, rungs: tuple[float, ...]
               ) -> list[tuple[float, int, float]]:
    """(share of the run, step, value) of the run's evals past step 0, for the pruner to compare trials at its
    ``rungs`` (train.eval_shares). An eval's share: its record's budget share; counted in steps, its step over the
    run's end step. A budgeted GRPO run's reward records carry no share; its evals on the way are at its
    ``rungs`` alone (a budget with train.eval_shares evaluates at each, never skipped), so the k-th after step 0
    is at the k-th rung, and any after them is its end's (share 1)."""
    points = [p for p in eval_points(run_dir, metric) if p[0] > 0]
    out = []
    for k, (step, value, share) in enumerate(points):
        if share is None:
            if st.budget_s is not None:
                share = rungs[k] if k < len(rungs) else 1.0
            else:
                share = step / st.max_iters if st.max_iters else 0.0
        out.append((share, step, value))
    return out


def final_metric(run_dir: Path, metric: Metric) -> float | None:
    """What the run reached: its last eval's value (a budgeted run's last eval is at its end), or its newest
    score on the metric's task. None: the run recorded none."""
    run_dir = Path(run_dir)
    if (task := metric.task) is None:
        curve = eval_curve(run_dir, metric.name)
        return curve[-1][1] if curve else None
    name, which = task
    scores = task_scores(run_dir)
    for step in sorted(scores, reverse=True):
        at = scores[step]
        keys = [which] if which else list(HEADLINE) + sorted({m for t, m in at if t == name})
        for m in keys:
            if (name, m) in at and (v := at[(name, m)].value) is not None:
                return float(v)
    return None


def failure_line(run_dir: Path, status: RunStatus, info: dict | None = None) -> str:
    """One line for a failed run: what it said, and the run doctor's most important finding with its change."""
    error = (status.error or f"the run ended {status.state}").splitlines()[0].strip()
    try:
        findings = diagnose_run(Path(run_dir), HardwareSnapshot(info=info or {}))
    except (OSError, ValueError, WorkbenchError):
        findings = []
    if findings:
        f = findings[0]
        return f"{error}; doctor: {f.title} ({f.change})"
    return error


def unspent_seconds(run_dir: Path, seconds: float | None) -> float | None:
    """What a run stopped early would still have used to reach its end: the rest of its time budget (its
    start-up, paid already, is not in the budget), or without one its remaining steps at the pace its logged
    steps trained (evals included, start-up not: a trial stopped at 10 % after a 4 s start-up and 2 s of steps
    has ~18 s left, not 54). Without two logged steps, at the pace of the ``seconds`` it took to the step it
    reached. None when the run directory does not say."""
    try:
        st = rundir.read_status(run_dir)
    except WorkbenchError:
        return None
    if st.budget_s and st.budget_spent_s is not None:
        return max(0.0, st.budget_s - st.budget_spent_s)
    if not (st.step and st.max_iters > st.step):
        return None
    # the file's last 64 KiB (hundreds of logged steps) give the pace; the Queue pane asks every few seconds
    timed = [(r.step, r.elapsed_s) for r in current_timeline(rundir.last_records(run_dir / rundir.METRICS_FILE))
             if isinstance(r, TrainRecord) and r.elapsed_s is not None]
    if len(timed) >= 2 and timed[-1][0] > timed[0][0]:
        pace = (timed[-1][1] - timed[0][1]) / (timed[-1][0] - timed[0][0])
        return pace * (st.max_iters - st.step)
    return seconds * (st.max_iters - st.step) / st.step if seconds else None


def others_text(share: float | None) -> str:
    """Other processes' share of the CPU while a run trained, as the tables show it ('' not recorded)."""
    return "" if share is None else f"{share * 100:.0f} %"


def short_note(st: RunStatus) -> str:
    """The flag of a budgeted run that ended having trained too little to compare: inside its warmup (its searched
    learning rate never reached) or fewer than plan.schedule.budget_plan.MIN_BUDGET_STEPS steps; '' otherwise, for a
    live run, or a run counted in steps (it trains what it was asked)."""
    if st.budget_s is None or st.live:
        return ""
    if st.warmup and st.step <= st.warmup:
        return (f"never left its warmup ({st.step:,} of {st.warmup:,} steps): its settings never took full effect; "
                "give the trials more time")
    if st.step < MIN_BUDGET_STEPS:
        return (f"trained {st.step:,} steps, fewer than the {MIN_BUDGET_STEPS} a comparable run needs; give the "
                "trials more time")
    return ""


def beside_note(others_cpu: float | None, others: tuple[dict, ...] | list[dict] = ()) -> str:
    """The flag of a run that trained beside other processes: they used ``BUSY_SHARE`` of the CPU or more (the
    share that makes an MFU calibration one "under load") or held its GPU, so what it reached in its time budget
    is not comparable with a run that had the machine to itself: "ran beside other processes (41 % of the CPU;
    busiest: python3 (pid 812) 38 %)". '' for a run that ran alone, or whose load was not recorded."""
    gpu = [o for o in others if "gpu" in o]
    if not gpu and (others_cpu is None or others_cpu < BUSY_SHARE):
        return ""
    parts = []
    if others_cpu is not None:
        top = [o for o in others if "cpu_share" in o][:2]
        parts.append(f"{others_text(others_cpu)} of the CPU" + ("; busiest: " + ", ".join(
            f"{o['name']} (pid {o['pid']}) {o['cpu_share'] * 100:.0f} %" for o in top) if top else ""))
    if gpu:
        parts.append("on its GPU: " + ", ".join(f"{o['name']} (pid {o['pid']}, GPU {o['gpu']})" for o in gpu[:3]))
    return f"ran beside other processes ({'; '.join(parts)})"
