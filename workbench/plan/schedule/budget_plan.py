"""A time budget's plan: what ``train.time_budget`` buys at a speed (its evals, its steps, its warmup), and whether
it buys a complete run. The horizon that follows the budget as it is spent is :mod:`workbench.plan.schedule.horizon`.

A budget's run is complete whatever its length (:func:`plan_budget`, decided here for the estimate, the CLI's
first line, ``sweep`` and the trainer alike): its evals (the step-0 eval, the evals on the way and the last one)
are sized so that together they take at most ``EVAL_SHARE`` of the budget at the measured speed, fewer eval
batches before fewer evals; the evals on the way fall at even shares of the budget (25/50/75 % with three, the
sweep pruner's rungs); its warmup is at most ``WARMUP_SHARE`` of the steps the budget buys; a budget that cannot
buy ``MIN_BUDGET_STEPS`` steps after its evals is refused before anything starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.config import Preset, eval_share_list
from workbench.config.objectives import objective_spec
from workbench.fmt import duration
from workbench.plan.schedule.evals import eval_batches

# A budget's evals (step 0, on the way, the last), together, take at most this share of it (plan_budget).
EVAL_SHARE = 0.10
# A budget's warmup is at most this share of the steps it buys (the preset's warmup_iters when that is fewer).
WARMUP_SHARE = 0.10
# Fewer steps than this after the evals is not a run (warmup, the peak rate, a decay): refused before it starts.
MIN_BUDGET_STEPS = 10
# Evals on the way a budget pays for when it can (more when the steps bought pass more eval_intervals): three
# give the loss curve a middle and the sweep pruner its rungs at 25, 50 and 75 % of the budget.
MIN_EVALS_ON_THE_WAY = 3
# A training step's seconds as forward passes of an eval batch (forward + backward ~3x, the optimizer the rest):
# the step's time when nothing else estimates it (no run measured here, no peak known) but an eval batch was timed.
STEP_PER_EVAL_BATCH = 3.5
# GRPO (train.objective = grpo): its eval is the held-out prompts' reward, ``grpo_group`` completions of each of at
# most this many of them (a budget's plan scores fewer when their rollouts would take more than its evals' share).
GRPO_EVAL_PROMPTS = 32
# A GRPO step's seconds as rollouts of one held-out prompt (G completions) a prompt of the step: its own rollout of
# each, then the policy-gradient forward and backward on them (and the reference's forward), which on this CPU took
# 0.2-0.6 of the rollout for 6-64 new tokens. Only a first guess: the run's own pace takes over within seconds.
GRPO_STEP_PER_ROLLOUT = 1.5


def samples(p: Preset) -> bool:
    """Whether ``p``'s run samples its own answers (GRPO): its step includes a rollout, its eval is a reward."""
    return objective_spec(p.train.objective).samples


def step_measured(basis: str | None) -> bool:
    """Whether a speed of that basis (plan.report's tokens_per_s_basis) times a step as the run takes it: measured
    on a run of the same preset, model and objective (a GRPO run's, rollout included) or given; not the hardware's
    estimate, which counts a training step's matmuls and knows nothing of a GRPO step's generation."""
    return basis is not None and (basis.startswith("measured") or basis == "given")


def budget_warmup(preset_warmup: int, steps: int | None) -> int:
    """A budget's warmup: at most WARMUP_SHARE of the ``steps`` it buys, the preset's when that is fewer."""
    if steps is None:
        return preset_warmup
    return min(preset_warmup, max(1, round(WARMUP_SHARE * steps)))


