"""`workbench resume`: continue a run from its latest (or a chosen) complete checkpoint. What resumes, and
with which preset, is decided by ``workbench.plan.run_plan.plan_resume``; this prints and launches."""

from __future__ import annotations

import argparse

from workbench import rundir
from workbench.commands import launch
from workbench.commands.common import add_run_argument, add_set_option
from workbench.config import preset_to_toml
from workbench.data.mixture.mixture_data import mixture_sources
from workbench.data.mixture.mixture_plan import check_resume
from workbench.machine.detect import Machine, detect
from workbench.plan.preflight import check_resume_data
from workbench.plan.run_plan import ResumeRequest, checkpoint_state, plan_resume
from workbench.plan.settings import check_installed, resolve_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("resume", help="continue a run from a checkpoint",
                       description="Continue RUN from its latest complete checkpoint (or --checkpoint). "
                                   "--set may change training keys (max_iters, intervals, schedule); "
                                   "the change is recorded as an event.")
    add_run_argument(p, "run id (see `workbench runs`) or run directory", checkpoint_default=None,
                     checkpoint="latest (default: continues in place), best, or a step number; a checkpoint other "
                                "than the latest continues in a new run (a branch), leaving this one as it is")
    p.add_argument("--more", type=int, default=None, metavar="N",
                   help="train N more steps than the checkpoint's (sets train.max_iters; recorded as a change)")
    p.add_argument("--name", default=None, help="the new run's id when branching (default: <run>-from-<step>)")
    add_set_option(p)
    p.add_argument("--remix", action="store_true",
                   help="go on although preset.toml's [[data.mixture]] (its sources or weights) changed since the "
                        "checkpoint: the new mixture's plan starts at this step (recorded in the run's history); "
                        "without it such a resume is refused")
    p.add_argument("--detach", action="store_true", help="continue in the background")
    launch.add_topology_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = args.runs_dir
    plan = plan_resume(ResumeRequest(args.run, args.checkpoint, args.more, args.name, tuple(args.overrides)), root)
    run_dir, ckpt, p = plan.run_dir, plan.ckpt, plan.preset
    # the mixture it trained on goes on, or --remix says another may (before anything is written)
    check_resume(mixture_sources(p.data), checkpoint_state(ckpt).get("sampler"), f"{run_dir.name} {ckpt['name']}",
                 args.remix)
    check_resume_data(p, run_dir)  # a mixture's max_repeat over the steps it goes on to (plan/preflight.py)
    for line in plan.notes:
        print(line)
    # Load the checkpoint once here (weights_only) so a truncated, foreign or unsafe file is
    # refused before anything in the run directory changes.
    from workbench.train.checkpoint import load_run_model  # imports torch
    load_run_model(run_dir, ckpt["step"], shapes_only=True, training_state=True)
    machine = Machine.from_info(detect())
    topo = launch.topology_from_args(args, p, machine)
    check_installed(resolve_settings(p, machine, world_size=topo.nproc * topo.nnodes))
    if plan.branching:
        latest = rundir.select_checkpoint(run_dir, "latest")
        target = rundir.make_branch(run_dir, ckpt, root, plan.branch_toml(), args.name)
        print(f"{ckpt['name']} is not the latest checkpoint of {run_dir.name} ({latest['name']}): continuing in a "
              f"new run {target.name}, which starts from it; {run_dir.name} is left as it is")
    else:
        target = run_dir
        if plan.overrides:
            rundir.write_preset(run_dir, preset_to_toml(p))
    sel = str(ckpt["step"])
    if args.detach:
        pid = launch.start_detached(target, resume=True, checkpoint=sel, topo=topo)
        print(f"resuming run {target.name} from {ckpt['name']} (pid {pid})")
        print(target.name)
        return 0
    print(f"resuming run {target.name} from {ckpt['name']}")
    return launch.run_foreground(target, resume=True, checkpoint=sel, topo=topo)
