"""The training loop: one readable loop, in the spirit of nanoGPT's.

``python -m workbench.train RUN_DIR [--resume [--checkpoint SEL]]`` runs it on a run directory
whose ``preset.toml`` the launcher wrote. Everything it reports goes into the run directory
(see :mod:`workbench.rundir`). What it runs on is decided before it starts, in one place
(:func:`workbench.plan.settings.resolve_settings`); what it builds is in ``build``.

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
import os
import random
import signal
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from workbench import rundir
from workbench.config import Preset, budget_seconds, load_preset_file
from workbench.data.chat_data import ChatData
from workbench.data.chat_templates import CHAT_TEMPLATE_FILE
from workbench.data.tokenizer import tokenizer_file
from workbench.data.tokens import TokenData, prepare_data
from workbench.errors import WorkbenchError
from workbench.faults import Faults
from workbench.fs import write_atomic
from workbench.machine.detect import Machine
from workbench.machine.probe import calibration_here, measured_peak, this_machine
from workbench.machine.rates import Calibration
from workbench.plan.cost import eval_seconds
from workbench.plan.evals import eval_batches
from workbench.plan.flops import flops_per_token
from workbench.plan.horizon import Horizon
from workbench.plan.settings import PeakFn, RunSettings, resolve_device, resolve_settings
from workbench.rundir import EvalRecord, TrainRecord
from workbench.train import runtime, stateful
from workbench.train.batches import Sampler, chat_facts, chat_line, new_sampler, split_tokens, trained_targets
from workbench.train.budget import Budget, first_guess
from workbench.train.build import Built, build
from workbench.train.checkpoint import Checkpoint, load_init_weights, read_checkpoint
from workbench.train.checkpointer import Checkpointer
from workbench.train.dist import Dist
from workbench.train.evaluation import EvalBatches, evaluate
from workbench.train.generate import generate_text
from workbench.train.reporter import Reporter, Throughput, failure_message, savers_line, start_line
from workbench.train.skips import Skips
from workbench.train.state import TrainerState
from workbench.train.task_eval import TaskScorer


class TrainError(WorkbenchError):
    exit_code = 1  # the run failed (bad input is caught before a run starts and exits 2)


ROLLBACK_LR_FACTOR = 0.5
MAX_ROLLBACKS = 2


def run_settings(p: Preset, machine: Machine, world_size: int, steps_done: int, peak: PeakFn) -> RunSettings:
    """What this trainer runs with: the preset's settings on this machine for the steps still to go
    (the compile rule weighs the rest of the run), with the peak FLOP/s measured here."""
    return resolve_settings(p, machine, world_size=world_size, steps_left=p.train.max_iters - steps_done, peak=peak)


class Trainer:
    def __init__(self, run_dir: Path, resume: bool = False, checkpoint: str | None = None, echo: bool = True,
                 machine: Machine | None = None):
        self.run_dir = Path(run_dir)
        self.resume, self.ckpt_selector = resume, checkpoint
        self.machine = machine                      # None: this machine as torch sees it
        self.dist = Dist()
        self.report = Reporter(self.run_dir, self.dist.is_main, echo)
        self.faults = Faults.from_env()             # test hooks, read once
        self.lock: rundir.RunLock | None = None
        self.preset: Preset | None = None
        self.settings: RunSettings | None = None
        self.device = torch.device("cpu")
        self.autocast: contextlib.AbstractContextManager = contextlib.nullcontext()
        self.data: TokenData | ChatData | None = None
        self.sampler: Sampler | None = None
        self.built: Built | None = None
        self.checkpointer: Checkpointer | None = None
        self.state = TrainerState()                 # everything a checkpoint restores, besides tensors
        self.elapsed_before = 0.0                   # training time of the run before this process
        self.throughput = Throughput()
        self.tokens_per_step = 0
        self.flops_per_token = 0.0
        self.token_bytes = torch.zeros(0, dtype=torch.int64)  # UTF-8 bytes per token id, for bits per byte
        self.started = 0.0                          # this process's start (wall clock)
        self.skips: Skips | None = None             # losses read back, steps skipped (setup)
        self.data_s = 0.0                           # this step's time drawing batches and moving them
        self.compile_reported = False
        self.stop_requested = False                 # SIGTERM or Ctrl-C seen by this process
        self.stop_agreed = False                    # ... by some rank (every rank stops at the same step)
        self.clean_exit = False
        self.budget: Budget | None = None           # train.time_budget
        self.horizon: Horizon | None = None         # where the run ends and its learning rate (plan.horizon)
        self.calibration: Calibration | None = None  # the CPU's (or an unlisted GPU's) measured MFU peak
        self.eval_iters = 0                         # batches of train and of val an eval scores (plan.evals)
        self.eval_batches: EvalBatches | None = None  # those batches, drawn at the first eval and kept

    # ------------------------------------------------------------------ setup

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: give up waiting
        self.stop_requested = True
        self.report.log(f"received {signal.Signals(signum).name}: finishing this step, saving a checkpoint, "
                        "then stopping")

    def setup(self) -> None:
        rd, main = self.run_dir, self.dist.is_main
        p = self.preset = load_preset_file(rd / rundir.PRESET_FILE)
        self.skips = Skips(self.state, self.report, p.train.max_skips)
        removed = []
        if main:  # rank 0 alone owns the run directory
            self.lock = rundir.RunLock(rd).acquire()
            self.report.open()
            removed = rundir.clean_stale_temporaries(rd)
        self.started = time.time()
        # A resume keeps the run's original start time and records when it resumed.
        when = {"resumed": self.started} if self.resume else {"started": self.started}
        self.report.status(state="starting", pid=os.getpid(), pid_start=rundir.process_start_time(os.getpid()),
                           max_iters=p.train.max_iters, error=None, compiling=False, world_size=self.dist.world,
                           **when)
        if removed:
            self.report.log(f"removed incomplete checkpoint temporaries: {', '.join(removed)}")
        if p.hardware.num_threads:
            torch.set_num_threads(p.hardware.num_threads)
        # The data first (a no-op when it is cached): a detached run prepares its corpus here, with its
        # progress in status.json. Every rank asks; one prepares, the others wait for it (a file lock).
        self.data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=self.report.log,
                                 progress=lambda pr: self.report.status(preparing=pr.to_dict()), faults=self.faults,
                                 run_dir=rd, loss_on=p.train.loss_on)
        self.report.status(preparing=None)
        if self.machine is None:
            self.machine = this_machine()
        # The process group first (its backend follows the device), so rank 0 can hand the others the
        # checkpoint; the settings then know how many steps are left (the compile rule needs it).
        self.dist.init(torch.device(resolve_device(p.hardware.device, self.machine)))
        ckpt = self._read_checkpoint(self.ckpt_selector) if self.resume else None
        steps_done = ckpt.trainer_state["step"] if ckpt else 0
        s = self.settings = run_settings(p, self.machine, self.dist.world, steps_done, measured_peak)
        for w in s.warnings:
            self.report.log(f"warning: {w}")
        # MFU's peak and where it comes from: measured beside a busy neighbour, the best rate measured here
        # before is the hardware's; an uncertain one (never measured quietly) is said so (machine.rates).
        self.calibration = calibration_here(s.device, s.precision)
        if self.calibration is not None:
            self.report.log(f"MFU peak: {self.calibration.describe()}")
        self.device = self.dist.device_for(torch.device(s.device))
        runtime.apply_backend_flags(s)
        self.autocast = runtime.autocast(s)

        torch.manual_seed(p.train.seed + self.dist.rank)  # distinct dropout per rank; DDP syncs the weights
        random.seed(p.train.seed)
        np.random.seed(p.train.seed % 2**32)
        if main and tokenizer_file(rd) is None:
            self.data.tokenizer.save(rd)
        # One generator draws the global batch on every rank; each rank trains on its own slice. So N
        # ranks see exactly the data of one process, and one sampler state resumes them all.
        self.sampler = new_sampler(self.data, "train", p, p.train.seed)
        if self.data.format == "chat":
            # the template chat, export and the next fine-tune apply: the one this run trains with (it replaces the
            # source's copy when data.chat_template chose another); a resume keeps the one its start wrote
            if main and not (self.resume and (rd / CHAT_TEMPLATE_FILE).exists()):
                write_atomic(rd / CHAT_TEMPLATE_FILE, self.data.template.text.encode())
            self.report.log(chat_line(self.data, self.sampler, p))
        self.token_bytes = torch.from_numpy(self.data.tokenizer.byte_lengths()).to(self.device)
        # The weights a fine-tuning run starts from (init/model.pt): at its start, and on every start of a
        # LoRA run (its checkpoints hold only the adapters). Rank 0 reads them and hands them on.
        init = None
        if p.init is not None and (p.train.finetune == "lora" or ckpt is None):
            init = self.dist.broadcast(load_init_weights(rd) if main else None)
        self.built = build(p, s, self.device, self.dist, rd / "cache" / "inductor", init)
        del init
        self.checkpointer = Checkpointer(rd, p, self.report, self.faults, lambda: self.horizon)
        self.tasks = TaskScorer(p.train, self.checkpointer.due, lambda step: self.horizon.is_end(step))
        if self.tasks.tasks and s.parallel == "fsdp":
            self.report.log("warning: train.eval_tasks are not scored in a sharded (FSDP) run; score its "
                            "checkpoints with `workbench eval`")
            self.tasks.tasks = []
        self.tokens_per_step = p.tokens_per_step()
        self.flops_per_token = flops_per_token(p.model)
        self.eval_iters, eval_why = eval_batches(p, split_tokens(self.data)[1])
        if not p.train.eval_iters:
            self.report.log(f"eval: {eval_why}")
        pending_rng = self.load_state_dict(ckpt) if ckpt else None
        if ckpt:
            self.elapsed_before = self.state.elapsed_s
        guess = None
        if (seconds := budget_seconds(p.train.time_budget)) is not None:
            guess = first_guess(p, s, self.machine, seconds, self.state.budget_spent, self.state.step, self.eval_iters)
            self.budget = Budget(seconds, self.state.budget_spent, guess, time.time())
        self.horizon = Horizon.from_state(p, ckpt.trainer_state if ckpt else None, guess)
        if self.budget is not None:
            if self.budget.done(time.time()):
                self.horizon = self.horizon.ended_at(self.state.step)  # spent already: nothing left to train
            self.report.status(max_iters=self.horizon.end_step)  # the end as estimated, until its steps are timed
        n_params = self.built.model.num_params()
        self.report.log(start_line(rd.name, p, s, self.device, self.dist.world, n_params, self.built.trainable,
                                   self.tokens_per_step, self.data.source, self.data.cached))
        self.report.log(savers_line(s))
        if self.budget is not None:
            self.report.log(self.budget.describe(self.state.step, time.time()))
        self.report.event("resume" if self.resume else "start", self.state.step, params=n_params,
                          device=str(self.device), precision=s.precision, compile=s.compile,
                          compile_mode=s.compile_mode, loss_chunk_tokens=s.loss_chunk_tokens,
                          activation_checkpointing=s.activation_checkpointing, savers_reason=s.savers_reason,
                          tokens_per_step=self.tokens_per_step, corpus=self.data.source,
                          train_tokens=split_tokens(self.data)[0], val_tokens=split_tokens(self.data)[1],
                          eval_iters=self.eval_iters,
                          **({"budget_s": self.budget.seconds, "budget_steps": self.budget.first_guess}
                             if self.budget else {}),
                          **({"chat": chat_facts(self.data, self.sampler, p)} if self.data.format == "chat" else {}),
                          peak_flops=s.peak_flops,
                          **({"calibration": self.calibration.to_dict()} if self.calibration else {}),
                          pid=os.getpid(), world_size=self.dist.world, parallel=s.parallel,
                          finetune=p.train.finetune, trainable=self.built.trainable,
                          **({"checkpoint": ckpt.meta["name"]} if ckpt else {}),
                          **({"parent": p.parent} if p.parent else {}),
                          **({"init": p.init} if p.init else {}))
        if ckpt:  # safe changes since the checkpoint (schedule length, intervals), after the resume event
            self.report.preset_changes(self.state.step, stateful.preset_changes(self.state, p))
        if pending_rng:
            pending_rng()  # last: building the model above drew random numbers

    # ------------------------------------------------------------------ its state, as a pair

    def state_dict(self) -> dict | None:
        """What a checkpoint holds (on rank 0; collective), for the checkpointer to write."""
        if self.budget is not None:
            self.state.budget_spent = round(self.budget.spent(time.time()), 3)
            self.state.budget_reserve = round(self.budget.reserve, 3)
        return stateful.state_dict(self.built, self.sampler, self.state, self.preset, self.dist,
                                   self.settings.parallel == "fsdp", self.elapsed(), self.horizon.to_state())

    def load_state_dict(self, ck: Checkpoint) -> Callable[[], None]:
        """Continue from ``ck``; returns the RNGs' restore, to call once nothing else draws random numbers."""
        restore_rng = stateful.load_state_dict(ck, self.built, self.sampler, self.state, self.preset, self.dist,
                                               self.settings.parallel == "fsdp")
        self.report.log(f"resumed from checkpoint {ck.meta['name']} (step {self.state.step})")
        return restore_rng

    def elapsed(self) -> float:
        """Training time of the run so far, this process's included."""
        return self.elapsed_before + (time.time() - self.started)

    def _read_checkpoint(self, selector: str | None) -> Checkpoint:
        """Rank 0 reads the checkpoint and hands it to the others (other nodes may not see the files)."""
        return self.dist.broadcast(read_checkpoint(self.run_dir, selector) if self.dist.is_main else None)

    # ------------------------------------------------------------------ the loop

    def train(self) -> str:
        t = self.preset.train
        self.built.model.train()
        self.report.status(state="running", compiling=self.settings.compile, step=self.state.step)
        if self.state.step == 0 and not self.resume:
            ev = self.evaluate()
            if self.budget is not None:
                self.budget.first_eval = ev.seconds
            self.report.record(ev)
            self.report.log(f"step 0: train loss {ev.train_loss:.4f}, val loss {ev.val_loss:.4f} "
                            f"({ev.val_bpb:.3f} bits/byte)")
            self.maybe_score_tasks()
        self.throughput.reset()
        while not self.horizon.is_end(self.state.step):
            self.train_step()
            if self.budget is not None:
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
            if self.state.step % t.log_interval == 0 or self.horizon.is_end(self.state.step):
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
        return "finished"

    def train_step(self) -> None:
        """One optimizer step. With the host check its result is known when this returns (in
        ``self.skips``); with the device check the GPU decides whether to apply the update, and the
        result is read a step later (or by ``self.skips.settle``), so the CPU never waits for the GPU here."""
        t, b, st = self.preset.train, self.built, self.state
        factor = self.horizon.lr_factor(st.step) * st.lr_scale
        b.optimizer.set_lr(factor)  # every group at the same share of its own peak
        lr = self.preset.train.lr * factor
        poison = self.faults.poison_step(st.step + 1)
        loss_sum = torch.zeros((), device=self.device)
        t_data = time.perf_counter()
        batches = [self.sampler.next_batch() for _ in range(t.grad_accum)]
        # chat: the loss is the mean over the trained targets of the whole step (every micro-batch and rank:
        # all ranks draw the global batch), so each token weighs the same however ragged the masks are
        per_step = trained_targets(batches, self.dist.world)
        self.data_s += time.perf_counter() - t_data
        for micro in range(t.grad_accum):
            t_data = time.perf_counter()
            x, y, pos, seg = self.to_device(batches[micro])
            self.data_s += time.perf_counter() - t_data
            last = micro == t.grad_accum - 1
            # DDP all-reduces gradients once, on the last micro-batch; FSDP2 likewise reduce-scatters only then.
            if self.settings.parallel == "fsdp":
                b.model.set_requires_gradient_sync(last)
            no_sync = self.settings.parallel == "ddp" and not last
            with b.train_forward.no_sync() if no_sync else contextlib.nullcontext():
                with self.autocast:  # drop the logits now: they would live through backward
                    loss = b.train_forward(x, y, positions=pos, segments=seg, loss_tokens=per_step)[1]
                if poison:
                    loss = loss * float("nan")
                if per_step is None:
                    loss = loss / t.grad_accum
                b.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        b.optimizer.unscale_(b.scaler)
        params = b.model.parameters()
        if t.grad_clip > 0:
            grad_norm = b.optimizer.clip_grad_norm_(params, t.grad_clip)
        else:
            grad_norm = torch.linalg.vector_norm(torch.stack([q.grad.detach().norm() for q in params
                                                              if q.grad is not None]))
        device_check = self.settings.nonfinite_check == "device"
        if device_check:
            bad = ~(torch.isfinite(loss_sum) & torch.isfinite(grad_norm))
            b.optimizer.step_unless(bad)  # the kernel skips a non-finite update, step count included
        else:
            # The host check: one sync per step, to know before the update. Under DDP the same sync
            # averages the loss over ranks and agrees on a stop request.
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
        st.step += 1
        st.tokens_seen += self.tokens_per_step
        if device_check:
            self.skips.queue(st.step, lr, loss_sum, grad_norm, bad)
        else:
            self.skips.record(st.step, lr, loss_val, gn, finite)

    def budget_tick(self) -> None:
        """After a step of a budgeted run: the budget's clock says how much of it is spent (on rank 0's clock for
        every rank) and the step it now ends at; the horizon takes both (the next step's learning rate, and with
        wsd where the decay began, which the checkpointer saves)."""
        t, st, b = self.preset.train, self.state, self.budget
        end = b.after_step(
            st.step, time.time(), clock_runs=not self.settings.compile or self.compile_reported,
            eval_due=st.step % t.eval_interval == 0,
            eval_estimate=lambda rate: eval_seconds(self.preset, self.eval_iters, self.tokens_per_step * rate),
            agree=self.dist.broadcast)
        self.horizon = self.horizon.after_step(st.step, end, b.agreed)

    def settle_due(self, step: int) -> bool:
        t = self.preset.train
        return (step % t.log_interval == 0 or self.horizon.is_end(step) or step % t.eval_interval == 0
                or self.checkpointer.due(step) is not None or self.stop_requested)

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
        self.report.log(f"step {st.step}/{max_iters}: loss {shown:.4f}, lr {lr:.2e}, grad norm {gn:.3f}, "
                        f"{f'{tps:,.0f} tok/s' if tps else 'warming up'}, mem {mem:.0f} MB")
        self.throughput.after_log(now)

    def budget_status(self, now: float) -> dict:
        return self.budget.status(self.horizon.end_step, now) if self.budget is not None else {}

    def maybe_evaluate(self) -> tuple[bool, bool, bool]:
        """At an eval step: the losses, the best so far, a sample, a checkpoint if it is the best or
        due, early stopping. Returns (evaluated, saved, early stop)."""
        t, st = self.preset.train, self.state
        if not (st.step % t.eval_interval == 0 or self.horizon.is_end(st.step)):
            return False, False, False
        began = time.time()
        ev = self.evaluate()
        self.report.record(ev)
        tl, vl = ev.train_loss, ev.val_loss
        improved = st.best_val is None or vl < st.best_val - t.min_delta
        self.report.log(f"step {st.step}: train loss {tl:.4f}, val loss {vl:.4f} ({ev.val_bpb:.3f} bits/byte)"
                        + (" (best)" if improved else ""))
        if improved:
            st.best_val, st.bad_evals = vl, 0
            self.report.status(best_val_loss=vl)
        else:
            st.bad_evals += 1
        t0 = time.time()
        self.write_sample()
        self.state.eval_s += time.time() - t0  # an eval's sample is part of its cost
        saved = self.maybe_save(vl, reason="best" if improved else None)
        if self.budget is not None and self.budget.t0 is not None:
            # the budget keeps this for the run's end: the last eval comes with its sample and a checkpoint
            self.budget.last_eval = time.time() - began + (0.0 if saved else self.checkpointer.last_seconds)
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
        if self.eval_batches is None:
            self.eval_batches = EvalBatches.draw(self.preset, self.data, self.eval_iters, self.token_bytes,
                                                 self.device, self.next_batch)
        ev = evaluate(self.built.model, self.eval_batches, self.dist, self.autocast, self.state.step)
        now = time.time()
        self.state.eval_s += now - t0
        return dataclasses.replace(ev, seconds=round(now - t0, 3), **self.time_spent())

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
                                             getattr(self.data, "template", None))
            for rec in records:
                self.report.record(rec)
            self.report.log(line)
        return True

    def write_sample(self) -> None:
        t = self.preset.train
        # Sharded, each forward is a collective: every rank generates (the same number of forwards), rank 0 writes.
        if not t.sample_prompt or not (self.dist.is_main or self.settings.parallel == "fsdp"):
            return
        text = generate_text(self.built.model, self.data.tokenizer, t.sample_prompt, t.sample_tokens,
                             temperature=0.8, top_k=50, seed=self.state.step,
                             autocast_dtype=runtime.amp_dtype(self.settings))
        self.built.model.train()
        if self.dist.is_main:
            self.report.sample(self.state.step, t.sample_prompt, text)

    def next_batch(self, sampler: Sampler) -> tuple[torch.Tensor | None, ...]:
        """This rank's part of ``sampler``'s next global batch (all of it in a single process), on the device:
        (x, y, positions, segments), the last two None for text."""
        return self.to_device(sampler.next_batch())

    def to_device(self, batch: tuple) -> tuple[torch.Tensor | None, ...]:
        """This rank's part of a global batch, on the device, as (x, y, positions, segments)."""
        batch = tuple(batch) + (None,) * (4 - len(batch))
        if self.dist.enabled:
            b, r = self.settings.micro_batch, self.dist.rank
            batch = tuple(a if a is None else a[r * b:(r + 1) * b] for a in batch)
        return runtime.batch_to_device(batch, self.device, flex=self.settings.attention_kernel == "flex")

    # ------------------------------------------------------------------ entry

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self.setup()
            state = self.train()
            self.report.event("finish" if state == "finished" else state, self.state.step, **self.time_spent())
            self.report.status(state=state, step=self.state.step, compiling=False, finished=time.time(),
                               **self.budget_status(time.time()),
                               ckpt_seconds=round(self.checkpointer.seconds, 3), best_val_loss=self.state.best_val)
            self.report.log(f"{state} at step {self.state.step}" + (
                f", best val loss {self.state.best_val:.4f}" if self.state.best_val is not None else ""))
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
            raise TrainError(msg) from None
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