@dataclass(frozen=True)
class BudgetPlan:
    """What a time budget buys at a speed: its evals sized to stay within EVAL_SHARE of it, the steps left, the
    warmup. ``problem``: why it cannot buy a complete run ("" when it can); ``warning``: what is off but runs
    (evals a set train.eval_iters makes dearer than the share)."""
    seconds: float
    eval_iters: int                # batches of train and of val each eval scores
    auto_iters: int                # what plan.evals asks for (the level's noise), before the budget's share
    evals_on_the_way: int          # evals between the step-0 and the last one (at even shares of the budget)
    eval_s: float | None           # all the evals' seconds by the estimate (None: speed unknown)
    steps: int | None              # the training steps the rest buys (None: speed unknown)
    warmup: int
    problem: str = ""
    warning: str = ""
    shares: tuple[float, ...] = ()  # train.eval_shares: where the evals on the way fall (else even shares)
    group: int = 0                  # GRPO: completions a held-out prompt (its evals score prompts, not batches)

    @property
    def evals(self) -> int:
        return 2 + self.evals_on_the_way

    def describe(self) -> str:
        """One line for train.log and the CLI: the steps, the warmup, the evals (and their share)."""
        steps = f"~{self.steps:,} steps by the estimate, " if self.steps is not None else ""
        if self.group and self.steps is None:  # a GRPO step (its rollout) is timed, not estimated
            steps = "the steps by the run's own pace (a GRPO step's rollout is timed as it starts), "
        return f"time budget {duration(self.seconds)}: {steps}warmup {self.warmup}; {self.evals_line()}"

    def evals_line(self) -> str:
        """Where the evals fall, their batches and their share of the budget."""
        n = self.evals_on_the_way
        shares = "/".join(f"{100 * s:.3g}" for s in self.shares) if self.shares else "/".join(
            f"{100 * (i + 1) / (n + 1):.0f}" for i in range(n))
        way = (f"at {shares} % and " if n <= 5 else f"{n} on the way (every {100 / (n + 1):.3g} % of it) and "
               if n else "")
        at = f"at step 0, {way}" if n else "at step 0 and "
        share = (f": ~{duration(self.eval_s)}, {self.eval_s / self.seconds:.0%} of the budget"
                 if self.eval_s is not None else "")
        if self.group:  # GRPO: the held-out prompts' reward
            cut = f" (of at most {self.auto_iters})" if self.eval_iters != self.auto_iters else ""
            what = (f"the reward of {self.eval_iters}{cut} held-out prompt{'' if self.eval_iters == 1 else 's'} x "
                    f"{self.group} completions each")
        else:
            cut = f" (auto asks {self.auto_iters})" if self.eval_iters != self.auto_iters else ""
            what = f"{self.eval_iters} batch{'' if self.eval_iters == 1 else 'es'} each{cut}"
        return f"evals {at}at the end, {what}{share} (at most {EVAL_SHARE:.0%})"


