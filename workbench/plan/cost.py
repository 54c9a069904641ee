"""Run time, energy and cost of a preset: tokens/s from a FLOP rate, the steps' and evals' time, and what
that time costs in kWh and money. Arithmetic, no torch (memory is :mod:`workbench.plan.estimate`)."""

from __future__ import annotations

from typing import TypedDict

from workbench.config import ModelConfig, Preset, budget_seconds
from workbench.errors import WorkbenchError
from workbench.fmt import duration
from workbench.plan.evals import eval_batches
from workbench.plan.flops import flops_per_token


def tokens_per_s_from_flops(model_cfg: ModelConfig, flops_per_s: float, efficiency: float) -> float:
    return flops_per_s * efficiency / flops_per_token(model_cfg)


def eval_seconds(preset: Preset, eval_iters: int, tokens_per_s: float) -> float:
    """One eval's seconds at ``tokens_per_s`` (training's rate): ``eval_iters`` batches of train and of val,
    forward only, ~1/3 of a training step's work a token. The estimate's, and the time budget's reserve until
    an eval is timed."""
    return 2 * eval_iters * preset.train.batch_size * preset.model.seq_len / (3.0 * tokens_per_s)


class TimeEstimate(TypedDict):
    """A run's time by :func:`estimate_time`, in seconds (``tokens`` and ``steps`` what it trains)."""
    tokens: float
    train_s: float
    eval_s: float
    total_s: float
    steps: float
    budget_s: float | None     # train.time_budget, when the preset has one
    one_eval_s: float


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
    budget = budget_seconds(t.time_budget)
    if budget is None:
        return {"tokens": float(train_tokens), "train_s": train_s, "eval_s": eval_s, "total_s": train_s + eval_s,
                "steps": float(t.max_iters), "budget_s": None, "one_eval_s": one_eval_s}
    # The budget is the time; the steps are what fits in it at this rate. A budgeted run evaluates at step 0,
    # every eval_interval steps and once more at its end, whatever the budget: a short one is mostly evals.
    step_s = train_s / t.max_iters
    steps = budget_steps(preset, tokens_per_s, budget)
    return {"tokens": steps * preset.tokens_per_step(), "train_s": steps * step_s, "eval_s": budget - steps * step_s,
            "total_s": budget, "steps": steps, "budget_s": budget, "one_eval_s": one_eval_s}


def budget_steps(preset: Preset, tokens_per_s: float, seconds: float, eval_iters: int | None = None) -> float:
    """The steps that fit in ``seconds`` of a time budget at ``tokens_per_s``: a budgeted run evaluates at its start,
    every eval_interval steps and once more at its end, whatever the budget (the estimate's count, and the trainer's
    guess at its end step until it has timed its own steps). ``eval_iters``: the batches an eval scores, when the
    val split is known (auto's count for one that does not limit it otherwise)."""
    t = preset.train
    one_eval_s = eval_seconds(preset, eval_iters or eval_batches(preset)[0], tokens_per_s)
    step_s = preset.tokens_per_step() / tokens_per_s
    return max(0.0, (seconds - 2 * one_eval_s) / (step_s + one_eval_s / t.eval_interval))


# A budget whose evals would take more than this share of it gets a warning (the form, `train`, `estimate`).
BUDGET_EVAL_SHARE_WARN = 0.25


def budget_warning(preset: Preset, time: TimeEstimate) -> str:
    """What is wrong with a time budget for this run at the estimated speed (``time``: :func:`estimate_time`'s),
    in one line with the fix, or "" (no budget, or one that trains)."""
    budget, t = time.get("budget_s"), preset.train
    if not budget:
        return ""
    steps, share = time["steps"] or 0.0, (time["eval_s"] or 0.0) / budget
    # eval batches for which the step-0 and last evals take ~5 % of the budget
    fewer = max(1, int(eval_batches(preset)[0] * 0.025 * budget / (time["one_eval_s"] or budget)))
    if steps < 1:
        return ("the budget is spent on the first and last evals before a step trains: give more time, or fewer "
                f"eval batches (--set train.eval_iters={fewer})")
    if share > BUDGET_EVAL_SHARE_WARN:
        return (f"evals would take ~{share:.0%} of the budget: give more time, or fewer eval batches "
                f"(--set train.eval_iters={fewer})")
    if steps < 2 * t.warmup_iters:
        return (f"~{steps:,.0f} steps leave little after the {t.warmup_iters}-step warmup: give more time, or a "
                f"shorter warmup (--set train.warmup_iters={max(1, int(steps) // 10)})")
    return ""


def unmeasured_budget_warning(preset: Preset) -> str:
    """What to say of a time budget when this machine's speed is not known yet (no rate measured here, no run of the
    preset): not the evals' share of it, which needs the speed, but their size, which does not; "" without a
    budget. A 60 s budget took 1 min 58 s of wall-clock on a busy CPU (a 42 s step-0 eval, a 25 s last one)
    with no word."""
    budget, t = budget_seconds(preset.train.time_budget), preset.train
    if not budget:
        return ""
    n = eval_batches(preset)[0]
    fewer = 2 if n > 2 else 1
    return (f"a {duration(budget)} budget, and its step-0 and last evals score {n} batches of train and of val each "
            f"(the step-0 eval before the budget's clock starts), {n * t.batch_size * preset.model.seq_len:,} tokens "
            "a split: on a slow or busy machine they can take as long as the budget; fewer eval batches (--set "
            f"train.eval_iters={fewer}), or `workbench estimate {preset.name}` first, which measures this machine")


def estimate_cost(seconds: float, watts: float | None = None, usd_per_hour: float | None = None,
                  usd_per_kwh: float | None = None) -> dict[str, float | None]:
    """Energy (kWh at ``watts``) and cost: hours x $/hour plus kWh x $/kWh, each when given."""
    hours = seconds / 3600.0
    kwh = (watts * hours / 1000.0) if watts else None
    cost = None
    if usd_per_hour is not None or (usd_per_kwh is not None and kwh is not None):
        cost = (hours * usd_per_hour if usd_per_hour else 0.0) + (kwh * usd_per_kwh if usd_per_kwh and kwh else 0.0)
    return {"hours": hours, "watts": watts, "kwh": kwh, "usd": cost}
