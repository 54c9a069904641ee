"""Run time, energy and cost of a preset: tokens/s from a FLOP rate, the steps' and evals' time, and what
that time costs in kWh and money. Arithmetic, no torch (memory is :mod:`workbench.plan.fit.memory`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from workbench.config import ModelConfig, Preset
from workbench.errors import WorkbenchError
from workbench.plan.fit.flops import flops_per_token
from workbench.plan.schedule.budget_plan import budget_plan_at
from workbench.plan.schedule.evals import eval_batches


def tokens_per_s_from_flops(model_cfg: ModelConfig, flops_per_s: float, efficiency: float) -> float:
    return flops_per_s * efficiency / flops_per_token(model_cfg)


def eval_seconds(preset: Preset, eval_iters: int, tokens_per_s: float) -> float:
    """One eval's seconds at ``tokens_per_s`` (training's rate): ``eval_iters`` batches of train and of val,
    forward only, ~1/3 of a training step's work a token. The estimate's, and the time budget's reserve until
    an eval is timed."""
    return 2 * eval_iters * preset.train.batch_size * preset.model.seq_len / (3.0 * tokens_per_s)


@dataclass(frozen=True)
class TimeEstimate:
    """A run's time by :func:`estimate_time`, in seconds (``tokens`` and ``steps`` what it trains)."""
    tokens: float
    train_s: float
    eval_s: float
    total_s: float
    steps: float
    budget_s: float | None     # train.time_budget, when the preset has one
    one_eval_s: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class CostEstimate:
    """Energy and money by :func:`estimate_cost`; ``watts_source`` (where the watts come from) is the report's."""
    hours: float
    watts: float | None
    kwh: float | None
    usd: float | None
    watts_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def estimate_time(preset: Preset, tokens_per_s: float) -> TimeEstimate:
    """Seconds to train to max_iters at ``tokens_per_s``, plus the periodic evaluations
    (eval_iters batches of train and of val every eval_interval, forward only: ~1/3 of a step; auto's count
    for a val split that does not limit it, as the data is not known here).
    With train.time_budget the total is the budget and ``steps`` (and tokens) what fits in it."""
    if not tokens_per_s or tokens_per_s <= 0:
        raise WorkbenchError(f"tokens per second must be > 0, got {tokens_per_s!r}")
    t = preset.train
    train_tokens = t.max_iters * preset.tokens_per_step()
    n_evals = t.max_iters // t.eval_interval + 1
    one_eval_s = eval_seconds(preset, eval_batches(preset)[0], tokens_per_s)
    train_s = train_tokens / tokens_per_s
    eval_s = n_evals * one_eval_s
    plan = budget_plan_at(preset, tokens_per_s)
    if plan is None:
        return TimeEstimate(tokens=float(train_tokens), train_s=train_s, eval_s=eval_s, total_s=train_s + eval_s,
                            steps=float(t.max_iters), budget_s=None, one_eval_s=one_eval_s)
    # The budget is the time; the steps are what fits in it at this rate once its evals are paid for: sized to
    # stay within budget_plan.EVAL_SHARE of it (plan.schedule.budget_plan.plan_budget, the trainer's plan too).
    steps = float(plan.steps or 0)
    return TimeEstimate(tokens=steps * preset.tokens_per_step(), train_s=steps * train_s / t.max_iters,
                        eval_s=plan.eval_s or 0.0, total_s=plan.seconds, steps=steps, budget_s=plan.seconds,
                        one_eval_s=eval_seconds(preset, plan.eval_iters, tokens_per_s))


def budget_warning(preset: Preset, tokens_per_s: float) -> str:
    """What is wrong with a time budget for this run at ``tokens_per_s``, in one line with the fix, or "" (no
    budget, or one that buys a complete run): its plan's problem (too short for its evals and a run that warms up
    and decays) or warning (evals a set train.eval_iters makes dearer than their share)."""
    plan = budget_plan_at(preset, tokens_per_s)
    return (plan.problem or plan.warning) if plan is not None else ""


def estimate_cost(seconds: float, watts: float | None = None, usd_per_hour: float | None = None,
                  usd_per_kwh: float | None = None) -> CostEstimate:
    """Energy (kWh at ``watts``) and cost: hours x $/hour plus kWh x $/kWh, each when given."""
    hours = seconds / 3600.0
    kwh = (watts * hours / 1000.0) if watts else None
    cost = None
    if usd_per_hour is not None or (usd_per_kwh is not None and kwh is not None):
        cost = (hours * usd_per_hour if usd_per_hour else 0.0) + (kwh * usd_per_kwh if usd_per_kwh and kwh else 0.0)
    return CostEstimate(hours=hours, watts=watts, kwh=kwh, usd=cost)