def plan_budget(p: Preset, seconds: float, step_s: float | None, batch_eval_s: float | None,
                val_tokens: int | None = None, held_prompts: int | None = None) -> BudgetPlan:
    """What ``seconds`` of budget buy for ``p`` at ``step_s`` a training step and ``batch_eval_s`` an eval batch's
    forward (the estimate's, or timed): eval batches as many as plan.evals asks for, fewer when the step-0 and last
    evals would take more than EVAL_SHARE (a set train.eval_iters is kept, with a warning when it is dearer);
    evals on the way at even shares as many as the rest of the share pays for (MIN_EVALS_ON_THE_WAY, or one an
    eval_interval of the steps bought), or at train.eval_shares, one each whatever they cost (a sweep's rungs);
    the steps the rest buys; the warmup a share of them.

    GRPO's (``samples``): its evals roll out held-out prompts (``held_prompts`` of them, at most
    GRPO_EVAL_PROMPTS), so ``batch_eval_s`` is one prompt's rollout (its G completions) and an eval's size is its
    prompts, sized the same way (train.eval_iters, which counts batches, is not read)."""
    t = p.train
    grpo = samples(p)
    group = t.grpo_group if grpo else 0
    if grpo:
        auto = min(GRPO_EVAL_PROMPTS, held_prompts if held_prompts is not None else GRPO_EVAL_PROMPTS)
        auto = max(1, auto)
    else:
        auto, _ = eval_batches(p, val_tokens)
    set_iters = 0 if grpo else t.eval_iters
    allowance = EVAL_SHARE * seconds
    fixed = eval_share_list(t.eval_shares)
    if batch_eval_s is None or step_s is None or batch_eval_s <= 0 or step_s <= 0:
        return BudgetPlan(seconds, auto, auto, len(fixed) if fixed else MIN_EVALS_ON_THE_WAY, None, None,
                          t.warmup_iters, shares=fixed, group=group)
    # one batch of train and one of val (GRPO: one held-out prompt's rollout)
    pair = batch_eval_s if grpo else 2 * batch_eval_s
    # as many batches as the level's noise asks for, with MIN_EVALS_ON_THE_WAY on the way; fewer evals on the way
    # before fewer than one batch (the shares set: that many on the way, one batch at least when the first and
    # last fit)
    for n in [len(fixed)] if fixed else range(MIN_EVALS_ON_THE_WAY, -1, -1):
        k = set_iters or min(auto, math.floor(allowance / ((2 + n) * pair)))
        if fixed and 2 * pair <= allowance:
            k = max(1, k)
        if k >= 1:
            break
    need = 2 * pair / EVAL_SHARE                  # the budget whose step-0 and last evals of one batch fit the share
    if k < 1:
        unit = (f"one held-out prompt's {group} completions take ~{pair:.2g} s here" if grpo else
                f"one batch of train and of val takes ~{pair:.2g} s here")
        return BudgetPlan(seconds, 0, auto, 0, 2 * pair, 0, 1, problem=(
            f"a {duration(seconds)} budget cannot pay for its first and last evals within {EVAL_SHARE:.0%} of it "
            f"({unit}): give at least {duration(math.ceil(need))}"), group=group)
    one = k * pair
    rough = (seconds - 2 * one) / step_s
    want = max(MIN_EVALS_ON_THE_WAY, int(rough // t.eval_interval))
    on_the_way = len(fixed) if fixed else max(0, min(want, math.floor(allowance / one) - 2))
    eval_s = (2 + on_the_way) * one
    steps = max(0, math.floor((seconds - eval_s) / step_s))
    warmup = budget_warmup(t.warmup_iters, steps)
    problem = warning = ""
    if steps < MIN_BUDGET_STEPS:
        more = math.ceil(MIN_BUDGET_STEPS * step_s + eval_s)
        problem = (f"a {duration(seconds)} budget buys ~{steps} steps here after its evals, fewer than the "
                   f"{MIN_BUDGET_STEPS} a run needs to warm up, train at its peak rate and decay: give at least "
                   f"{duration(more)}")
    elif eval_s > allowance and fixed and not set_iters:
        warning = (f"evals at train.eval_shares ({len(fixed)} on the way, {k} batch{'' if k == 1 else 'es'} each) take "
                   f"~{eval_s / seconds:.1%} of the budget, more than the {EVAL_SHARE:.0%} it keeps for them: give "
                   "fewer shares (a sweep's pruner rungs: its shares) or a longer budget")
    elif eval_s > allowance:
        fewer = max(1, math.floor(allowance / (2 * pair)))
        warning = (f"evals of train.eval_iters = {t.eval_iters} batches take ~{eval_s / seconds:.0%} of the budget, "
                   f"more than the {EVAL_SHARE:.0%} it keeps for them: set train.eval_iters=0 (sized to the budget) "
                   f"or {fewer}")
    return BudgetPlan(seconds, k, auto, on_the_way, eval_s, steps, warmup, problem, warning, fixed, group)


# A budget is refused before it starts only when it would be too short at this many times the estimated speed: the
# estimate (a matmul rate at an assumed efficiency, or a run measured beside other processes) was 1.5-4x slow for
# cpu-small's evals on this CPU (an eval batch estimated at 0.21 s took 0.135 s; a rate calibrated under load, 4x),
# and the trainer sizes the evals from a batch it times; short at the estimate alone is a warning.
ESTIMATE_SLACK = 2.0


def budget_too_short_at_best(p: Preset, tokens_per_s: float | None, basis: str | None = None) -> bool:
    """Whether ``p``'s budget cannot buy a complete run even at ESTIMATE_SLACK times ``tokens_per_s``."""
    plan = budget_plan_at(p, tokens_per_s * ESTIMATE_SLACK if tokens_per_s else None, basis=basis)
    return bool(plan and plan.problem)


def budget_plan_at(p: Preset, tokens_per_s: float | None, seconds: float | None = None,
                   val_tokens: int | None = None, basis: str | None = None,
                   held_prompts: int | None = None) -> BudgetPlan | None:
    """The plan of ``p``'s budget (or ``seconds`` of one) at an estimated ``tokens_per_s``: a step's tokens at that
    rate, an eval batch's forward at a third of a step's work a token. None without a budget.

    GRPO: only a speed measured on a GRPO run (``basis``: plan.report's, ``step_measured``) times its step, rollout
    included; its eval's rollout of a held-out prompt is taken as a step's rollout of one of its prompts. The
    hardware's estimate gives no steps (the run times its rollouts as it starts), only the evals' plan, sized for
    ``held_prompts`` held-out prompts when the prompts file says how many."""
    seconds = p.train.time_budget_s if seconds is None else seconds
    if seconds is None:
        return None
    if samples(p):
        if not tokens_per_s or not step_measured(basis):
            return plan_budget(p, seconds, None, None, held_prompts=held_prompts)
        step_s = p.tokens_per_step() / tokens_per_s
        prompts = p.train.batch_size * p.train.grad_accum
        return plan_budget(p, seconds, step_s, step_s / (prompts * GRPO_STEP_PER_ROLLOUT), held_prompts=held_prompts)
    if not tokens_per_s:
        return plan_budget(p, seconds, None, None)
    return plan_budget(p, seconds, p.tokens_per_step() / tokens_per_s,
                       p.train.batch_size * p.model.seq_len / (3.0 * tokens_per_s))
