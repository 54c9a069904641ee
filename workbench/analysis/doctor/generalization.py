"""Overfitting: the gap between val and train loss growing over the last evals while val stops improving.
The change, with the run's numbers: fewer steps, more dropout, more data, a smaller model."""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.analysis.doctor.facts import Context
from workbench.analysis.doctor.finding import Finding, num, set_line
from workbench.config import ModelConfig
from workbench.fmt import millions
from workbench.plan.fit.flops import count_params
from workbench.rundir import EvalRecord

# The run so far is cut in thirds by step: the last third ("recent") is compared with what came before.
# Thirds, not a number of evals: an eval every few steps would otherwise look at a sliver of the run,
# and a noisy val loss (a small split) would decide. At least this many evals, one in the recent third.
OVERFIT_MIN_EVALS = 4
# The last gap (val - train) at least this: below it is what a small eval's noise and ordinary
# generalisation show (a healthy tiny test run: 0.02 -> 0.09 nats over 60 steps); the seed guide's
# example of overfitting is 1.3 nats.
GAP_MIN = 0.25
# ... and the recent third's mean gap above the middle third's by at least this: a steady gap is a
# trait of the data, not overfitting.
GAP_GROWTH_MIN = 0.05
# Val "stops improving" when the last eval is not its best and its best in the recent third beat the
# best before it by less than this share of what the gap grew: the model now learns mostly the training
# text itself.
PLATEAU_RATIO = 0.25
# "Fewer steps": the first eval whose val loss was within this of the best one; the steps after it
# bought almost nothing.
NEAR_BEST_NATS = 0.05
# Dropout goes up by this step, to at most DROPOUT_MAX (the seed guide: 0.1 -> 0.2).
DROPOUT_STEP = 0.1
DROPOUT_MAX = 0.3
# Compute-optimal training sees ~20 tokens per parameter (Hoffmann et al. 2022, "Chinchilla").
TOKENS_PER_PARAM = 20


def smaller_model(m: ModelConfig) -> tuple[dict[str, Any], int] | None:
    """Half the layers, or at one layer half the width (heads kept valid); (--set values, parameters)."""
    if m.n_layers >= 2:
        values = {"model.n_layers": m.n_layers // 2}
        return values, count_params(dataclasses.replace(m, n_layers=m.n_layers // 2))
    dim = m.dim // 2
    if dim % m.n_heads or (dim // m.n_heads) % 2 or dim < 16:
        return None
    return {"model.dim": dim}, count_params(dataclasses.replace(m, dim=dim, ffn_hidden=0))


def check(ctx: Context) -> list[Finding]:
    f = ctx.facts
    ev, p = f.evals, f.preset
    if p is None or len(ev) < OVERFIT_MIN_EVALS:
        return []
    last = ev[-1]
    recent = [e for e in ev if e.step * 3 >= last.step * 2]
    before = [e for e in ev if e.step * 3 < last.step * 2]
    middle = [e for e in before if e.step * 3 >= last.step] or before

    def val(e: EvalRecord) -> float:
        assert e.val_loss is not None  # RunFacts.evals holds only evals with both losses
        return e.val_loss

    def gap(e: EvalRecord) -> float:
        assert e.train_loss is not None
        return val(e) - e.train_loss

    def mean(evals: list[EvalRecord]) -> float:
        return sum(map(gap, evals)) / len(evals)

    if not recent or not before:
        return []
    growth = mean(recent) - mean(middle)
    gain = min(map(val, before)) - min(map(val, recent))
    best = min(ev, key=val)
    if best is last or gap(last) < GAP_MIN or growth < GAP_GROWTH_MIN or gain >= PLATEAU_RATIO * growth:
        return []  # a new best at the last eval: val is still improving, whatever the gap does
    near = next(e for e in ev if val(e) <= val(best) + NEAR_BEST_NATS)
    values: dict[str, Any] = {}
    if p.model.dropout < DROPOUT_MAX:
        values["model.dropout"] = round(min(DROPOUT_MAX, p.model.dropout + DROPOUT_STEP), 2)
    if p.train.warmup_iters < near.step < p.train.max_iters and (
            not p.train.lr_decay_iters or p.train.lr_decay_iters < near.step):
        values["train.max_iters"] = near.step
    since = recent[0].step
    evidence = [f"val loss {val(best):.3f} at step {best.step} (best), {val(last):.3f} at step {last.step}",
                f"gap (val - train) {mean(middle):.2f} on average over steps {middle[0].step}-{middle[-1].step}, "
                f"{mean(recent):.2f} over steps {since}-{last.step} ({gap(last):.2f} at the last eval), while the "
                "best val loss "
                + (f"improved only {gain:.3f}" if gain > 0 else f"got worse by {-gain:.3f}") + f" since step {since}"]
    also = []
    train_tokens = int(f.start_value("train_tokens") or 0)
    seen = f.last_train.tokens_seen if f.last_train else 0
    if train_tokens and seen:
        evidence.append(f"the run has read its {num(train_tokens)} training tokens {seen / train_tokens:.1f} times "
                        f"({num(seen)} tokens)")
        also.append(f"more data: ~{num(seen)} training tokens (now {num(train_tokens)}) would let these steps read "
                    "each token once")
    params = int(f.start_value("params") or count_params(p.model))
    if (small := smaller_model(p.model)) is not None and train_tokens:
        sv, sp = small
        also.append(f"a smaller model: {set_line(sv)} ({millions(sp, '.2f')} parameters, now "
                    f"{millions(params, '.2f')}; "
                    f"{train_tokens / params:.2g} training tokens per parameter now, ~{TOKENS_PER_PARAM} is "
                    f"compute-optimal)")
    if near.step < last.step:
        also.append(f"early stopping: --set train.patience=2 stops when val has not improved for 2 evals; "
                    f"the best checkpoint (step {best.step}) is kept: `workbench sample {f.run_id} --checkpoint best`")
    if not values:
        values = {"train.patience": 2}
    severity = "high" if val(last) - val(best) >= 0.1 else "medium"
    return [Finding("overfitting", "overfitting.gap", severity,
                    "the val/train gap grows while val loss has stopped improving",
                    tuple(evidence), set_line(values), values, ctx.apply_command(values), step=since,
                    also=tuple(also),
                    data={"best_step": best.step, "best_val": best.val_loss, "gap_end": gap(last),
                          "gap_growth": growth, "val_gain": gain, "near_best_step": near.step})]
