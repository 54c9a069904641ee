"""The trainer's time budget, step by step: its evals sized to the budget before the step-0 eval, the clock read
after every step (the share spent, the step it now ends at, whether an eval on the way is due and still fits its
share), and what status.json says of it. The budget's arithmetic is ``workbench.train.budget`` and the plan
``workbench.plan.schedule.horizon``; this is the trainer's side of them (``workbench.train.loop.Trainer`` runs it)."""

from __future__ import annotations

import dataclasses
import time

from workbench.data.text.prepare import DataError
from workbench.plan.cost import eval_seconds
from workbench.plan.schedule.budget_plan import EVAL_SHARE, GRPO_STEP_PER_ROLLOUT, STEP_PER_EVAL_BATCH, plan_budget
from workbench.train.budget import Budget
from workbench.train.evaluation import EvalBatches, time_eval_batch
from workbench.train.start import TrainerParts

# Steps before a budget's end (the plan's, or the moved one) within which a mixture follows every move of it.
MIXTURE_NEAR_STEPS = 16


class BudgetSteps(TrainerParts):
    """A budgeted run's steps: the loop calls these on every run, and on a run counted in steps they do nothing
    (its clock, ``StepCount``, measures nothing; its horizon's end is max_iters)."""

    evals_skipped = 0  # a budget's evals on the way skipped to keep their share (budget_eval_fits)
    slowest_eval = 0.0  # this process's slowest eval after step 0 (what budget_eval_fits expects the next to take)
    mixture_cap: int | None = None  # a mixture's plan: the last step that keeps every source within its max_repeat
    mixture_cap_why = ""    # ... which source, with the numbers
    mixture_capped = False  # ... and that step ends the run before the budget would (said once)

    def size_evals(self) -> None:
        """A new run's evals, before its step-0 eval: a time budget's sized to its share of it (a loss's or, for
        GRPO, the held-out prompts' reward); a run counted in steps keeps train.eval_iters."""
        if not isinstance(self.budget, Budget):
            return
        if self.grpo is not None:
            self.size_reward_evals()
        else:
            self.size_budget_evals()

    def size_budget_evals(self) -> None:
        """A new budgeted run's evals sized to its budget at this machine's speed now, before its step-0 eval: one
        eval batch's forward timed (rank 0's for every rank), the budget planned again with it (plan.schedule.horizon:
        the batches each eval scores, the evals on the way, the warmup), the horizon given the plan."""
        t, seconds = self.preset.train, self.budget.seconds
        one = EvalBatches.draw(self.preset, self.data, 1, self.token_bytes, self.device, self.next_batch)
        batch_s = self.dist.broadcast(time_eval_batch(self.built.model, one, self.autocast, self.objective))
        prior = self.budget.prior_rate
        step_s = 1.0 / prior if prior else STEP_PER_EVAL_BATCH * batch_s * t.grad_accum
        plan = plan_budget(self.preset, seconds, step_s, batch_s, self.data.split_tokens()[1])
        if plan.eval_iters < 1:  # too short (the CLI refused it unless --yes): one batch, no eval on the way
            self.report.log(f"warning: {plan.problem}; it goes on with evals of one batch")
            plan = dataclasses.replace(plan, eval_iters=1, evals_on_the_way=0)
        self.budget_plan, self.eval_iters = plan, plan.eval_iters
        self.horizon = self.horizon.planned(plan)
        self.report.log(f"an eval batch timed at {batch_s:.3g} s: warmup {plan.warmup}; {plan.evals_line()}")

    def size_reward_evals(self) -> None:
        """A new budgeted GRPO run's evals sized to its budget (``size_budget_evals``'s, for an eval that is the
        held-out prompts' reward): one held-out prompt's rollout timed (rank 0's for every rank), the budget planned
        with it (the held-out prompts each eval scores, the evals on the way, the warmup) and, when no GRPO run here
        measured its speed, the steps it buys from it (a step: GRPO_STEP_PER_ROLLOUT rollouts of one prompt a prompt
        of the step), the first guess the run's own pace replaces."""
        t, b = self.preset.train, self.budget
        one = self.dist.broadcast(self.grpo.time_one_prompt(self.built.model))
        prompts = t.batch_size * t.grad_accum // self.dist.world   # a rank rolls out its share of the step's
        step_s = 1.0 / b.prior_rate if b.prior_rate else GRPO_STEP_PER_ROLLOUT * one * prompts
        plan = plan_budget(self.preset, b.seconds, step_s, one or None, held_prompts=len(self.grpo.held))
        if not self.grpo.held:  # nothing to score: no evals on the way (the step-0 and last say so)
            self.budget_plan = dataclasses.replace(plan, eval_iters=1, evals_on_the_way=0)
            self.horizon = self.horizon.planned(self.budget_plan)
            self.report.log(f"time budget {b.seconds:g}s: no held-out prompts to score (a prompts file of one prompt),"
                            " so no evals on the way; the steps by the run's own pace")
            return
        if plan.eval_iters < 1:  # too short (the CLI refused it unless --yes): one prompt, no eval on the way
            self.report.log(f"warning: {plan.problem}; it goes on with evals of one held-out prompt")
            plan = dataclasses.replace(plan, eval_iters=1, evals_on_the_way=0)
        self.budget_plan = plan
        self.horizon = self.horizon.planned(plan)
        if not b.prior_rate and plan.steps:  # no measured speed: the timed rollout's guess, until the pace's
            b.prior_rate, b.first_guess = 1.0 / step_s, self.state.step + max(1, plan.steps)
            self.horizon = self.horizon.after_step(self.state.step, b.first_guess)
            self.report.status(max_iters=self.horizon.end_step)
        self.report.log(f"a held-out prompt's rollout ({t.grpo_group} completions) timed at {one:.3g} s: "
                        f"{plan.describe()}")

    def budget_tick(self) -> None:
        """After a step of a budgeted run: the budget's clock says how much of it is spent (on rank 0's clock for
        every rank) and the step it now ends at; the horizon takes both (the next step's learning rate, and with
        wsd where the decay began, which the checkpointer saves). Counted in steps: nothing to read."""
        t, st, b = self.preset.train, self.state, self.budget
        if not isinstance(b, Budget):
            return

        def eval_due(before: float, after: float) -> bool:
            """An eval on the way falls due: at the budget's shares its plan put them (a run started before
            budgets planned their evals: every eval_interval steps), unless it no longer fits their share."""
            nonlocal eval_next
            eval_next = (self.horizon.eval_between(before, after) if self.horizon.eval_iters
                         else st.step % t.eval_interval == 0)
            if eval_next and self.horizon.eval_iters and not self.horizon.eval_shares:
                eval_next = self.budget_eval_fits(st.step)
            return eval_next

        eval_next = False

        end = b.after_step(
            st.step, time.time(), clock_runs=not self.settings.compile or self.compile_reported,
            eval_due=eval_due,
            eval_estimate=(lambda rate: self.slowest_eval or b.first_eval or 0.0) if self.grpo is not None else
            (lambda rate: eval_seconds(self.preset, self.eval_iters, self.tokens_per_step * rate)),
            agree=self.dist.broadcast)
        end = self.within_repeats(end)  # a mixture's source past its max_repeat ends the run first
        self.horizon = self.horizon.after_step(st.step, end, b.agreed, b.step_share(st.step, time.time()),
                                               eval_next=eval_next)
        self.mixture_follows_budget()

    def mixture_follows_budget(self, say: bool = False) -> None:
        """A mixture (data.mixture) re-planned for the budget's end as it moves (its counts the apportionment of
        the steps the run ends at when the estimate before its last step was right, within one sequence at every
        step whatever it was; what was drawn is kept): far from the end only when the end moved by a fifth, within
        MIXTURE_NEAR_STEPS of it whenever it moves. Rank 0's end for every rank (they draw the same global batch).
        ``say``: log the plan's table (the start's re-plan)."""
        follow = getattr(self.sampler, "follow", None)
        if follow is None or self.horizon is None:
            return
        per_step = self.preset.train.batch_size * self.preset.train.grad_accum
        end = self.dist.broadcast(self.horizon.end_step) if self.dist.enabled else self.horizon.end_step
        horizon = end * per_step - self.sampler.base
        moved = self.sampler.replan(horizon) if say else follow(horizon, MIXTURE_NEAR_STEPS * per_step)
        if say and moved:
            self.report.log(f"time budget: the mixture planned for its first guess of {end:,} steps, re-planned as "
                            "that end moves (what was drawn is kept):")
            for line in self.data.table(self.sampler.plan):
                self.report.log(line)
        if say or moved:
            self.mixture_within_repeats(end, fresh=say and self.state.step == 0 and not self.resume)

    def mixture_within_repeats(self, end: int, fresh: bool) -> None:
        """A source's max_repeat over a budgeted mixture's plan (checked again whenever it is re-planned). A new
        run whose first guess at its steps repeats a source past it is refused before its first step (as
        `workbench train` refuses it, with the numbers); later, when the budget's end moves out so far that it
        would (a faster pace than estimated), the run ends at the last step that keeps every source within its
        max_repeat: the budget and the repeats are both limits, and the first reached ends the run (said once in
        train.log, with the numbers; the learning rate is then where the budget's schedule had it)."""
        from workbench.data.mixture.mixture_data import over_limit

        plan, per_step = self.sampler.plan, self.preset.train.batch_size * self.preset.train.grad_accum
        within = plan.within_repeats()
        if within is None:
            return
        if fresh and (refusal := over_limit(plan, self.preset, end)):
            raise DataError(refusal)
        at, s = within
        src = plan.sources[s]
        self.mixture_cap = self.state.step + (self.sampler.base + at - self.sampler.counter) // per_step
        self.mixture_cap_why = (f"a step more would repeat source {src.name!r} more than its max_repeat "
                                f"{src.max_repeat:g} (it holds {src.windows:,} sequences of {plan.seq_len} tokens)")
        self.horizon = self.horizon.ended_at(self.within_repeats(self.horizon.end_step))

    def within_repeats(self, end: int) -> int:
        """``end`` (where the budget ends the run), or the last step that keeps every source of a mixture within
        its max_repeat when that comes first (said once in train.log)."""
        if self.mixture_cap is None or self.mixture_cap >= end:
            return end
        cap = max(self.state.step, self.mixture_cap)  # past it already (a resume with a lower max_repeat): here
        if not self.mixture_capped:
            self.mixture_capped = True
            self.report.log(f"time budget: the run ends at step {cap:,}, before the budget's end (~{end:,} steps by "
                            f"its pace): {self.mixture_cap_why}; for a longer run add text to it, lower its weight or "
                            "raise its max_repeat")
        return cap

    def mixture_realized(self) -> None:
        """A budgeted mixture's end: the sequences each source gave, against the apportionment of the steps it
        trained (the same when the budget's end was foreseen a step before; within one sequence always)."""
        plan = getattr(self.sampler, "plan", None)
        if not self.horizon.budgeted or plan is None or not hasattr(plan, "drawn"):
            return
        from workbench.data.mixture.mixture_plan import apportion
        n = self.sampler.counter - self.sampler.base
        got, want = plan.drawn(n), apportion([s.weight for s in plan.sources], n)
        self.report.log(f"mixture realized over {n:,} sequences ({self.state.step:,} steps): " + ", ".join(
            f"{s.name} {g:,}" + ("" if g == w else f" (apportionment {w:,})")
            for s, g, w in zip(plan.sources, got, want)))

    def budget_eval_fits(self, step: int) -> bool:
        """Whether an eval on the way still fits the budget's share for evals with the last one after it, at the
        slowest eval's seconds so far (the plan timed one batch before the step-0 eval; a machine that got busier
        since makes them dearer: beside a CPU hog they took 10-12 % of the budget, and one eval took 2.1 s, the next
        3.3 s): one that does not is skipped, said once. Rank 0 decides for every rank. Evals at train.eval_shares
        (a sweep's rungs) are never skipped."""
        b = self.budget
        one = max(self.slowest_eval, b.last_eval or 0.0) or b.first_eval or 0.0
        fits = bool(self.dist.broadcast(self.state.eval_s + 2 * one <= EVAL_SHARE * b.seconds))
        if not fits:
            if not self.evals_skipped:
                self.report.log(f"step {step}: the evals on the way from here are skipped: evals took "
                                f"{self.state.eval_s:.1f} s of the budget's {EVAL_SHARE:.0%} "
                                f"({EVAL_SHARE * b.seconds:.1f} s) and one takes {one:.1f} s now")
            self.evals_skipped += 1
        return fits

    def budget_status(self, now: float) -> dict:
        return self.budget.status(self.horizon.end_step, now, self.horizon.warmup)
