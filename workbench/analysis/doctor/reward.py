"""GRPO runs (train.objective = grpo), from their train ``reward`` records: reward hacking (the mean reward rising
while the KL to the reference or the completion length explodes), a collapse (the reward falling while the
completions grow), most groups without signal (every completion of
a prompt scored the same: every advantage 0, nothing to learn from; too easy or too hard, said from the mean), and
a reward that never moves. Every threshold below is a named constant with the reason for its value."""

from __future__ import annotations

from statistics import fmean
from typing import Any

from workbench.analysis.doctor.facts import Context
from workbench.analysis.doctor.finding import Finding, percent, set_line
from workbench.rundir import RewardRecord

# Logged steps a judgement needs: the first few of any GRPO run are a handful of groups, as noisy as one batch.
MIN_RECORDS = 8
# The early and the late window (logged steps) compared for "rising" and "exploding": the first and the last 4.
WINDOW = 4
# "The reward rose": the late window's mean above the early one's by a quarter of the early spread of rewards
# within a step (sd over the completions), or REWARD_RISE_MIN where that spread is 0 — a move no run makes by
# sampling noise over 4 logged steps of a batch of groups, and one every run that learns makes.
REWARD_RISE_SD, REWARD_RISE_MIN = 0.25, 0.01
# "KL exploded": the late window's k3 KL to the reference above 0.5 nats a token. Runs that follow the reference
# (DeepSeekMath and TRL at beta 0.04) stay under ~0.1; 0.5 a token is ~30 nats over a 64-token completion: text
# the model it started from would all but never write, the mark of a policy paid for a loophole, not the task.
KL_EXPLODES = 0.5
# "Length exploded": the late completions at least twice as long as the early ones, and 4 tokens longer (1 -> 2
# tokens is not an explosion): a reward that pays for length, or rambling it does not punish (Dr. GRPO's length
# bias under the per-completion mean).
LENGTH_GROWTH, LENGTH_GROWTH_MIN = 2.0, 4.0
# "Most groups without signal": above 80 % of groups all-equal in each of the last 5 logged steps. Then at most
# a fifth of the batch has a gradient: the step is mostly sampling for nothing.
NO_SIGNAL_SHARE, NO_SIGNAL_STEPS = 0.8, 5
# Too easy or too hard, from the mean reward of those steps on the 0..1 scale every built-in reward scores on:
# all-equal groups with a mean above a half are mostly all right, below it mostly all wrong.
EASY_ABOVE = 0.5
# "Never moves": past its first FLAT_SKIP logged steps, the last third's mean reward within a tenth of the
# within-step spread (floor FLAT_MIN) of the first third's. Learning shows as a shift of the mean by a good part of
# that spread (README: 0.09 -> 0.99 in 30 steps); a tenth of it is what sampling noise alone leaves.
FLAT_SKIP, FLAT_SD, FLAT_MIN = 2, 0.1, 1e-3


def _mean(recs: list[RewardRecord], key: str) -> float | None:
    xs = [v for r in recs if (v := getattr(r, key)) is not None]
    return fmean(xs) if xs else None


def _windows(recs: list[RewardRecord]) -> tuple[list[RewardRecord], list[RewardRecord], float | None, float | None,
                                                 float | None]:
    """The early and late WINDOW of logged steps, their mean rewards and the early within-step spread."""
    early, late = recs[:WINDOW], recs[-WINDOW:]
    return early, late, _mean(early, "reward"), _mean(late, "reward"), _mean(early, "reward_std")


def check(ctx: Context) -> list[Finding]:
    f, p = ctx.facts, ctx.facts.preset
    if p is None or not f.rewards_recent:
        return []
    first, recent = f.rewards_first, list(f.rewards_recent)
    everything = first + [r for r in recent if r.step > first[-1].step] if first else recent
    out = [*_hacking(ctx, everything)]
    collapse = _collapse(ctx, everything)
    if collapse:  # a policy pushed off its task: all-wrong groups and a flat reward follow from it, not the reward
        return out + collapse
    no_signal = _no_signal(ctx, everything)
    out += no_signal
    if not no_signal:  # all-equal groups explain a reward that cannot move; their finding names the fix
        out += _flat(ctx, everything)
    return out


