"""Preference runs (train.objective = dpo, simpo, orpo, kto), from their ``pref`` records: the peers' known
failures (TRL #1962: a loss stuck at 0.6931; #1107 / #1148: a reward accuracy stuck at 0 or 1 from the start; the
chosen answers' probability collapsing), and the one users ask about most (LLaMA-Factory #6153, TRL #800): both
rewards falling under DPO, which is expected and explained."""

from __future__ import annotations

import math

from workbench.analysis.doctor.facts import Context
from workbench.analysis.doctor.finding import Finding, set_line
from workbench.config.objectives import objective_spec

LN2 = math.log(2)
# A DPO loss within this of ln 2 is one whose rewards never parted: |margin| under ~0.01 nats at β 0.1 is ~0.1
# nats of log-prob difference, nothing a run that learns stays at for long.
LN2_BAND = 0.005
# Records (log lines) a judgement needs: fewer is the first steps of any run, where the loss is ln 2 by design.
MIN_RECORDS = 8
# The chosen answers' log-probs fallen this far below the reference's (summed over an answer, nats): each chosen
# answer e^-10 times less likely than before: the model is unlearning the answers it should prefer.
CHOSEN_COLLAPSE_NATS = 10.0
# The same for the length-averaged log-probs of the reference-free objectives (nats a token).
CHOSEN_COLLAPSE_PER_TOKEN = 1.0


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


def check(ctx: Context) -> list[Finding]:
    f, p = ctx.facts, ctx.facts.preset
    if p is None or not (spec := objective_spec(p.train.objective)).preference or not f.prefs_recent:
        return []
    first, recent = f.prefs_first, list(f.prefs_recent)
    everything = first + [r for r in recent if r.step > first[-1].step] if first else recent
    out: list[Finding] = []
    last = recent[-1]
    losses = [r.loss for r in everything if r.loss is not None]
    if spec.reference_margin and len(losses) >= MIN_RECORDS and not p.train.pref_sft_weight \
            and all(abs(v - LN2) < LN2_BAND for v in losses):
        values = {"train.lr": p.train.lr * 3}
        out.append(Finding(
            "preference", "preference.stuck_ln2", "high", "the DPO loss has not left ln 2 (0.6931)",
            (f"loss within {LN2_BAND} of ln 2 at all {len(losses)} logged steps (steps {everything[0].step}-"
             f"{last.step}): the policy's rewards never parted from the reference's",
             "the reference checks passed (the run would have stopped), so the updates are too small to move "
             "the log-probs"),
            set_line(values), values, ctx.apply_command(values),
            also=(set_line({"train.pref_beta": 0.5}) + " (a larger beta: rewards move faster)",
                  "pairs whose chosen and rejected answers differ (identical texts have no gradient)"),
            step=last.step, data={"records": len(losses), "last_loss": losses[-1]}))
    later = [r for r in everything if r.step > 1 and r.accuracy is not None]  # step 1: rewards 0, accuracy 0
    if len(later) >= MIN_RECORDS // 2 and (all(r.accuracy == 1.0 for r in later)
                                            or all(r.accuracy == 0.0 for r in later)):
        v = later[0].accuracy
        why = ("every pair is told apart from the first steps: the rejected answers differ in something trivial "
               "(length, a marker, a truncation) the model picks up at once" if v == 1.0 else
               "the rejected answer wins every pair: chosen and rejected swapped in the data, or a reference that "
               "is the policy (TRL #1107)")
        out.append(Finding(
            "preference", "preference.accuracy_stuck", "medium", f"reward accuracy stuck at {v:.0%} from the start",
            (f"reward accuracy {v:.0%} in each of {len(later)} logged steps ({later[0].step}-{later[-1].step})",
             why),
            "check the pairs: `workbench data inspect FILE -n 5` shows each pair's chosen and rejected answers", {},
            "", step=later[0].step, data={"accuracy": v, "records": len(later)}))
    drift = last.chosen_drift
    if drift is None and first and first[0].chosen_logps is not None and last.chosen_logps is not None:
        drift = last.chosen_logps - first[0].chosen_logps
    limit = CHOSEN_COLLAPSE_PER_TOKEN if spec.averaged else CHOSEN_COLLAPSE_NATS
    if drift is not None and drift < -limit:
        values = {"train.pref_sft_weight": 1.0} if "pref_sft_weight" in spec.keys else {"train.lr": p.train.lr / 3}
        out.append(Finding(
            "preference", "preference.chosen_collapse", "medium", "the chosen answers' log-probs are collapsing",
            (f"the chosen answers' log-prob is {drift:+.2f} nats from where it started at step {last.step}"
             + (" (length-averaged, a token)" if limit == CHOSEN_COLLAPSE_PER_TOKEN else " (summed over an answer)")
             + f"; the rejected answers' {_num(last.rejected_drift)}",
             "the margin may still widen while the model forgets how to say the chosen answers"),
            set_line(values) + (" (an SFT term on the chosen answers holds them up)" if "train.pref_sft_weight"
                                in values else ""),
            values, ctx.apply_command(values), also=(set_line({"train.lr": p.train.lr / 3}) + " (smaller steps)",),
            step=last.step, data={"chosen_drift": drift}))
    elif spec.reference_margin and last.chosen_reward is not None and last.rejected_reward is not None \
            and last.chosen_reward < 0 and last.rejected_reward < 0 and (last.margin or 0) > 0:
        values = {"train.pref_sft_weight": 0.5}
        out.append(Finding(
            "preference", "preference.both_rewards_fall", "low",
            "both rewards fall: expected under DPO, which widens the margin between them",
            (f"at step {last.step}: chosen reward {last.chosen_reward:+.3f}, rejected {last.rejected_reward:+.3f}, "
             f"margin {last.margin:+.3f}, accuracy {last.accuracy if last.accuracy is not None else float('nan'):.0%}",
             "DPO only asks the chosen answer to gain on the rejected one; both may lose probability to other "
             "answers. If the chosen answers fall far, an SFT term holds them up"),
            set_line(values), values, ctx.apply_command(values), step=last.step,
            data={"chosen_reward": last.chosen_reward, "rejected_reward": last.rejected_reward}))
    return out
