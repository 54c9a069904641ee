"""Run time, energy and cost of a preset: tokens/s from a FLOP rate, the steps' and evals' time, and what
that time costs in kWh and money. Arithmetic, no torch (memory is :mod:`workbench.plan.estimate`)."""

from __future__ import annotations

from workbench.config import budget_seconds
from workbench.errors import WorkbenchError
from workbench.plan.evals import eval_batches
from workbench.plan.flops import flops_per_token


def tokens_per_s_from_flops(model_cfg, flops_per_s: float, efficiency: float) -> float:
    return flops_per_s * efficiency / flops_per_token(model_cfg)


def estimate_time(preset, tokens_per_s: float) -> dict[str, float | None]:
    """Seconds to train to max_iters at ``tokens_per_s``, plus the periodic evaluations
    (eval_iters batches of train and of val every eval_interval, forward only: ~1/3 of a step; auto's count
    for a val split that does not limit it, as the data is not known here).
    With train.time_budget the total is the budget and ``steps`` (and tokens) what fits in it."""
    if not tokens_per_s or tokens_per_s <= 0:
        raise WorkbenchError(f"tokens per second must be > 0, got {tokens_per_s!r}")
    t, c = preset.train, preset.model
    train_tokens = t.max_iters * preset.tokens_per_step()
    n_evals = t.max_iters // t.eval_interval + 1
    eval_tokens = n_evals * 2 * eval_batches(preset)[0] * t.batch_size * c.seq_len
    train_s = train_tokens / tokens_per_s
    eval_s = eval_tokens / (3.0 * tokens_per_s)
    out = {"tokens": float(train_tokens), "train_s": train_s, "eval_s": eval_s, "total_s": train_s + eval_s,
           "steps": float(t.max_iters), "budget_s": None}
    budget = budget_seconds(t.time_budget)
    if budget is not None:  # the budget is the time; the steps are what fits in it at this rate, evals included
        share = budget / out["total_s"]
        out.update(tokens=train_tokens * share, train_s=train_s * share, eval_s=eval_s * share, total_s=budget,
                   steps=t.max_iters * share, budget_s=budget)
    return out


def estimate_cost(seconds: float, watts: float | None = None, usd_per_hour: float | None = None,
                  usd_per_kwh: float | None = None) -> dict[str, float | None]:
    """Energy (kWh at ``watts``) and cost: hours x $/hour plus kWh x $/kWh, each when given."""
    hours = seconds / 3600.0
    kwh = (watts * hours / 1000.0) if watts else None
    cost = None
    if usd_per_hour is not None or (usd_per_kwh is not None and kwh is not None):
        cost = (hours * usd_per_hour if usd_per_hour else 0.0) + (kwh * usd_per_kwh if usd_per_kwh and kwh else 0.0)
    return {"hours": hours, "watts": watts, "kwh": kwh, "usd": cost}
