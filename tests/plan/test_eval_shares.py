"""train.eval_shares: the shares of a run its evals on the way fall at (a sweep's pruner puts its rungs there, so
every trial is compared at the same share whatever its own plan would have chosen). Counted in steps, at the first
step at or past each share of max_iters (besides every eval_interval); on a budget, at those shares of its training,
one each, sized into the budget's eval share (a warning when they cannot fit it)."""

from __future__ import annotations

import pytest

from tests.support.cli import TINY, wb
from tests.support.runs import read_jsonl
from workbench.config import PresetError, resolve_preset
from workbench.plan.schedule.budget_plan import EVAL_SHARE, plan_budget
from workbench.plan.schedule.horizon import Horizon


@pytest.mark.parametrize("given,shares", [("0.2", [0.2]), ('"0.5, 0.25"', [0.25, 0.5]),
                                          ("[0.75,0.25,0.75]", [0.25, 0.75]), ('""', "")])
def test_shares_are_read_from_a_number_a_list_or_a_string(given, shares):
    assert resolve_preset("cpu-small", [f"train.eval_shares={given}"]).train.eval_shares == shares


@pytest.mark.parametrize("given", ["1.0", "0", "[0.5, 2]", '"half"', "true"])
def test_a_share_outside_zero_to_one_is_one_line_naming_it(given):
    with pytest.raises(PresetError, match=r"train\.eval_shares = .* is not a share between 0 and 1 \(exclusive\); "
                                          r"give e\.g\. eval_shares = \[0\.25, 0\.5\]"):
        resolve_preset("cpu-small", [f"train.eval_shares={given}"])


def test_a_budget_evaluates_at_the_shares_set_whatever_its_plan_would_have_chosen():
    p = resolve_preset("cpu-small", ["train.time_budget=45s", "train.eval_shares=[0.2]"])
    even = plan_budget(resolve_preset("cpu-small", ["train.time_budget=45s"]), 45.0, 0.5, 0.15)
    plan = plan_budget(p, 45.0, 0.5, 0.15)
    assert even.evals_on_the_way == 3 and plan.evals_on_the_way == 1 and plan.shares == (0.2,)
    assert plan.eval_s <= EVAL_SHARE * 45 and "evals at step 0, at 20 % and at the end" in plan.evals_line()
    h = Horizon.of(p).planned(plan)
    assert [h.eval_between(a, b) for a, b in [(0.1, 0.19), (0.19, 0.2), (0.2, 0.21), (0.15, 0.5)]] == \
        [False, True, False, True]
    # slow evals: still one each (the rungs must have their eval), said as a warning, not dropped
    slow = plan_budget(resolve_preset("cpu-small", ["train.time_budget=45s", "train.eval_shares=[0.2,0.4,0.6,0.8]"]),
                       45.0, 0.5, 0.6)
    assert slow.evals_on_the_way == 4 and slow.eval_iters == 1 and slow.problem == ""
    assert slow.warning.startswith("evals at train.eval_shares (4 on the way, 1 batch each) take ~16.0% of the "
                                   "budget, more than the 10% it keeps") and "give fewer shares" in slow.warning


def test_counted_in_steps_the_evals_fall_at_the_first_step_past_each_share(tmp_path):
    root = tmp_path / "runs"
    wb("train", "cpu-small", "--runs-dir", str(root), "--name", "s", "--set", *TINY, "train.max_iters=18",
       "train.eval_interval=200", "train.eval_shares=[0.25,0.5]", check=True)
    steps = [r["step"] for r in read_jsonl(root / "s" / "metrics.jsonl") if r["kind"] == "eval"]
    assert steps == [0, 5, 9, 18]    # ceil(0.25 x 18), 0.5 x 18, the end