def _collapse(ctx: Context, recs: list[RewardRecord]) -> list[Finding]:
    """The reward fell while the completions grew (LENGTH_GROWTH): steps too large for a fine-tune pushed the policy
    off what it could do (a walk's run at the preset's from-scratch rate: 0.23 -> 0, 5 -> 60 tokens)."""
    p = ctx.facts.preset
    assert p is not None
    if len(recs) < 2 * WINDOW:
        return []
    early, late, r0, r1, sd = _windows(recs)
    n0, n1 = _mean(early, "completion_len"), _mean(late, "completion_len")
    if r0 is None or r1 is None or n0 is None or n1 is None:
        return []
    if r0 - r1 <= max(REWARD_RISE_SD * (sd or 0.0), REWARD_RISE_MIN) or n1 < LENGTH_GROWTH * n0 \
            or n1 - n0 < LENGTH_GROWTH_MIN:
        return []
    values = {"train.lr": p.train.lr / 3}
    return [Finding(
        "reward", "reward.collapse", "high",
        f"the reward fell from {r0:.3f} to {r1:.3f} while completions grew {n1 / n0:.1f}x: the policy was pushed off "
        "its task",
        (f"mean reward {r0:.3f} over steps {early[0].step}-{early[-1].step}, {r1:.3f} over "
         f"{late[0].step}-{late[-1].step}; completions {n0:.1f} -> {n1:.1f} tokens",
         "steps too large for a fine-tune move the model away from the answers it could give: it rambles, and "
         "every completion of a prompt scores alike (no signal left to come back with)"),
        set_line(values) + " (smaller steps), from the run's start or a checkpoint before the fall", values,
        ctx.apply_command(values),
        also=(set_line({"train.grpo_beta": 0.04}) + " (a pull back to the starting model)",),
        step=late[-1].step, data={"reward_early": r0, "reward_late": r1, "len_early": n0, "len_late": n1})]


def _hacking(ctx: Context, recs: list[RewardRecord]) -> list[Finding]:
    p = ctx.facts.preset
    assert p is not None
    if len(recs) < 2 * WINDOW:
        return []
    early, late, r0, r1, sd = _windows(recs)
    if r0 is None or r1 is None or r1 - r0 <= max(REWARD_RISE_SD * (sd or 0.0), REWARD_RISE_MIN):
        return []
    rose = f"the mean reward rose from {r0:.3f} to {r1:.3f} (steps {early[0].step}-{late[-1].step})"
    out = []
    kl = _mean(late, "kl")
    if kl is not None and kl > KL_EXPLODES:
        beta, lr = p.train.grpo_beta, p.train.lr
        values: dict[str, Any] = {"train.grpo_beta": round(max(beta * 2.5, 0.04), 6)}
        out.append(Finding(
            "reward", "reward.hacking_kl", "high",
            f"reward hacking? the reward rises while KL to the reference explodes ({kl:.2f} nats a token)",
            (f"{rose} while the KL to the reference reached {kl:.3f} nats a token (over {KL_EXPLODES}: text the "
             f"starting model would all but never write)",
             "read the completions before trusting the reward: a reward with a loophole pays for what it should not"),
            set_line(values) + " (a stronger pull back to the reference)", values, ctx.apply_command(values),
            also=(set_line({"train.lr": lr / 3}) + " (smaller steps)",
                  "a reward that checks more than it does now (the answer, not a marker of it)"),
            step=late[-1].step, data={"reward_early": r0, "reward_late": r1, "kl": kl}))
    n0, n1 = _mean(early, "completion_len"), _mean(late, "completion_len")
    if n0 is not None and n1 is not None and n1 >= LENGTH_GROWTH * n0 and n1 - n0 >= LENGTH_GROWTH_MIN:
        t = p.train
        values = ({"train.grpo_loss": "dapo"} if t.grpo_loss == "grpo" else
                  {"train.grpo_max_new_tokens": max(1, round(n0 * 1.5))})
        why = (" (each completion's mean favours long completions: dapo's mean over tokens does not)"
               if t.grpo_loss == "grpo" else " (completions as long as they were, with room)")
        out.append(Finding(
            "reward", "reward.hacking_length", "high",
            f"reward hacking? the reward rises while completions grow {n1 / n0:.1f}x longer",
            (f"{rose} while the completions grew from {n0:.1f} to {n1:.1f} tokens (over {LENGTH_GROWTH:g}x)",
             "a reward that pays for length, or does not punish rambling, is paid for length, not the task"),
            set_line(values) + why, values, ctx.apply_command(values),
            also=("a reward that pays for the answer and not its length (the `length` built-in with a target "
                  "holds completions to it)",),
            step=late[-1].step, data={"reward_early": r0, "reward_late": r1, "len_early": n0, "len_late": n1}))
    return out


