"""A run's start: the trainer's parts (:class:`TrainerParts`) and what is decided once before the first step,
in named parts: the run directory held, the data ready, where and how the run runs (the settings for the steps
left, the seeds), what it trains, where it goes on from and where it ends (a time budget's clock, the
horizon), and the start record that says it all once (``rundir.records.StartRecord``: the start or resume
event). The loop that runs the parts is :mod:`workbench.train.loop`."""

from __future__ import annotations

import contextlib
import os
import random
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from workbench import rundir
from workbench.config import Preset, load_preset_file
from workbench.config.objectives import SFT, objective_spec
from workbench.data.chat.chat_templates import CHAT_TEMPLATE_FILE
from workbench.data.mixture.mixture_plan import describe_sources
from workbench.data.preference.preference_data import PreferenceData
from workbench.data.preset_data import prepare_data
from workbench.data.text.tokenizer import tokenizer_file
from workbench.data.train_data import Sampler, TrainData
from workbench.faults import Faults
from workbench.fs import write_atomic
from workbench.machine.detect import Machine
from workbench.machine.probe import calibration_here, measured_peak, this_machine
from workbench.machine.rates import Calibration
from workbench.plan.fit.flops import flops_per_token
from workbench.plan.recipe.objective_plan import PRECOMPUTED, ObjectivePlan, objective_plan
from workbench.plan.schedule.budget_plan import BudgetPlan
from workbench.plan.schedule.evals import eval_batches
from workbench.plan.schedule.horizon import Horizon
from workbench.plan.settings import PeakFn, RunSettings, resolve_device, resolve_settings
from workbench.reward.prompt_data import prompt_data
from workbench.rundir import CKPT_MODEL, INIT_DIR
from workbench.rundir.records import StartRecord
from workbench.train import runtime, stateful
from workbench.train.budget import Budget, StepCount, estimated_plan
from workbench.train.build import Built, build
from workbench.train.checkpoint import Checkpoint, load_init_weights, read_checkpoint
from workbench.train.checkpointer import Checkpointer
from workbench.train.dist import Dist
from workbench.train.evaluation import EvalBatches
from workbench.train.grpo_run import GRPORun
from workbench.train.objective import Objective, build_objective
from workbench.train.reference import precompute_reference
from workbench.train.reporter import Reporter, Throughput, savers_line, start_line
from workbench.train.skips import Skips
from workbench.train.state import TrainerState
from workbench.train.task_eval import TaskScorer


def run_settings(p: Preset, machine: Machine, world_size: int, steps_done: int, peak: PeakFn) -> RunSettings:
    """What this trainer runs with: the preset's settings on this machine for the steps still to go
    (the compile rule weighs the rest of the run), with the peak FLOP/s measured here."""
    return resolve_settings(p, machine, world_size=world_size, steps_left=p.train.max_iters - steps_done, peak=peak)


def seed_all(p: Preset, rank: int) -> None:
    """torch's, Python's and numpy's generators from train.seed; torch's per rank (distinct dropout per rank:
    DDP syncs the weights)."""
    torch.manual_seed(p.train.seed + rank)
    random.seed(p.train.seed)
    np.random.seed(p.train.seed % 2**32)


def keep_data_files(run_dir: Path, data: TrainData, resume: bool) -> None:
    """What the run directory keeps of its data (rank 0): the tokenizer, once; and the chat template chat, export
    and the next fine-tune apply, the one this run trains with (it replaces the source's copy when
    data.chat_template chose another); a resume keeps the one its start wrote."""
    if tokenizer_file(run_dir) is None:
        data.tokenizer.save(run_dir)
    if data.template is not None and not (resume and (run_dir / CHAT_TEMPLATE_FILE).exists()):
        write_atomic(run_dir / CHAT_TEMPLATE_FILE, data.template.text.encode())


