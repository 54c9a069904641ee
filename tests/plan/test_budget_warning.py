"""A time budget on a machine whose speed is not known yet (no matmul rate measured here, no earlier run of the
preset): the new-run form and `workbench train` said only "time: unknown", and a "60s" budget took 1 min 58 s of
wall-clock on a busy CPU (a 42 s step-0 eval, a 25 s last one) with no warning (issue 43). The evals' size is known
without the speed, so the estimate warns from it."""

from __future__ import annotations

from tests.support.canned_runs import HARDWARE
from workbench.config import resolve_preset
from workbench.machine.detect import Machine
from workbench.plan.evals import eval_batches
from workbench.plan.report import fit_check

UNMEASURED_CPU = Machine.from_info({**HARDWARE, "nvidia": [], "calibration": {}})


def test_a_budget_on_a_machine_of_unknown_speed_is_warned_from_its_evals_alone():
    p = resolve_preset("cpu-small", ["train.time_budget=60s"])
    n = eval_batches(p)[0]
    time = fit_check(p, UNMEASURED_CPU).time
    assert time.startswith("time: unknown until this machine's speed is measured"), time
    assert (f"warning: a 1m 00s budget, and its step-0 and last evals score {n} batches of train and of val each "
            "(the step-0 eval before the budget's clock starts)") in time, time
    assert "fewer eval batches (--set train.eval_iters=2)" in time and "workbench estimate cpu-small" in time, time
    # with the speed unknown and no budget there is nothing to warn about; a measured machine gets the share
    assert "warning" not in fit_check(resolve_preset("cpu-small"), UNMEASURED_CPU).time
    measured = Machine.from_info({**HARDWARE, "nvidia": [], "calibration": {"cpu:fp32": 2e11}})
    assert "evals would take ~" in fit_check(resolve_preset("cpu-small", ["train.time_budget=40s"]), measured).time
