"""The training loop: one readable loop, in the spirit of nanoGPT's.

``python -m workbench.train RUN_DIR [--resume [--checkpoint SEL]]`` runs it on a run directory
whose ``preset.toml`` the launcher wrote. Everything it reports goes into the run directory
(see :mod:`workbench.rundir`). What it runs on is decided before it starts, in one place
(:func:`workbench.plan.settings.resolve_settings`); what it builds is in ``build``; the trainer's parts and
their setup are in ``start`` (:class:`~workbench.train.start.TrainerParts`), what it does with a batch of any
kind of data in ``batches``.

One iteration (the order matters for exact resume):
    lr for this step -> grad_accum micro-batches forward/backward -> unscale + clip ->
    finite check (skip the update if not) -> optimizer step -> step += 1 -> log ->
    eval (+ sample) -> checkpoint -> stop request?
The finite check runs on the host (the loss is copied to the CPU before the update) or, on a GPU
with fused AdamW, inside the optimizer's kernel; then the loop reads each step's loss one step
later, and at once before a log line, an eval, a checkpoint or a stop (``workbench.train.skips``).
A checkpoint is taken after all of that, so the state it holds is exactly the state the next
iteration starts from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import signal
import time

import torch

from workbench import rundir
from workbench.data.train_data import Batch, Sampler, step_targets
from workbench.errors import WorkbenchError
from workbench.plan.sampling import TEXT
from workbench.reward import RewardError
from workbench.rundir import EvalRecord, TrainRecord
from workbench.train import runtime
from workbench.train.batches import batch_loss, on_device
from workbench.train.budget_steps import BudgetSteps
from workbench.train.evaluation import EvalBatches, evaluate, per_source
from workbench.train.generate import generate_text
from workbench.train.grpo_run import reward_summary
from workbench.train.reporter import failure_message, preference_summary


class TrainError(WorkbenchError):
    """The run failed: exit 1; bad input found as it starts, before a step is trained (a corrupt precomputed
    reference), keeps its own exit code (2): most bad input is caught before a run starts."""
    exit_code = 1

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


ROLLBACK_LR_FACTOR = 0.5
MAX_ROLLBACKS = 2


class Trainer(BudgetSteps):
    """The loop over a run's steps (its parts and their setup: ``TrainerParts``)."""

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: give up waiting
        self.stop_requested = True
        self.report.log(f"received {signal.Signals(signum).name}: finishing this step, saving a checkpoint, "
                        "then stopping")

    # ------------------------------------------------------------------ the loop

    def train(self) -> str:
        t = self.preset.train
        self.built.model.train()
        self.report.status(state="running", compiling=self.settings.compile, step=self.state.step)
        if self.state.step == 0 and not self.resume:
            self.size_evals()  # a time budget's: to its share of it
            # the budget pays for its step-0 eval (GRPO's: the held-out prompts' reward, not a loss)
            self.budget.pay_first_eval(self.evaluate_reward() if self.grpo is not None else self.first_eval())
        self.throughput.reset()
        if not self.settings.compile:
            # nothing to compile: a budget's clock runs from the first step on (with a compile, from its end: a
            # first step of 8 s on a busy CPU was left out of a 20 s budget)
            self.budget.start(time.time(), self.state.step)
        self.first_step = self.state.step + 1  # this process's first step is logged whatever log_interval says
        while not self.horizon.is_end(self.state.step):
            self.train_step()
            self.budget_tick()
            if self.settle_due(self.state.step):
                self.skips.settle()
            if self.skips.rollback_due:
                self.rollback_or_fail()
                self.throughput.reset()
                continue
            now = time.time()
            data_s, self.data_s = self.data_s, 0.0
            if self.throughput.tick(self.tokens_per_step, now, data_s) and self.settings.compile \
                    and not self.compile_reported:
                self.compile_reported = True
                self.report.event("compile_done", self.state.step, seconds=round(now - self.started, 1),
                                  cache=runtime.compile_cache_counts())
                self.report.status(compiling=False)
            if self.state.step % t.log_interval == 0 or self.horizon.is_end(self.state.step) \
                    or self.state.step == self.first_step:
                r = self.skips.result  # this step's: settled above
                self.log_step(r.lr, r.loss if r.finite else None, r.grad_norm, now)
            self.faults.after_step(self.state.step)
            # Before any checkpoint of this step: a checkpoint on disk always has its task records.
            scored = self.maybe_score_tasks()
            evaluated, saved, early_stop = self.maybe_evaluate()
            if early_stop:
                return "early_stopped"
            saved = saved or self.maybe_save()
            if self.stop_agreed if self.dist.enabled else self.stop_requested:
                if not saved:
                    self.maybe_save(reason="stop")
                self.report.event("stop", self.state.step)
                return "stopped"
            if evaluated or saved or scored:
                self.throughput.start(time.time())  # leave eval and save time out of the rate
        self.mixture_realized()
        return "finished"

    def first_eval(self) -> float:
        """The step-0 eval of a new run (and its task scores), recorded; its seconds."""
        ev = self.evaluate()
        self.report.record(ev)
        self.report.log(f"step 0: train loss {ev.train_loss:.4f}, val loss {ev.val_loss:.4f} "
                        f"({ev.val_bpb:.3f} bits/byte){per_source(ev)}")
        self.maybe_score_tasks()
        return ev.seconds

    def train_step(self) -> None:
        """One optimizer step. With the host check its result is known when this returns (in
        ``self.skips``); with the device check the GPU decides whether to apply the update, and the
        result is read a step later (or by ``self.skips.settle``), so the CPU never waits for the GPU here."""
        b, st = self.built, self.state
        factor = self.horizon.lr_factor(st.step) * st.lr_scale
        b.optimizer.set_lr(factor)  # every group at the same share of its own peak
        lr = self.preset.train.lr * factor
        if self.objective is not None:  # a preference run's checks need to know where the run is
            self.objective.at_step(st.step, lr, fresh=not self.resume)
        loss_sum = self.forward_backward(poison=self.faults.poison_step(st.step + 1))
        b.optimizer.unscale_(b.scaler)
        params = b.model.parameters()
        if self.preset.train.grad_clip > 0:
            grad_norm = b.optimizer.clip_grad_norm_(params, self.preset.train.grad_clip)
        else:
            grad_norm = torch.linalg.vector_norm(torch.stack([q.grad.detach().norm() for q in params
                                                              if q.grad is not None]))
        if self.settings.nonfinite_check == "device":
            bad = ~(torch.isfinite(loss_sum) & torch.isfinite(grad_norm))
            b.optimizer.step_unless(bad)  # the kernel skips a non-finite update, step count included
            b.optimizer.zero_grad(set_to_none=True)
            self.count_step()
            self.skips.queue(st.step, lr, loss_sum, grad_norm, bad)
            return
        # The host check: one sync per step, to know before the update. Under DDP the same sync averages the
        # loss over ranks and agrees on a stop request.
        if self.dist.enabled:
            vec = self.dist.sum_(torch.stack([loss_sum.float(), torch.tensor(float(self.stop_requested),
                                                                             device=self.device)]))
            loss_val = vec[0].item() / self.dist.world
            self.stop_agreed = bool(vec[1].item() > 0)
        else:
            loss_val = loss_sum.item()
        gn = float(grad_norm)
        finite = math.isfinite(loss_val) and (math.isfinite(gn) or self.settings.grad_scaler)
        if finite:
            b.optimizer.step(b.scaler)
        if finite or self.settings.grad_scaler:
            b.scaler.update()
        b.optimizer.zero_grad(set_to_none=True)
        self.count_step()
        self.skips.record(st.step, lr, loss_val, gn, finite)

    def forward_backward(self, poison: bool = False) -> torch.Tensor:
        """The step's ``train.grad_accum`` micro-batches forward and backward; their loss, summed (``poison``: a
        test's non-finite loss)."""
        t, b = self.preset.train, self.built
        loss_sum = torch.zeros((), device=self.device)
        t_data = time.perf_counter()
        batches = [self.sampler.next_batch() for _ in range(t.grad_accum)]
        if self.grpo is not None:  # GRPO: the prompts' rollouts, scored, and one policy-gradient loss (grpo_run)
            return self.grpo.forward_backward(b, batches, self.state.step, self.autocast, poison, self.dist)
        # masked targets (chat): the loss is the mean over the trained targets of the whole step (every micro-batch
        # and rank: all ranks draw the global batch), so each token weighs the same however ragged the masks are
        per_step = step_targets(batches, self.dist.world)
        self.data_s += time.perf_counter() - t_data
        for micro in range(t.grad_accum):
            t_data = time.perf_counter()
            mb = self.to_device(batches[micro])
            self.data_s += time.perf_counter() - t_data
            self.faults.trained_rows(self.state.step + 1, micro, self.dist.rank, mb.inputs)
            last = micro == t.grad_accum - 1
            # DDP all-reduces gradients once, on the last micro-batch; FSDP2 likewise reduce-scatters only then.
            if self.settings.parallel == "fsdp":
                b.model.set_requires_gradient_sync(last)
            no_sync = self.settings.parallel == "ddp" and not last
            with b.train_forward.no_sync() if no_sync else contextlib.nullcontext():
                with self.autocast:  # drop the logits now: they would live through backward
                    loss = batch_loss(b.train_forward, mb, per_step, self.objective)
                if poison:
                    loss = loss * float("nan")
                if per_step is None:
                    loss = loss / t.grad_accum
                b.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        return loss_sum

    def count_step(self) -> None:
        self.state.step += 1
        self.state.tokens_seen += self.tokens_per_step

    def eval_due(self, step: int) -> bool:
        """Whether ``step`` is followed by an eval: the run's last; on a budget, the shares of it its plan chose
        (``budget_tick`` told the horizon); counted in steps, every eval_interval and at train.eval_shares of them."""
        return self.horizon.eval_after(step, self.preset.train.eval_interval)

    def settle_due(self, step: int) -> bool:
        t = self.preset.train
        return (step % t.log_interval == 0 or step == self.first_step or self.horizon.is_end(step)
                or self.eval_due(step) or self.checkpointer.due(step) is not None or self.stop_requested)

    def log_step(self, lr: float, loss: float | None, gn: float, now: float) -> None:
        st, max_iters = self.state, self.horizon.end_step
        tps = self.throughput.rate(now)
        mem, detail = runtime.memory_mb(self.device)
        # peak is one process's (one GPU, or the CPU share it measured); tps is global.
        peak = self.settings.peak_flops * self.dist.world if self.settings.peak_flops else None
        self.report.record(TrainRecord(
            step=st.step, loss=loss, lr=lr, grad_norm=gn if math.isfinite(gn) else None, tokens_per_s=tps,
            tokens_seen=st.tokens_seen, elapsed_s=round(self.elapsed(), 3), skipped=st.skipped_total, time=now,
            mem_mb=mem, mfu=tps * self.flops_per_token / peak if tps and peak else None, memory=detail,
            data_fraction=self.throughput.data_fraction(now)))
        self.report.status(step=st.step, tokens_seen=st.tokens_seen, **self.budget_status(now))
        shown = loss if loss is not None else float("nan")
        pref = self.objective.take(st.step, now=now) if self.objective is not None else None
        rew = self.grpo.take(st.step, now=now) if self.grpo is not None else None
        for rec in (pref, rew):
            if rec is not None:
                self.report.record(rec)
        self.report.log(f"step {st.step}/{max_iters}: loss {shown:.4f}, lr {lr:.2e}, grad norm {gn:.3f}, "
                        f"{f'{tps:,.0f} tok/s' if tps else 'warming up'}, mem {mem:.0f} MB"
                        + (preference_summary(pref) if pref is not None else "")
                        + (reward_summary(rew) if rew is not None else ""))
        self.throughput.after_log(now)

    def maybe_evaluate(self) -> tuple[bool, bool, bool]:
        """At an eval step: the losses, the best so far, a sample, a checkpoint if it is the best or
        due, early stopping. Returns (evaluated, saved, early stop)."""
        t, st = self.preset.train, self.state
        if not self.eval_due(st.step):
            return False, False, False
        if self.grpo is not None:  # no val loss: no best checkpoint, no early stop by it
            began = time.time()
            self.evaluate_reward()
            saved = self.maybe_save()
            self.budget.took_last_eval(time.time() - began + (0.0 if saved else self.checkpointer.last_seconds))
            return True, saved, False
        began = time.time()
        ev = self.evaluate()
        self.report.record(ev)
        tl, vl = ev.train_loss, ev.val_loss
        improved = st.best_val is None or vl < st.best_val - t.min_delta
        self.report.log(f"step {st.step}: train loss {tl:.4f}, val loss {vl:.4f} ({ev.val_bpb:.3f} bits/byte)"
                        + (" (best)" if improved else "") + per_source(ev))
        if improved:
            st.best_val, st.bad_evals = vl, 0
            self.report.status(best_val_loss=vl)
        else:
            st.bad_evals += 1
        t0 = time.time()
        if self.horizon.sample_after(st.step):
            self.write_sample()
        self.state.eval_s += time.time() - t0  # an eval's sample is part of its cost
        saved = self.maybe_save(vl, reason="best" if improved else None)
        # a budget keeps this for the run's end: the last eval comes with its sample and a checkpoint
        self.budget.took_last_eval(time.time() - began + (0.0 if saved else self.checkpointer.last_seconds))
        if t.patience and st.bad_evals >= t.patience:
            self.report.log(f"early stop: val loss has not improved for {t.patience} evals (best {st.best_val:.4f})")
            self.report.event("early_stop", st.step, best_val_loss=st.best_val)
            return True, saved, True
        return True, saved, False

    def maybe_save(self, val_loss: float | None = None, reason: str | None = None) -> bool:
        """A checkpoint of this step when one is due or ``reason`` is given (Checkpointer.maybe_save); its seconds
        count in the run's."""
        before = self.checkpointer.seconds
        saved = self.checkpointer.maybe_save(self.state.step, self.state_dict, self.skips.last_loss, val_loss,
                                             reason=reason)
        self.state.ckpt_s += self.checkpointer.seconds - before
        return saved

    def rollback_or_fail(self) -> None:
        """After train.max_skips non-finite steps in a row: back to the last checkpoint with half the
        learning rate, at most MAX_ROLLBACKS times; then fail with advice."""
        self.skips.settle()  # the step after the one that tipped it (device check) counts as well
        t, st = self.preset.train, self.state
        ckpts = self.dist.broadcast(rundir.list_checkpoints(self.run_dir) if self.dist.is_main else None)
        hint = "lower train.lr, use hardware.precision = bf16 or fp32 instead of fp16, or set train.grad_clip = 1.0"
        if not ckpts or st.rollbacks >= MAX_ROLLBACKS:
            why = "no checkpoint to roll back to" if not ckpts else f"{st.rollbacks} rollbacks did not help"
            raise TrainError(f"{t.max_skips} consecutive non-finite steps at step {st.step} ({why}); try: {hint}")
        kept = (st.lr_scale * ROLLBACK_LR_FACTOR, st.rollbacks + 1, st.skipped_total)
        from_step, to = st.step, ckpts[-1]["name"]
        self.load_state_dict(self._read_checkpoint(to))()
        self.state.lr_scale, self.state.rollbacks, self.state.skipped_total = kept
        self.skips.reset()
        self.report.event("rollback", self.state.step, from_step=from_step, to=to, lr_scale=kept[0])
        self.report.log(f"rolled back to {to} with learning rate x{kept[0]:g} after {t.max_skips} non-finite steps")

    # ------------------------------------------------------------------ evaluation and samples

    def evaluate(self) -> EvalRecord:
        """The eval record of this step, with its seconds and the run's time totals (the first eval of a process
        draws the fixed batches every eval scores, and keeps them on the device)."""
        t0 = time.time()
        share = self.horizon.share
        self.faults.in_eval(self.state.step)
        if self.eval_batches is None:
            self.eval_batches = EvalBatches.draw(self.preset, self.data, self.eval_iters, self.token_bytes,
                                                 self.device, self.next_batch)
        ev = evaluate(self.built.model, self.eval_batches, self.dist, self.autocast, self.state.step, self.objective)
        now = time.time()
        for pref in ev.extra.pop("preference", []):  # an eval's preference records, beside its losses
            self.report.record(pref)
        self.state.eval_s += now - t0
        if self.state.step > 0:  # (step 0's also draws the batches)
            self.slowest_eval = max(self.slowest_eval, now - t0)
        return dataclasses.replace(ev, seconds=round(now - t0, 3), budget_share=share, **self.time_spent())

    def evaluate_reward(self) -> float:
        """A GRPO run's eval: the held-out prompts' reward (GRPORun.evaluate; a time budget's: as many prompts as
        its plan chose), its seconds counted as an eval's and returned."""
        t0 = time.time()
        self.faults.in_eval(self.state.step)
        rec, line = self.grpo.evaluate(self.built.model, self.state.step, self.horizon.eval_iters)
        if rec is not None:
            self.report.record(rec)
        self.report.log(line)
        seconds = time.time() - t0
        self.state.eval_s += seconds
        if self.state.step > 0:
            self.slowest_eval = max(self.slowest_eval, seconds)
        return seconds

    def time_spent(self) -> dict[str, float]:
        """The run's wall-clock so far and its seconds in evals and in checkpoint saves (rundir.TIME_KEYS)."""
        return {"elapsed_s": round(self.elapsed(), 3), "eval_s": round(self.state.eval_s, 3),
                "ckpt_s": round(self.state.ckpt_s, 3)}

    def maybe_score_tasks(self) -> bool:
        """Score ``train.eval_tasks`` when due (rank 0; see TaskScorer); True when it scored."""
        if not self.tasks.due(self.state.step):
            return False
        if self.dist.is_main:
            records, line = self.tasks.score(self.state.step, self.built.model, self.data.tokenizer, self.device,
                                             self.autocast, runtime.amp_dtype(self.settings),
                                             self.data.template)
            for rec in records:
                self.report.record(rec)
            self.report.log(line)
        return True

    def write_sample(self) -> None:
        t = self.preset.train
        # Sharded, each forward is a collective: every rank generates (the same number of forwards), rank 0 writes.
        if not t.sample_prompt or not (self.dist.is_main or self.settings.parallel == "fsdp"):
            return
        # the one set of sampling defaults (plan.sampling), seeded by the step: each eval's sample is its own
        how = TEXT.replace(seed=self.state.step).generate_args()
        text = generate_text(self.built.model, self.data.tokenizer, t.sample_prompt, t.sample_tokens, **how,
                             autocast_dtype=runtime.amp_dtype(self.settings))
        self.built.model.train()
        if self.dist.is_main:
            self.report.sample(self.state.step, t.sample_prompt, text)

    def next_batch(self, sampler: Sampler) -> Batch[torch.Tensor]:
        """This rank's part of ``sampler``'s next global batch (all of it in a single process), on the device."""
        return self.to_device(sampler.next_batch())

    def to_device(self, batch: Batch) -> Batch[torch.Tensor]:
        """This rank's part of a global batch, on the device."""
        rows = self.settings.micro_batch if self.dist.enabled else None
        return on_device(batch, self.device, self.dist.rank, rows, flex=self.settings.attention_kernel == "flex")

    # ------------------------------------------------------------------ entry

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        starting = True
        try:
            self.setup()
            starting = False
            state = self.train()
            self.report.event("finish" if state == "finished" else state, self.state.step, **self.time_spent())
            self.report.status(state=state, step=self.state.step, compiling=False, finished=time.time(),
                               **self.budget_status(time.time()),
                               ckpt_seconds=round(self.checkpointer.seconds, 3), best_val_loss=self.state.best_val)
            self.report.log(f"{state} at step {self.state.step}" + (
                f", best val loss {self.state.best_val:.4f}" if self.state.best_val is not None else "") + (
                f", held-out reward {self.grpo.last_reward:.4f}" if self.grpo and self.grpo.last_reward is not None
                else ""))
            self.clean_exit = True
            return 0
        except BaseException as e:  # noqa: BLE001 - every failure must reach status.json
            msg = failure_message(e, preset=self.preset, settings=self.settings, device=str(self.device),
                                  report=self.report, rank=self.dist.rank if self.dist.enabled else None,
                                  run_name=self.run_dir.name)
            if self.lock:  # never touch the files of a run another trainer holds
                try:
                    rundir.write_status(self.run_dir, state="failed", error=msg, compiling=False, step=self.state.step)
                    self.report.event("error", self.state.step, message=msg)
                except OSError:
                    pass
                self.report.log(f"error: {msg}")
            # bad input (exit 2): found as it starts, or a reward that failed on a completion (its one line)
            bad_input = isinstance(e, WorkbenchError) and (starting or isinstance(e, RewardError))
            raise TrainError(msg, e.exit_code if bad_input else 1) from None
        finally:
            if self.lock:
                self.lock.release()
            self.report.close()
            if self.dist.enabled:
                # FSDP2's state and DDP's reducer hold the gloo/NCCL group: free them before the group is destroyed,
                # not at the interpreter's exit (where gloo at times aborts a rank: "terminate called ...")
                self.built = self.checkpointer = None
                gc.collect()
            self.dist.close(clean=self.clean_exit)
