"""`workbench resume`: continue a run from its latest (or a chosen) complete checkpoint."""

from __future__ import annotations

from workbench import rundir
from workbench.analysis.lineage import branch, is_latest
from workbench.commands import launch
from workbench.commands.common import add_set_option
from workbench.config import (
    PresetError,
    apply_overrides,
    overridden_keys,
    parse_override,
    parse_toml,
    preset_from_dict,
    preset_to_toml,
)
from workbench.fs import write_atomic
from workbench.machine.detect import Machine, detect
from workbench.plan.schedule import decay_start
from workbench.plan.settings import check_installed, resolve_settings

# Keys that change what the checkpoint's tensors mean; resuming with other values is refused.
SHAPE_KEYS = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "tie_embeddings", "head_size",
              "attn_bias", "qk_norm")


# Training keys that change what a checkpoint's tensors are (a LoRA run's checkpoints hold its adapters).
ADAPTER_KEYS = ("finetune", "lora_rank", "lora_alpha", "lora_targets")


def register(sub) -> None:
    p = sub.add_parser("resume", help="continue a run from a checkpoint",
                       description="Continue RUN from its latest complete checkpoint (or --checkpoint). "
                                   "--set may change training keys (max_iters, intervals, schedule); "
                                   "the change is recorded as an event.")
    p.add_argument("run", help="run id (see `workbench runs`) or run directory")
    p.add_argument("--checkpoint", default=None,
                   help="latest (default: continues in place), best, or a step number; a checkpoint other than "
                        "the latest continues in a new run (a branch), leaving this one as it is")
    p.add_argument("--more", type=int, default=None, metavar="N",
                   help="train N more steps than the checkpoint's (sets train.max_iters; recorded as a change)")
    p.add_argument("--name", default=None, help="the new run's id when branching (default: <run>-from-<step>)")
    add_set_option(p)
    p.add_argument("--detach", action="store_true", help="continue in the background")
    launch.add_topology_options(p)
    p.set_defaults(func=run)


def model_differences(preset_model: dict, ckpt_model: dict) -> list[str]:
    return [f"model.{k}: checkpoint {ckpt_model.get(k)!r}, preset {preset_model.get(k)!r}"
            for k in SHAPE_KEYS if k in ckpt_model and ckpt_model.get(k) != preset_model.get(k)]


def being_trained(run_dir) -> rundir.RunError:
    return rundir.RunError(f"run {run_dir.name} is already being trained; "
                           f"stop it first with `workbench stop {run_dir.name}`")


def run(args) -> int:
    root = rundir.runs_root(getattr(args, "runs_dir", None))
    run_dir = rundir.resolve_run(root, args.run)
    if not rundir.list_checkpoints(run_dir) and rundir.RunLock(run_dir).held_by_other():
        raise being_trained(run_dir)  # before "no checkpoint yet": the run is young, not broken
    ckpt = rundir.select_checkpoint(run_dir, args.checkpoint)
    if ckpt.get("reason") == "import":
        raise rundir.RunError(f"run {run_dir.name} is a model brought in by `workbench import`, not a run to "
                              f"continue; train from it with `workbench train PRESET --init-from {run_dir.name}`")
    old = preset_from_dict(parse_toml((run_dir / "preset.toml").read_text(encoding="utf-8"), str(run_dir)),
                           str(run_dir / "preset.toml"))
    more_from = int(ckpt["step"])
    if args.more and old.train.schedule == "wsd" and more_from > (start := decay_start(old)):
        # A decayed wsd run goes on from where its decay began: the stable phase continues, and a new
        # decay ends the longer run (its first decay stays, in this run).
        ckpt = next((c for c in reversed(rundir.list_checkpoints(run_dir)) if c["step"] <= start), ckpt)
        print(f"wsd schedule: going on from step {ckpt['step']}, where the decay began, so the stable phase "
              f"continues and a new decay ends the run at step {more_from + args.more}")
        if ckpt["step"] != start:
            print(f"note: no checkpoint at step {start}, where the decay began; going on from {ckpt['name']}")
    branching = not is_latest(run_dir, ckpt)
    if not branching and rundir.RunLock(run_dir).held_by_other():
        raise being_trained(run_dir)
    if args.name and not branching:
        raise rundir.RunError(f"--name names a new run, made when resuming from a checkpoint other than the latest; "
                              f"{ckpt['name']} is {run_dir.name}'s latest, so it continues in place")
    overrides = list(args.overrides)
    for item in overrides:
        sec, key, _value = parse_override(item)
        if sec == "data" or (sec == "model" and key != "dropout") or (sec == "train" and key in ADAPTER_KEYS):
            raise PresetError(f"--set {item!r}: {sec}.{key} cannot change when resuming (it changes the "
                              "model or its data); start a new run with `workbench train` instead")
    if args.more is not None:
        if args.more < 1:
            raise rundir.RunError(f"--more {args.more}: give the number of steps to add, at least 1")
        if "train.max_iters" in overridden_keys(overrides):
            raise rundir.RunError("give --more N or --set train.max_iters=M, not both")
        overrides.append(f"train.max_iters={more_from + args.more}")
    data = parse_toml((run_dir / "preset.toml").read_text(encoding="utf-8"), str(run_dir / "preset.toml"))
    apply_overrides(data, overrides)
    p = preset_from_dict(data, str(run_dir / "preset.toml"), name=data.get("name"),
                         user_set=overridden_keys(overrides))
    diffs = model_differences(data.get("model", {}), ckpt.get("model") or {})
    if diffs:
        raise rundir.RunError(f"checkpoint {ckpt['name']} does not fit the run's preset: {'; '.join(diffs)}; "
                              "restore those values in preset.toml or start a new run")
    # Load the checkpoint once here (weights_only) so a truncated, foreign or unsafe file is
    # refused before anything in the run directory changes.
    from workbench.train.checkpoint import load_run_model  # imports torch
    load_run_model(run_dir, ckpt["step"], shapes_only=True, training_state=True)
    machine = Machine.from_info(detect())
    topo = launch.topology_from_args(args, p, machine)
    check_installed(resolve_settings(p, machine, world_size=topo.nproc * topo.nnodes))
    if branching:
        latest = rundir.select_checkpoint(run_dir, "latest")
        target = branch(run_dir, ckpt, root, args.name, overrides_applied=data)
        print(f"{ckpt['name']} is not the latest checkpoint of {run_dir.name} ({latest['name']}): continuing in a "
              f"new run {target.name}, which starts from it; {run_dir.name} is left as it is")
    else:
        target = run_dir
        if overrides:
            write_atomic(run_dir / "preset.toml", preset_to_toml(p))
    sel = str(ckpt["step"])
    if args.detach:
        pid = launch.start_detached(target, resume=True, checkpoint=sel, topo=topo)
        print(f"resuming run {target.name} from {ckpt['name']} (pid {pid})")
        print(target.name)
        return 0
    print(f"resuming run {target.name} from {ckpt['name']}")
    return launch.run_foreground(target, resume=True, checkpoint=sel, topo=topo)