def _no_signal(ctx: Context, recs: list[RewardRecord]) -> list[Finding]:
    p = ctx.facts.preset
    assert p is not None
    last = recs[-NO_SIGNAL_STEPS:]
    if len(recs) < MIN_RECORDS or any(r.no_signal is None or r.no_signal <= NO_SIGNAL_SHARE for r in last):
        return []
    share, reward = _mean(last, "no_signal") or 0.0, _mean(last, "reward")
    steps = f"steps {last[0].step}-{last[-1].step}"
    evidence = f"{percent(share)} of groups scored all the same in the last {len(last)} logged steps ({steps})"
    data = {"no_signal": share, "reward": reward, "records": len(last)}
    if reward is not None and 0 <= reward <= 1 and reward > EASY_ABOVE:
        return [Finding(
            "reward", "reward.too_easy", "low",
            f"{percent(share)} of groups have no signal: the reward is too easy now (mean {reward:.2f})",
            (evidence, f"mean reward {reward:.3f}: most completions of most prompts score the most they can, so "
                       "every advantage is 0 and the steps teach nothing"),
            "the run has learned what this reward asks: stop it here, or train on harder prompts or with a "
            "stricter reward", {}, "", step=last[-1].step, data=data)]
    group = p.train.grpo_group
    values = {"train.grpo_group": group * 2}
    hard = reward is not None and 0 <= reward <= 1
    title = (f"{percent(share)} of groups have no signal: the reward is too hard (mean {reward:.2f})" if hard else
             f"{percent(share)} of groups have no signal (mean reward {reward if reward is not None else 0:.3g})")
    return [Finding(
        "reward", "reward.too_hard" if hard else "reward.no_signal", "medium", title,
        (evidence, "every completion of a prompt wrong alike: every advantage is 0 and the steps teach nothing"
         if hard else "every advantage 0: the steps teach nothing (a reward off the 0..1 scale: too easy or too "
                      "hard is not told from its mean)"),
        set_line(values) + f" (twice the completions a prompt: more chances that one of {group * 2} scores)",
        values, ctx.apply_command(values),
        also=("a graded reward (partial credit: `length`, `lexicon`, or your own FILE.py:FUNCTION) in place of a "
              "pass/fail one", "start from a model tuned further on the task (SFT), which gets some of them right"),
        step=last[-1].step, data=data)]


def _flat(ctx: Context, recs: list[RewardRecord]) -> list[Finding]:
    p = ctx.facts.preset
    assert p is not None
    recs = recs[FLAT_SKIP:]
    if len(recs) < MIN_RECORDS:
        return []
    third = len(recs) // 3
    early, late = recs[:third], recs[-third:]
    r0, r1, sd = _mean(early, "reward"), _mean(late, "reward"), _mean(recs, "reward_std")
    if r0 is None or r1 is None or abs(r1 - r0) >= max(FLAT_SD * (sd or 0.0), FLAT_MIN):
        return []
    values = {"train.lr": p.train.lr * 3}
    return [Finding(
        "reward", "reward.flat", "medium", f"the reward never moves (mean {r1:.3f} since step {recs[0].step})",
        (f"mean reward {r0:.3f} over steps {early[0].step}-{early[-1].step} and {r1:.3f} over "
         f"{late[0].step}-{late[-1].step}: within {FLAT_SD:g} of its spread within a step (sd {sd or 0:.3f})",
         "the updates do not change what the model samples, or the reward does not tell its samples apart"),
        set_line(values) + " (larger steps)", values, ctx.apply_command(values),
        also=(set_line({"train.grpo_group": p.train.grpo_group * 2}) + " (more completions a prompt)",
              "check that the reward tells the model's samples apart: `workbench eval RUN --reward R --prompts FILE "
              "--samples 8` reports its spread"),
        step=recs[-1].step, data={"reward_early": r0, "reward_late": r1, "reward_std": sd})]