def run_horizon(p: Preset, s: RunSettings, machine: Machine, step: int, trainer_state: dict | None,
                now: float, runs_dir: Path) -> tuple[Budget | StepCount, Horizon, BudgetPlan | None]:
    """Where the run ends, as it starts at ``step`` (``trainer_state``: its checkpoint's): the horizon, from the
    checkpoint's record of it, and its clock: with a time budget, one going on from the seconds the checkpoint had
    spent, its plan at the estimated speed (the steps the budget left buys, as `workbench train`'s first line said
    them; the warmup and evals of a new run, re-sized from a timed eval batch before its step-0 eval) and the step
    it is first guessed to end at. A budget spent already ends the run where it is."""
    horizon = Horizon.from_state(p, trainer_state)
    if (seconds := horizon.budget_s) is None:
        return StepCount(), horizon, None
    spent = horizon.spent_before
    plan, tps = estimated_plan(p, s, machine, max(1.0, seconds - spent), runs_dir)
    guess = step + max(1, plan.steps) if plan.steps is not None else p.train.max_iters
    budget = Budget(seconds, spent, guess, now, prior_rate=tps / p.tokens_per_step() if tps else None)
    # spent already: nothing left to train
    return budget, horizon.ended_at(step if budget.done(now) else guess), plan


def start_record(p: Preset, s: RunSettings, built: Built, data: TrainData, sampler: Sampler, device: torch.device,
                 world: int, eval_iters: int, budget: Budget | StepCount, calibration: Calibration | None,
                 ckpt: Checkpoint | None, plan: ObjectivePlan | None = None) -> StartRecord:
    """What this process starts with: the model, where and how it runs, the data (and its own facts), the
    budget, what it goes on from."""
    train_tokens, val_tokens = data.split_tokens()
    optional: dict[str, Any] = {
        "budget_s": budget.seconds, "budget_steps": budget.first_guess,
        "calibration": calibration.to_dict() if calibration else None,
        "checkpoint": ckpt.meta["name"] if ckpt else None, "parent": p.parent or None, "init": p.init or None,
        "objective": {"objective": plan.objective, "beta": plan.beta, "averaged": plan.averaged,
                      "reference": plan.reference, "reference_why": plan.reference_why}
        if plan is not None and (plan.preference or plan.samples) else None}
    return StartRecord(
        params=built.model.num_params(), device=str(device), precision=s.precision, compile=s.compile,
        compile_mode=s.compile_mode, loss_chunk_tokens=s.loss_chunk_tokens,
        activation_checkpointing=s.activation_checkpointing, savers_reason=s.savers_reason,
        tokens_per_step=p.tokens_per_step(), corpus=data.source, train_tokens=train_tokens, val_tokens=val_tokens,
        eval_iters=eval_iters, peak_flops=s.peak_flops, pid=os.getpid(), world_size=world, parallel=s.parallel,
        finetune=p.train.finetune, trainable=built.trainable, data=data.start_facts(sampler, p), **optional)


