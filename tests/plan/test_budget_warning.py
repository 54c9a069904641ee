"""What the estimate says of a time budget before a run starts (the new-run form, `workbench train`, `sweep`).

A budget's evals are sized to a share of it (plan.schedule.budget_plan.plan_budget): on a machine whose speed is not
known yet the trainer sizes them from an eval batch it times, and the estimate says so; on a measured machine the line
is the budget's plan (steps, warmup, evals and their share), and a budget too short to buy a complete run is its
problem, which `train` refuses before anything starts (tests/train/test_time_budget.py)."""

from __future__ import annotations

import re

from tests.support.canned_runs import HARDWARE
from workbench.config import resolve_preset
from workbench.machine.detect import Machine
from workbench.plan.report import fit_check
from workbench.plan.schedule.budget_plan import EVAL_SHARE, MIN_BUDGET_STEPS, budget_plan_at, plan_budget

UNMEASURED_CPU = Machine.from_info({**HARDWARE, "nvidia": [], "calibration": {}})
MEASURED_CPU = Machine.from_info({**HARDWARE, "nvidia": [], "calibration": {"cpu:fp32": 2e11}})


def test_a_budget_on_a_machine_of_unknown_speed_says_its_evals_are_sized_when_it_starts():
    p = resolve_preset("cpu-small", ["train.time_budget=60s"])
    check = fit_check(p, UNMEASURED_CPU)
    assert check.time.startswith("time: unknown until this machine's speed is measured"), check.time
    assert "the budget's evals are sized to at most 10% of it from an eval batch the run times" in check.time
    assert check.budget_problem == ""
    # no budget: nothing to say of one
    assert "budget" not in fit_check(resolve_preset("cpu-small"), UNMEASURED_CPU).time


def test_on_a_measured_machine_the_line_is_the_budgets_plan_and_a_too_short_one_is_a_problem():
    p = resolve_preset("cpu-small", ["train.time_budget=45s"])
    check = fit_check(p, MEASURED_CPU)
    assert re.match(r"time budget 45s: ~[\d,]+ steps by the estimate, warmup \d+; evals at step 0, .* at the end, "
                    r"\d+ batch(es)? each", check.time), check.time
    assert check.budget_problem == "" and "warning" not in check.time
    short = fit_check(resolve_preset("cpu-small", ["train.time_budget=2s"]), MEASURED_CPU)
    assert short.budget_problem and short.time == short.budget_problem
    assert re.fullmatch(r"a 2s budget (cannot pay for its first and last evals within 10% of it .*|buys ~\d+ steps "
                        r"here after its evals, fewer than the 10 a run needs .*): give at least \d.*",
                        short.budget_problem), short.budget_problem


def test_a_budgets_evals_stay_within_their_share_fewer_batches_before_fewer_evals():
    p = resolve_preset("cpu-small", ["train.time_budget=45s"])
    step_s, batch_s = 0.5, 0.15
    plan = plan_budget(p, 45.0, step_s, batch_s)
    # 3 evals on the way (the pruner's rungs) with as many batches as the share pays for
    assert plan.evals_on_the_way == 3 and plan.eval_iters == int(0.1 * 45 / (5 * 2 * batch_s))
    assert plan.eval_s == 5 * plan.eval_iters * 2 * batch_s <= EVAL_SHARE * 45
    assert plan.steps == int((45 - plan.eval_s) / step_s) and plan.warmup == round(0.1 * plan.steps)
    # slower evals: one batch each, fewer evals on the way, then none, then a problem
    assert [plan_budget(p, 45.0, step_s, b).evals_on_the_way for b in (0.45, 0.6, 1.0)] == [3, 1, 0]
    assert plan_budget(p, 45.0, step_s, 1.2).problem.startswith("a 45s budget cannot pay for its first and last")
    # a long budget: every batch auto asks for, and evals every eval_interval of the steps it buys
    long = plan_budget(p, 3600.0, 0.5, 0.15)
    assert long.eval_iters == long.auto_iters and long.evals_on_the_way == int((3600 - 2 * long.eval_s / long.evals)
                                                                                / 0.5 // 200)
    assert long.warmup == p.train.warmup_iters                  # the preset's 30: fewer than a tenth of 6,000
    # too few steps after the evals
    few = plan_budget(p, 8.0, 1.0, 0.01)
    assert few.steps < MIN_BUDGET_STEPS and "fewer than the 10 a run needs" in few.problem


def test_a_set_eval_iters_is_kept_and_warned_when_dearer_than_the_share():
    p = resolve_preset("cpu-small", ["train.time_budget=45s", "train.eval_iters=20"])
    plan = budget_plan_at(p, 4000.0)
    assert plan.eval_iters == 20 and plan.evals_on_the_way == 0 and plan.problem == ""
    assert plan.warning.startswith("evals of train.eval_iters = 20 batches take ~") and "train.eval_iters=0" in \
        plan.warning
    assert "warning: evals of train.eval_iters = 20" in fit_check(p, MEASURED_CPU).time


def test_a_budget_short_only_by_the_estimate_is_warned_not_refused():
    """The estimate's speed is often off by 1.5-4x on a CPU (an eval batch estimated at 0.21 s took 0.135 s): a
    budget too short at the estimated speed but not at ESTIMATE_SLACK times it is a warning (the run sizes its evals
    from a batch it times); one too short even then is the problem `train` refuses."""
    from workbench.plan.report import build_report
    from workbench.plan.schedule.budget_plan import ESTIMATE_SLACK
    p0 = resolve_preset("cpu-small")
    tps = build_report(p0, MEASURED_CPU).tokens_per_s
    between = next(s for s in range(1, 120) if budget_plan_at(p0, tps, float(s)).problem
                   and not budget_plan_at(p0, ESTIMATE_SLACK * tps, float(s)).problem)
    check = fit_check(resolve_preset("cpu-small", [f"train.time_budget={between}s"]), MEASURED_CPU)
    assert check.budget_problem == "" and check.budget_warning.endswith(
        "the run sizes its evals from an eval batch it times"), check.budget_warning
    assert f"warning: a {between}s budget " in check.time, check.time
    hopeless = fit_check(resolve_preset("cpu-small", ["train.time_budget=1s"]), MEASURED_CPU)
    assert hopeless.budget_problem.startswith("a 1s budget ")
