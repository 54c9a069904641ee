"""A sweep ranked by GRPO's held-out reward (issue 56), without training: the pruner reads a trial's `val` reward
records at its rungs and, the study maximizing them, stops the trial whose reward is below the median there (and
by val_loss, the same numbers the other way round); a budgeted GRPO run's evals on the way are its rungs, in order;
the metric a spec leaves out is the trials' eval. The real GRPO sweep: tests/train/test_grpo_budget.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench import rundir
from workbench.queue.outcome import VAL_LOSS, VAL_REWARD, Metric, parse_metric, rung_evals
from workbench.queue.sweep import Pruning, open_study
from workbench.queue.sweep_spec import Param, SpecError, SweepSpec, build_spec, parse_set_grid
from workbench.rundir import EvalRecord, RewardRecord, RunStatus
from workbench.rundir.jsonl import append_records


def run_with(root: Path, name: str, metric: Metric, at_rung: float) -> Path:
    """A run directory whose metrics have the metric at step 0, at step 2 (half its 4 steps: the rung) and 4."""
    d = root / name
    d.mkdir()
    values = (0.5, at_rung, at_rung)
    if metric.reward:
        recs: list = [RewardRecord(step=s, split="val", reward=v) for s, v in zip((0, 2, 4), values)]
        recs.insert(1, RewardRecord(step=1, split="train", reward=99.0))   # (a train record: not an eval)
    else:
        recs = [EvalRecord(step=s, train_loss=v, val_loss=v) for s, v in zip((0, 2, 4), values)]
    append_records(d / rundir.METRICS_FILE, recs)
    return d


@pytest.mark.parametrize("metric,pruned", [(VAL_REWARD, "low"), (VAL_LOSS, "high")])
def test_the_pruner_stops_the_trial_on_the_wrong_side_of_the_median_for_the_metrics_direction(tmp_path, metric,
                                                                                               pruned):
    spec = SweepSpec("s", "cpu-small", "grid", (Param("train.lr", (1e-3, 2e-3, 3e-3)),), 3, metric=metric,
                     pruner="median", prune_startup=1, prune_shares=(0.5,))
    study = open_study(tmp_path, spec, create=True)
    assert study.direction.name == metric.goal.upper()
    for _ in range(3):
        study.ask()
    at_rung = {"first": 0.6, "low": 0.2, "high": 0.9}
    st = RunStatus(state="running", step=2, max_iters=4)
    first = Pruning(tmp_path, spec, 0, 3)
    assert not first.should_prune(run_with(tmp_path, "first", metric, 0.6), st)   # (startup: it runs to its end)
    study.tell(0, 0.6)
    stopped = {}
    for k, name in enumerate(("low", "high"), 1):
        p = Pruning(tmp_path, spec, k, 3)
        stopped[name] = p.should_prune(run_with(tmp_path, name, metric, at_rung[name]), st)
        if stopped[name]:
            assert p.reason.startswith(f"{metric.name} {at_rung[name]:.4f} (step 2) at 50% of its budget is worse "
                                       "than the median"), p.reason
    assert stopped == {"low": pruned == "low", "high": pruned == "high"}
    assert open_study(tmp_path, spec).trials[1].intermediate_values == {50: at_rung["low"]}


def test_a_budgeted_grpo_runs_evals_on_the_way_are_its_rungs_in_order(tmp_path):
    """Its reward records carry no budget share: after step 0, the k-th is at the k-th rung, any later the end's."""
    d = tmp_path / "g"
    d.mkdir()
    append_records(d / rundir.METRICS_FILE, [RewardRecord(step=s, split="val", reward=r)
                                             for s, r in ((0, 0.1), (3, 0.2), (7, 0.3), (9, 0.4))])
    budgeted = RunStatus(state="finished", step=9, max_iters=9, budget_s=10.0, budget_spent_s=10.0)
    assert rung_evals(d, "val_reward", budgeted, (0.25, 0.5)) == [(0.25, 3, 0.2), (0.5, 7, 0.3), (1.0, 9, 0.4)]
    counted = RunStatus(state="finished", step=9, max_iters=9)   # in steps: each at its step over the end's
    assert [e[0] for e in rung_evals(d, "val_reward", counted, (0.25, 0.5))] == pytest.approx([3 / 9, 7 / 9, 1.0])
    assert rung_evals(d, "val_loss", counted, (0.25, 0.5)) == []   # (a GRPO run records no loss)


def test_the_metric_left_out_is_the_trials_eval_and_a_wrong_one_is_one_line():
    assert parse_metric("val_reward") == VAL_REWARD   # higher is better
    grid = parse_set_grid(["train.grpo_clip=0.1,0.2"])
    grpo = ("train.objective=grpo", "train.reward=exact:answer")
    assert build_spec(name="g", preset="cpu-small", params=grid, sets=grpo).metric == VAL_REWARD
    assert build_spec(name="s", preset="cpu-small", params=grid).metric == VAL_LOSS
    with pytest.raises(SpecError, match="they record no val_bpb; rank them by val_reward"):
        build_spec(name="g", preset="cpu-small", params=grid, sets=grpo, metric=parse_metric("val_bpb"))
    with pytest.raises(SpecError, match="metric val_reward is a GRPO run's held-out reward; its trials are "
                                        "train.objective = sft runs"):
        build_spec(name="s", preset="cpu-small", params=grid, metric=VAL_REWARD)
    with pytest.raises(SpecError, match="its trials mix train.objective = grpo .* with dpo"):
        build_spec(name="m", preset="cpu-small", params=parse_set_grid(["train.objective=grpo,dpo"]))
