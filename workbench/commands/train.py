"""`workbench train`: start a run from a preset."""

from __future__ import annotations

import argparse
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
from workbench.data.chat.chat_data import check_loss_on, corpus_kind
from workbench.data.mixture.mixture_data import MixtureData
from workbench.data.preference.preference_records import check_corpus_kind
from workbench.data.preset_data import check_chat_template, open_data_corpus, prepare_data
from workbench.machine.detect import Machine, detect
from workbench.plan.recipe.finetune import finetune_lr_note
from workbench.plan.recipe.objective_plan import objective_plan
from workbench.plan.report import fit_check
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


def budget_peak(p: Preset) -> PeakFn | None:
    """With a time budget, this machine's measured peak for the estimate (the steps a budget buys need the speed;
    the trainer asks the same, so `train`'s first line and the trainer's say one number); None without one."""
    if not p.train.time_budget_s:
        return None
    from workbench.machine.probe import measured_peak  # imports torch: only where a budget needs the speed
    return measured_peak


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
    check = fit_check(p, machine, measured_in(root), peak=budget_peak(p))
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
    check_data(args, p, objective.samples, overrides, check.budget_steps)
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

def check_data(args: argparse.Namespace, p: Preset, prompts: bool, overrides: list[str],
               budget_steps: int | None) -> None:
    """The corpus first: problems with it are reported before any run directory exists. In the foreground the
    tokens are prepared here, with progress on the terminal; a detached run prepares them itself (its status and
    the TUI show the progress), so only the listing and the first records are checked here. GRPO (``prompts``)
    trains on a prompts file, read and checked by plan_new_run (not a corpus)."""
    if prompts:
        return
    corpus = open_data_corpus(p.data)
    check_loss_on(p.data, corpus, p.train.loss_on if "train.loss_on" in overridden_keys(overrides) else None)
    if args.detach and not p.data.mixture:  # a mixture is prepared here: its repeats are checked before the run
        kind = corpus_kind(p.data, corpus)  # (its first record was read to tell)
        check_corpus_kind(p.train.objective, kind, corpus.description)
        if kind != "text":  # conversations and preference records: the template they render through
            check_chat_template(p.data, p.model.vocab_size, p.train.loss_on)
        else:
            corpus.check_first_records()
        return
    progress = TerminalProgress()
    try:
        data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: print(m, flush=True),
                            progress=progress, loss_on=p.train.loss_on,  # --init-from: the source's tokenizer
                            objective=p.train.objective)
    finally:
        progress.close()
    # e.g. conversations that fill no row (all dropped as overlong) are bad input too; a mixture's max_repeat is
    # checked over the steps the run is planned for: with a time budget, its first guess (the trainer's too)
    if isinstance(data, MixtureData):
        data.check(p, max(1, budget_steps) if budget_steps is not None else None)
    else:
        data.check(p)
