"""`workbench train`: start a run from a preset."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from workbench import rundir
from workbench.analysis.history import measured_in
from workbench.commands import launch
from workbench.commands.common import (
    TerminalProgress,
    add_corpus_option,
    add_init_from_option,
    add_set_option,
    time_budget_arg,
)
from workbench.config import Preset, overridden_keys, preset_to_toml
from workbench.machine.detect import Machine, detect, machine_identity
from workbench.machine.rates import kept_rate
from workbench.plan.preflight import FIRST_RECORDS, LISTED, check_plan, prepare_checked
from workbench.plan.recipe.finetune import finetune_lr_note
from workbench.plan.recipe.objective_plan import objective_plan
from workbench.plan.run_plan import NewRun, plan_new_run
from workbench.plan.settings import PeakFn, check_installed, resolve_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("train", help="train a model from a preset",
                       description="Start a new run. Foreground by default (progress on stdout, Ctrl-C "
                                   "saves a checkpoint and stops); --detach starts it in the background.")
    p.add_argument("preset", nargs="?", default=None,
                   help="preset name or path to a .toml (default: the one that suits this machine)")
    add_corpus_option(p, " (default: the preset's data.corpus)")
    p.add_argument("--name", default=None, help="run id (default: <preset>-<date>-<time>)")
    add_init_from_option(p)
    add_set_option(p)
    p.add_argument("--time-budget", metavar="DURATION", default=None,
                   help="train for this long (45m, 2h, 1h30m, 90s; a bare number is minutes) instead of "
                        "max_iters: the schedule follows the clock and the run ends at the budget with a checkpoint "
                        "(train.time_budget)")
    p.add_argument("--detach", action="store_true", help="start in the background and print the run id")
    p.add_argument("--yes", action="store_true",
                   help="start even when the estimate says the run will not fit this machine's memory, or that its "
                        "time budget is too short to buy a complete run")
    launch.add_topology_options(p)
    p.set_defaults(func=run)


def budget_peak(p: Preset, machine: Machine) -> PeakFn | None:
    """With a time budget, this machine's measured peak for the estimate (the steps a budget buys need the speed;
    the trainer asks the same, so `train`'s first line and the trainer's say one number); None without one. The
    peak kept for the trainer's threads where there is one (the trainer settles on it too, unless its own
    measurement beats it), else measured here: torch is imported only for that (1.3 s of CPU a start)."""
    if not p.train.time_budget_s:
        return None
    threads = trainer_threads(p, machine)

    def peak(device: str, precision: str) -> float | None:
        if (kept := kept_rate(machine_identity(), device, precision, threads)) is not None:
            return kept
        from workbench.machine.probe import measured_peak  # imports torch
        return measured_peak(device, precision)
    return peak


def trainer_threads(p: Preset, machine: Machine) -> int:
    """The CPU threads a trainer of ``p`` started from here will run torch on: hardware.num_threads, else the
    OMP_NUM_THREADS it inherits, else torch's default (the physical cores)."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return p.hardware.num_threads or (int(env) if env.isdigit() and int(env) > 0 else 0) or machine.physical_cores


def run(args: argparse.Namespace) -> int:
    req = NewRun(args.preset, tuple(args.overrides) + ((f"hardware.nproc={args.nproc}",) if args.nproc else ()),
                 tuple(args.corpus or ()), args.init_from, time_budget=time_budget_arg(args.time_budget),
                 name=args.name, force=args.yes)
    overrides = list(req.preset_sets())
    info = detect()
    machine = Machine.from_info(info)
    root = args.runs_dir
    plan = plan_new_run(req, root, info)
    p, src = plan.preset, plan.source
    topo = launch.topology_from_args(args, p, machine)
    # What the run asks of this machine is checked before anything is written (the trainer decides
    # again with torch's view of the devices, by the same rules).
    check_installed(resolve_settings(p, machine, world_size=topo.nproc * topo.nnodes))
    if src is not None:
        assert p.source is not None  # a fine-tune's preset records its source model ([source], plan/finetune.py)
        what = "LoRA adapters (rank {}) on".format(p.train.lora_rank) if p.train.finetune == "lora" else \
            "every weight of"
        print(f"fine-tuning {what} {src.run} {src.ckpt['name']} ({p.source.get('model', src.run)}); "
              f"model.seq_len {p.model.seq_len}; {p.train.optimizer} lr {p.train.lr:g}"
              + finetune_lr_note(p.train, overrides), flush=True)  # which rule set the rate (plan/recipe/finetune.py)
    if (objective := objective_plan(p)).preference:
        print(objective.describe(), flush=True)
    # the one pre-flight (plan/preflight.py): the estimate, and the corpus as far as it is read before the run
    # directory: a detached run's first records (it prepares its tokens itself), else listed (prepared below)
    pf = check_plan(plan, req, machine, history=measured_in(root), peak=budget_peak(p, machine),
                    corpus=FIRST_RECORDS if args.detach and not p.data.mixture else LISTED)
    check = pf.check
    print("estimate: " + "; ".join(check.lines()), flush=True)
    if p.train.time_budget_s is not None and "train.max_iters" in overridden_keys(overrides):
        print(f"note: train.max_iters = {p.train.max_iters} is not read with a time budget: the budget decides the "
              "steps (drop one of the two)", flush=True)
    if check.budget_problem and not req.force:
        raise rundir.RunError(f"{check.budget_problem} (or start it anyway with --yes)")
    if check.fits is False and not req.force:
        advice = f" ({check.suggestion})" if check.suggestion else ""
        if not (sys.stdin.isatty() and input("start anyway? [y/N] ").strip().lower() in ("y", "yes")):
            raise rundir.RunError(f"{p.name} does not fit this machine's memory by the estimate{advice}; "
                                  "start it anyway with --yes, or `workbench fit` a preset that fits")
    pf.raise_data_problem()  # problems with the corpus are reported before any run directory exists
    if not args.detach or p.data.mixture:  # with progress here; a mixture's repeats are checked before the run
        progress = TerminalProgress()
        try:
            prepare_checked(p, check.budget_steps, log=lambda m: print(m, flush=True), progress=progress)
        finally:
            progress.close()
    def fill(run_dir: Path) -> str:
        if src is not None:  # the weights it starts from, before preset.toml makes it a run
            rundir.start_from(run_dir, src.weights, src.run_dir)
            if src.lora:  # a LoRA checkpoint's adapters merged into its own starting weights
                from workbench.train.checkpoint import save_merged_init  # imports torch
                save_merged_init(run_dir, src.run_dir, src.ckpt["step"])
        return preset_to_toml(p)
    run_dir = rundir.make_run(root, p.name, fill, req.name,
                              cannot_write=lambda d, e: rundir.RunError(f"cannot write to {d}: {e.strerror}"))
    if args.detach:
        pid = launch.start_detached(run_dir, topo=topo)
        print(f"started run {run_dir.name} (pid {pid}); watch it with `workbench runs` or the TUI, "
              f"stop it with `workbench stop {run_dir.name}`")
        print(run_dir.name)
        return 0
    print(f"run {run_dir.name} in {run_dir}")
    return launch.run_foreground(run_dir, topo=topo)
