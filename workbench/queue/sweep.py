"""Sweeps: trials made from a spec, each estimated and queued as a run of its own, searched and pruned by
Optuna (its study in ``runs/optuna.db``, its own SQLite storage, one study a sweep), ranked by what they reached.

- grid: every point is queued at once, in order (``NAME-t0001``...); each is also an Optuna trial (enqueued with
  its values), so the pruner sees every trial's curve.
- random: the trials are drawn at once by Optuna's RandomSampler (seeded) and queued.
- tpe: one trial at a time (TPE learns from the results): the next is asked when the last one ends, by the
  runner; the sampler is seeded with the spec's seed plus the trials already made, so a restarted runner does
  not draw the same points again.

A trial that will not fit this machine by the memory estimate is auto-fitted before it is queued (a smaller
micro-batch, more accumulation, the same tokens per step: ``admit.admit_fitted``; the change in the table), or
refused when no micro-batch fits (its reason in the table; Optuna is told it failed). The results reach Optuna when
a trial ends; a runner killed before that tells them when it starts again (``catch_up``), so a sweep resumes after
any kill: the state is in the two databases. ``sweep show`` reports what pruning saved: the budget each pruned trial
left unused, beside the trial-seconds spent.
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from workbench.config import resolve_preset
from workbench.config.duration import TimeBudget
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine
from workbench.plan.run_plan import corpus_values
from workbench.queue.admit import admit_fitted
from workbench.queue.outcome import rung_evals
from workbench.queue.store import ENDED, Item, NewItem, QueueError, QueueStore, Trial, trial_name
from workbench.queue.sweep_results import caveats, load, results
from workbench.queue.sweep_spec import Param, SweepSpec, metric_problem, point_sets, rung_sets
from workbench.rundir import RunStatus

OPTUNA_FILE = "optuna.db"


def _optuna() -> Any:
    import optuna  # lazily: the queue's other commands (and the TUI) never need it
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def storage_url(root: Path) -> str:
    return f"sqlite:///{Path(root).resolve() / OPTUNA_FILE}"


def _sampler(spec: SweepSpec, made: int) -> Any:
    optuna = _optuna()
    if spec.method == "tpe":
        return optuna.samplers.TPESampler(seed=spec.seed + made, n_startup_trials=min(10, max(2, spec.trials // 3)))
    return optuna.samplers.RandomSampler(seed=spec.seed + made)


HALVING_FACTOR = 2   # successive halving keeps the best 1/2 of the trials at each rung (Optuna's default is 4)


def _pruner(spec: SweepSpec) -> Any:
    """Optuna's pruner for the spec. Trials report at ``round(share * 100)``; successive halving's rungs are at
    the first share and then at each doubling of it (shares 0.25, 0.5, 0.75: rungs at 25 % and 50 %)."""
    optuna = _optuna()
    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.prune_startup, n_warmup_steps=0)
    if spec.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, round(spec.prune_shares[0] * 100)),
                                                      reduction_factor=HALVING_FACTOR, bootstrap_count=0)
    return optuna.pruners.NopPruner()


def open_study(root: Path, spec: SweepSpec, made: int = 0, create: bool = False) -> Any:
    optuna = _optuna()
    return optuna.create_study(storage=storage_url(root), study_name=spec.name, direction=spec.metric.goal,
                               sampler=_sampler(spec, made), pruner=_pruner(spec), load_if_exists=not create)


def _distributions(params: tuple[Param, ...]) -> dict[str, Any]:
    d = _optuna().distributions
    out = {}
    for p in params:
        if p.values:
            out[p.key] = d.CategoricalDistribution(list(p.values))
        elif p.integer:
            assert p.low is not None and p.high is not None  # (a range: spec.parse_param made both)
            out[p.key] = d.IntDistribution(int(p.low), int(p.high), log=p.log)
        else:
            assert p.low is not None and p.high is not None
            out[p.key] = d.FloatDistribution(float(p.low), float(p.high), log=p.log)
    return out


def _new_item(spec: SweepSpec, point: dict[str, Any]) -> NewItem:
    return NewItem(spec.preset, point_sets(point) + spec.sets + rung_sets(spec), spec.corpus,
                   TimeBudget.parse(spec.time_budget), _init_from(spec),
                   sweep=spec.name)


def _init_from(spec: SweepSpec) -> str | None:
    """``RUN:STEP`` where the sweep's preset starts from a run's checkpoint (its [init] table: a preset written
    from a fine-tune, e.g. a run's preset.toml or `sweep save-best`'s): each trial starts there, as `train
    --init-from` would (a GRPO run must: it learns from a trained model's samples). None: random weights, or a
    preset that does not resolve (the trial's admission says why)."""
    try:
        init = resolve_preset(spec.preset, list(spec.sets), corpus_values(spec.corpus)).init
    except WorkbenchError:
        return None
    return f"{init['run']}:{init['step']}" if init else None


@dataclass(frozen=True)
class Made:
    params: dict[str, Any]
    item: NewItem | None       # None: refused
    optuna: int | None
    note: str | None           # why refused; for a queued trial, how it was auto-fitted (or None)


def _admit(root: Path, spec: SweepSpec, point: dict[str, Any], machine: Machine, info: dict
           ) -> tuple[NewItem | None, str | None]:
    """(the trial's run, auto-fitted if need be, and how, with what its budget's plan warns of) or (None, why it is
    refused: it does not fit, or its time budget cannot buy a complete run, the plan `train` would refuse, unless
    the sweep was forced). Bad values are a WorkbenchError naming the trial's settings."""
    try:
        adm, fitted = admit_fitted(root, _new_item(spec, point), machine, info)
    except WorkbenchError as e:
        shown = " ".join(point_sets(point))
        raise type(e)(f"trial {shown}: {e}") from None
    if adm.refused:
        return None, adm.refused
    if (why := metric_problem(spec.name, (adm.preset.train.objective,), spec.metric)):
        raise QueueError(why)  # (build_spec refused it already when it could resolve the preset)
    problem, warning = adm.check.budget_problem, adm.check.budget_warning
    if problem and not spec.force:
        return None, f"{problem} (`sweep --force` queues it anyway)"
    notes = [n for n in (fitted, f"warning: {problem}" if problem else "", f"warning: {warning}" if warning else "")
             if n]
    # forced past its budget's problem: its `train` is told so too (--yes; its memory was admitted above)
    return dataclasses.replace(adm.item, force=True) if problem else adm.item, "; ".join(notes) or None


def _ask(study: Any, spec: SweepSpec, root: Path, machine: Machine, info: dict) -> Made:
    """One trial drawn by the sampler, admitted or refused (Optuna told it failed)."""
    optuna = _optuna()
    trial = study.ask(_distributions(spec.params))
    try:
        item, why = _admit(root, spec, dict(trial.params), machine, info)
    except WorkbenchError:  # a drawn value the preset refuses: Optuna is told, so the trial is not left running
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        raise
    if item is None:
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    return Made(dict(trial.params), item, trial.number, why)


def plan_trials(root: Path, spec: SweepSpec, machine: Machine, info: dict, study: Any = None) -> list[Made]:
    """The trials to make now: every grid point, every random draw, or TPE's first."""
    if (points := spec.points()) is not None:  # known ahead: each queued as Optuna's next trial, in order
        made = []
        for point in points:
            item, note = _admit(root, spec, point, machine, info)
            number = None
            if study is not None and item is not None:
                study.enqueue_trial(point)
                number = study.ask(_distributions(spec.params)).number
            made.append(Made(point, item, number, note))
        return made
    count = spec.trials if spec.method == "random" else 1
    return [_ask(study, spec, root, machine, info) for _ in range(count)] if study is not None else []


def print_commands(root: Path, spec: SweepSpec, machine: Machine, info: dict) -> list[str]:
    """One `workbench train` line per trial (grid: every point; random: the seeded draws), for another scheduler."""
    if spec.method == "tpe":
        raise QueueError("a TPE sweep learns from each result before it draws the next trial: its trials cannot be "
                         "written out ahead; use method = \"random\" or \"grid\" with --print-commands")
    points = spec.points()
    if points is None:
        sampler = _sampler(spec, 0)
        optuna = _optuna()
        study = optuna.create_study(sampler=sampler, direction=spec.metric.goal)  # in memory: nothing is kept
        points = [dict(study.ask(_distributions(spec.params)).params) for _ in range(spec.trials)]
    lines = []
    for k, point in enumerate(points, 1):
        item, note = _admit(root, spec, point, machine, info)
        if item is None:
            lines.append(f"# {trial_name(spec.name, k)} refused: {note}")
            continue
        trial = dataclasses.replace(item.new_run(), name=trial_name(spec.name, k), force=False)
        lines.append(" ".join(["workbench", "train", *(_quote(a) for a in trial.cli_args()), "--runs-dir",
                               _quote(str(root))]) + (f"  # {note}" if note else ""))
    return lines


def _quote(arg: str) -> str:
    return shlex.quote(arg)


def create_sweep(root: Path, spec: SweepSpec, machine: Machine, info: dict) -> list[Trial]:
    """Make the sweep: its trials estimated, the ones that fit queued, all in one transaction of the queue's
    database (Optuna's study made first; removed again if the queue refuses the sweep)."""
    store = QueueStore(root)
    if (why := store.name_in_use(spec.name)):
        raise QueueError(f"sweep name {spec.name!r} is taken: {why}; choose another --name")
    optuna = _optuna()
    try:  # a study left by a sweep that was never queued (killed between the two databases)
        optuna.delete_study(study_name=spec.name, storage=storage_url(root))
    except KeyError:
        pass
    study = open_study(root, spec, create=True)
    try:
        made = plan_trials(root, spec, machine, info, study)
        if spec.method == "tpe":  # refused draws are tried again, as many times as the sweep has trials
            while not any(m.item for m in made) and len(made) < spec.trials:
                made.append(_ask(study, spec, root, machine, info))
        if not any(m.item for m in made):
            why = "fits this machine by the estimate" if "does not fit" in (made[0].note or "") else \
                "can be queued"
            raise QueueError(f"no trial of sweep {spec.name} {why} (first: {made[0].note}); nothing was queued")
        return store.add_sweep(spec.name, spec.to_dict(), [(m.params, m.item, m.optuna, m.note) for m in made])
    except BaseException:
        optuna.delete_study(study_name=spec.name, storage=storage_url(root))
        raise


# ----------------------------------------------------------------------------- as trials end

def _tell(store: QueueStore, study: Any, trial: Trial, item: Item) -> None:
    optuna = _optuna()
    if trial.optuna is not None:
        if item.state == "finished" and item.metric is not None:
            study.tell(trial.optuna, item.metric, skip_if_finished=True)
        else:
            state = optuna.trial.TrialState.PRUNED if item.state == "pruned" else optuna.trial.TrialState.FAIL
            study.tell(trial.optuna, state=state, skip_if_finished=True)
    store.mark_told(trial.sweep, trial.number)


def catch_up(store: QueueStore, name: str, info: dict, say: Callable[[str], None]) -> None:
    """Give Optuna every ended trial's result it has not had, then make the next trial if one is due (tpe)."""
    spec = load(store, name)
    trials = store.trials(name)
    items = {i.id: i for i in store.items()}
    study = None
    for t in trials:
        it = items.get(t.item) if t.item is not None else None
        if not t.told and it is not None and it.state in ENDED:
            study = study or open_study(store.root, spec, made=len(trials))
            _tell(store, study, t, it)
    if spec.method != "tpe" or len(trials) >= spec.trials:
        return
    if any(items.get(t.item) and items[t.item].state in ("queued", "running") for t in trials if t.item):
        return
    study = open_study(store.root, spec, made=len(trials))
    machine = Machine.from_info(info)
    for _ in range(spec.trials - len(trials)):
        try:
            m = _ask(study, spec, store.root, machine, info)
        except WorkbenchError as e:  # a drawn value the preset refuses: that trial fails, the next is drawn
            say(f"sweep {name}: a drawn trial was refused: {e}")
            continue
        t = store.add_trial(name, m.params, m.item, m.optuna, m.note)
        if m.item is not None:
            fitted = f", {m.note}" if m.note else ""
            say(f"sweep {name}: queued {trial_name(name, t.number)} ({' '.join(point_sets(m.params))}{fitted})")
            return
        say(f"sweep {name}: {trial_name(name, t.number)} refused: {m.note}")


def trial_ended(store: QueueStore, item: Item, info: dict, say: Callable[[str], None]) -> None:
    assert item.sweep is not None  # (the runner asks for a sweep's trials alone)
    catch_up(store, item.sweep, info, say)
    rows = results(store, item.sweep)
    if all(r.state in ENDED + ("refused", "removed") for r in rows):
        best = next((r for r in rows if r.rank == 1), None)
        say(f"sweep {item.sweep} done: " + (f"best {best.name} ({' '.join(point_sets(best.params))}), "
                                             f"{best.metric:.4f}" if best else "no trial recorded the metric")
            + "".join(f"; {line}" for line in caveats(rows)))


# ----------------------------------------------------------------------------- the pruner

class Pruning:
    """Reports a running trial's eval metric to Optuna at fixed shares of its budget (or of its steps) and
    asks the pruner whether to stop it. Resumable: what was reported is in Optuna's storage."""

    def __init__(self, root: Path, spec: SweepSpec, optuna_number: int, made: int):
        optuna = _optuna()
        self.spec = spec
        self.study = open_study(root, spec, made=made)
        frozen = self.study.trials[optuna_number]
        self.trial = optuna.trial.Trial(self.study, frozen._trial_id)  # the ask-and-tell trial, reopened
        self.reported = {s for s in spec.prune_shares if round(s * 100) in frozen.intermediate_values}
        self.reason = ""

    def share(self, st: RunStatus) -> float | None:
        if st.budget_s and st.budget_spent_s is not None:
            return st.budget_spent_s / st.budget_s
        return st.step / st.max_iters if st.max_iters else None

    def report_rungs(self, run_dir: Path, st: RunStatus) -> tuple[float, int, float] | None:
        """Report to Optuna every rung the trial has passed and not reported yet, each with the trial's first eval
        at or past that share of its budget (of its steps): the eval its rung put there (train.eval_shares, which
        the sweep sets on every trial), so trials are compared at the same share whenever the runner looked; (the
        last rung, its eval's step, its value) when one was reported now, else None. A GRPO trial's eval is its
        held-out reward (outcome.rung_evals), and the study maximizes it: the pruner stops the lower. A rung whose
        eval is not written yet waits for the next look; also called as a trial ends, so a rung passed between
        looks is not lost."""
        share = self.share(st)
        due = [s for s in self.spec.prune_shares if share is not None and s <= share and s not in self.reported]
        if not due:
            return None
        evals = rung_evals(Path(run_dir), self.spec.metric.name, st, self.spec.prune_shares)
        last = None
        for s in due:
            at = [e for e in evals if e[0] >= s - 1e-6]
            if not at:  # (its eval not written yet, or the trial ended before its rung)
                continue
            _, step, value = at[0]
            self.trial.report(value, round(s * 100))
            self.reported.add(s)
            last = (s, step, value)
        return last

    def should_prune(self, run_dir: Path, st: RunStatus) -> bool:
        reported = self.report_rungs(run_dir, st)
        if reported is None:
            return False
        share, step, value = reported
        # (asked during halving's startup too: it records the trial's value at each rung it reaches)
        if self.trial.should_prune() and self._past_startup():
            than = ("worse than the median of the trials before it there" if self.spec.pruner == "median" else
                    f"not in the best 1/{HALVING_FACTOR} of the trials there (successive halving)")
            self.reason = (f"{self.spec.metric.name} {value:.4f} (step {step:,}) at {share:.0%} of its budget is "
                           + than)
            return True
        return False

    def _past_startup(self) -> bool:
        """Successive halving has no startup of its own: no trial is stopped before ``startup`` have ended
        (the median pruner counts them itself, the same way)."""
        if self.spec.pruner != "halving":
            return True
        done = self.study.get_trials(deepcopy=False, states=(_optuna().trial.TrialState.COMPLETE,))
        return len(done) >= self.spec.prune_startup


def pruner_for(store: QueueStore, item: Item) -> Pruning | None:
    if item.sweep is None:
        return None
    spec = load(store, item.sweep)
    if spec.pruner == "none":
        return None
    trial = next((t for t in store.trials(item.sweep) if t.item == item.id), None)
    if trial is None or trial.optuna is None:
        return None
    return Pruning(store.root, spec, trial.optuna, len(store.trials(item.sweep)))