class TrainerParts:
    """The trainer's parts, every one declared here, and how they are set up before the first step (``setup``,
    in named parts); with the trainer's state as a pair (``state_dict`` / ``load_state_dict``). The loop that
    runs them is ``workbench.train.loop.Trainer``."""

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
        self.data: TrainData | None = None
        self.sampler: Sampler | None = None
        self.built: Built | None = None
        self.checkpointer: Checkpointer | None = None
        self.tasks: TaskScorer | None = None        # train.eval_tasks, scored while training
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
        self.budget: Budget | StepCount = StepCount()  # train.time_budget's clock (counted in steps: one of none)
        self.budget_plan: BudgetPlan | None = None  # ... what it buys at the estimated speed (plan.schedule.horizon)
        self.first_step = 0                         # this process's first step (logged at once)
        self.horizon: Horizon | None = None         # where the run ends and its learning rate (plan.schedule.horizon)
        self.calibration: Calibration | None = None  # the CPU's (or an unlisted GPU's) measured MFU peak
        self.eval_iters = 0                         # batches of train and of val an eval scores (plan.schedule.evals)
        self.eval_batches: EvalBatches | None = None  # those batches, drawn at the first eval and kept
        self.plan = ObjectivePlan(SFT)              # what the run optimises and its reference (objective_plan)
        self.objective: Objective | None = None     # a preference run's loss, its reference and its checks
        self.grpo: GRPORun | None = None            # a GRPO run's rollouts, reward, reference and stats

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Everything before the first step, in the order it must happen: the run directory held, the data
        ready, where and how the run runs, what it trains, where it goes on from and where it ends, then the
        start said; the RNGs of a checkpoint restored last (building the model draws random numbers)."""
        p = self.open_run()
        self.prepare_data(p)
        ckpt = self.place(p)
        self.build_parts(p, ckpt)
        restore_rng = self.restore(p, ckpt)
        self.announce(p, ckpt)
        if restore_rng:
            restore_rng()

    def open_run(self) -> Preset:
        """The preset, the run directory held (rank 0 alone owns it: its lock, its records, stale checkpoint
        temporaries removed) and status.json saying the run is starting."""
        rd = self.run_dir
        p = self.preset = load_preset_file(rd / rundir.PRESET_FILE)
        self.skips = Skips(self.state, self.report, p.train.max_skips)
        removed = []
        if self.dist.is_main:
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
        return p

    def prepare_data(self, p: Preset) -> None:
        """The data first (a no-op when it is cached): a detached run prepares its corpus here, with its progress
        in status.json. Every rank asks; one prepares, the others wait for it (a file lock). GRPO's prompts file is
        read by the reward package (nothing to prepare)."""
        if objective_spec(p.train.objective).samples:
            self.data = prompt_data(p, self.run_dir)
            return
        self.data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=self.report.log,
                                 progress=lambda pr: self.report.status(preparing=pr.to_dict()), faults=self.faults,
                                 run_dir=self.run_dir, loss_on=p.train.loss_on, objective=p.train.objective)
        self.report.status(preparing=None)

    def place(self, p: Preset) -> Checkpoint | None:
        """Where and how the run runs: the process group first (its backend follows the device), so rank 0 can
        hand the others the checkpoint it resumes from (returned); then the settings, which know how many steps
        are left (the compile rule needs it), the MFU peak, the device, the backend flags and the seeds."""
        if self.machine is None:
            self.machine = this_machine()
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
        seed_all(p, self.dist.rank)
        return ckpt

    def build_parts(self, p: Preset, ckpt: Checkpoint | None) -> None:
        """What the run trains and with what: the data's files kept in the run directory, the sampler, the model
        (from a fine-tune's starting weights), the checkpointer, the task scorer and the batches an eval scores."""
        rd, data, s = self.run_dir, self.data, self.settings
        if self.dist.is_main:
            keep_data_files(rd, data, self.resume)
        # One generator draws the global batch on every rank; each rank trains on its own slice. So N
        # ranks see exactly the data of one process, and one sampler state resumes them all.
        self.sampler = data.sampler("train", p, p.train.seed)
        for line in data.start_lines(self.sampler, p):
            self.report.log(line)
        self.token_bytes = torch.from_numpy(data.tokenizer.byte_lengths()).to(self.device)
        # The weights a fine-tuning run starts from (init/model.pt): at its start, and on every start of a
        # LoRA run (its checkpoints hold only the adapters). Rank 0 reads them and hands them on.
        init = None
        self.plan = objective_plan(p)
        # a full fine-tune's reference is its starting weights: a frozen copy, or (precomputed) the model itself
        # before the checkpoint's weights are loaded over them, to check (or compute) the table with
        with_ref = self.plan.reference in ("frozen copy", PRECOMPUTED)
        if p.init is not None and (p.train.finetune == "lora" or ckpt is None or with_ref):
            init = self.dist.broadcast(load_init_weights(rd) if self.dist.is_main else None)
        self.built = build(p, s, self.device, self.dist, rd / "cache" / "inductor", init)
        if self.plan.preference:
            self.objective = build_objective(p, self.plan, self.built.model, self.device, init,
                                             runtime.amp_dtype(s), self.faults)
        if self.plan.samples:
            self.grpo = GRPORun(p, self.plan, self.data, self.built.model, self.device, init, runtime.amp_dtype(s))
        del init
        if self.plan.reference == PRECOMPUTED:
            self.precompute_reference(p)
        self.checkpointer = Checkpointer(rd, p, self.report, self.faults, lambda: self.horizon)
        self.tasks = TaskScorer(p.train, self.checkpointer.due, lambda step: self.horizon.is_end(step))
        if self.tasks.tasks and s.parallel == "fsdp":
            self.report.log("warning: train.eval_tasks are not scored in a sharded (FSDP) run; score its "
                            "checkpoints with `workbench eval`")
            self.tasks.tasks = []
        self.tokens_per_step = p.tokens_per_step()
        self.flops_per_token = flops_per_token(p.model)
        self.eval_iters, eval_why = eval_batches(p, data.split_tokens()[1])
        if self.grpo is not None:
            self.eval_iters, eval_why = 0, "the held-out prompts' reward (a GRPO run has no val loss)"
        if not p.train.eval_iters or self.grpo is not None:
            self.report.log(f"eval: {eval_why}")

    def mixture_follows_budget(self, say: bool = False) -> None:
        """A time budget's mixture: see ``workbench.train.budget_steps.BudgetSteps``."""

    def precompute_reference(self, p: Preset) -> None:
        """The precomputed reference's table, with the model as it is now (the starting weights: a resume's
        checkpoint is loaded after this), checked and handed to the data; its facts go into the plan, which the
        start line and the start record state."""
        assert isinstance(self.data, PreferenceData)
        s = self.settings
        path = precompute_reference(self.built.model, self.data, self.run_dir / INIT_DIR / CKPT_MODEL,
                                    p.model.seq_len, s.micro_batch * self.plan.rows_per_item, s.precision,
                                    self.device, self.autocast, self.dist, p.train.seed, self.report.log)
        self.plan = self.plan.with_table(len(self.data.offsets) - 1, str(path))

    def restore(self, p: Preset, ckpt: Checkpoint | None) -> Callable[[], None] | None:
        """Where the run goes on from and where it ends: a checkpoint's state (its RNGs' restore returned, to call
        last), a time budget's clock, and the horizon."""
        restore_rng = self.load_state_dict(ckpt) if ckpt else None
        if ckpt:
            self.elapsed_before = self.state.elapsed_s
        self.budget, self.horizon, self.budget_plan = run_horizon(
            p, self.settings, self.machine, self.state.step, ckpt.trainer_state if ckpt else None, time.time(),
            self.run_dir.parent)
        if self.horizon.eval_iters:  # a budgeted run's evals as its start planned them (a resume keeps them)
            self.eval_iters = self.horizon.eval_iters
        if isinstance(self.budget, Budget):
            self.report.status(max_iters=self.horizon.end_step)  # the end as estimated, until its steps are timed
            self.mixture_follows_budget(say=True)
        return restore_rng

    def announce(self, p: Preset, ckpt: Checkpoint | None) -> None:
        """The start said: its lines in train.log, the start (or resume) record, a resume's preset changes."""
        s, b = self.settings, self.built
        self.report.log(start_line(self.run_dir.name, p, s, self.device, self.dist.world, b.model.num_params(),
                                   b.trainable, self.tokens_per_step, self.data.source, self.data.cached))
        self.report.log(savers_line(s))
        if self.plan.preference or self.plan.samples:
            self.report.log(self.plan.describe())
        if isinstance(self.budget, Budget):
            fresh = self.budget_plan is not None and not self.resume
            self.report.log(self.budget_plan.describe() if fresh and self.budget_plan.steps is not None
                            else self.budget.describe(self.state.step, time.time()))
        start = start_record(p, s, b, self.data, self.sampler, self.device, self.dist.world, self.eval_iters,
                             self.budget, self.calibration, ckpt, self.plan)
        self.report.record(start.event(self.resume, self.state.step, time.time()))
        if ckpt:  # safe changes since the checkpoint (schedule length, intervals), after the resume event
            self.report.preset_changes(self.state.step, stateful.preset_changes(self.state, p))
            if (before := getattr(self.sampler, "changed", None)) is not None:  # resume --remix (data.mixture)
                after = self.sampler.sources()
                self.report.event("mixture_changed", self.state.step, before=before, after=after)
                self.report.log(f"mixture changed at step {self.state.step}: {describe_sources(before)} -> "
                                f"{describe_sources(after)} (resume --remix); the new plan starts here")

    # ------------------------------------------------------------------ its state, as a pair

    def state_dict(self) -> dict | None:
        """What a checkpoint holds (on rank 0; collective), for the checkpointer to write."""
        end = self.horizon.to_state(self.budget.spent(time.time()), self.budget.reserve)
        return stateful.state_dict(self.built, self.sampler, self.state, self.preset, self.dist,
                                   self.settings.parallel == "fsdp", self.elapsed(), end)

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


__all__ = ["TrainerParts", "keep_data_files", "run_horizon", "run_settings", "seed_all", "start_record"]
