"""`workbench resume`: continue a run from its latest (or a chosen) complete checkpoint."""

from __future__ import annotations

from workbench import rundir
from workbench.commands import launch
from workbench.commands.common import add_set_option
from workbench.config import PresetError, apply_overrides, parse_override, parse_toml, preset_from_dict, preset_to_toml
from workbench.fs import write_atomic
from workbench.machine.detect import Machine, detect
from workbench.plan.settings import resolve_settings

# Keys that change what the checkpoint's tensors mean; resuming with other values is refused.
SHAPE_KEYS = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "tie_embeddings")


def register(sub) -> None:
    p = sub.add_parser("resume", help="continue a run from a checkpoint",
                       description="Continue RUN from its latest complete checkpoint (or --checkpoint). "
                                   "--set may change training keys (max_iters, intervals, schedule); "
                                   "the change is recorded as an event.")
    p.add_argument("run", help="run id (see `workbench runs`) or run directory")
    p.add_argument("--checkpoint", default=None, help="latest (default), best, or a step number")
    add_set_option(p)
    p.add_argument("--detach", action="store_true", help="continue in the background")
    launch.add_topology_options(p)
    p.set_defaults(func=run)


def model_differences(preset_model: dict, ckpt_model: dict) -> list[str]:
    return [f"model.{k}: checkpoint {ckpt_model.get(k)!r}, preset {preset_model.get(k)!r}"
            for k in SHAPE_KEYS if k in ckpt_model and ckpt_model.get(k) != preset_model.get(k)]


def run(args) -> int:
    root = rundir.runs_root(getattr(args, "runs_dir", None))
    run_dir = rundir.resolve_run(root, args.run)
    if rundir.RunLock(run_dir).held_by_other():
        raise rundir.RunError(f"run {run_dir.name} is already being trained; "
                              f"stop it first with `workbench stop {run_dir.name}`")
    ckpt = rundir.select_checkpoint(run_dir, args.checkpoint)
    data = parse_toml((run_dir / "preset.toml").read_text(encoding="utf-8"), str(run_dir / "preset.toml"))
    for item in args.overrides:
        sec, key, _value = parse_override(item)
        if sec == "data" or (sec == "model" and key != "dropout"):
            raise PresetError(f"--set {item!r}: {sec}.{key} cannot change when resuming (it changes the "
                              "model or its data); start a new run with `workbench train` instead")
    apply_overrides(data, args.overrides)
    p = preset_from_dict(data, str(run_dir / "preset.toml"), name=data.get("name"))
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
    resolve_settings(p, machine, world_size=topo.nproc * topo.nnodes)
    if args.overrides:
        write_atomic(run_dir / "preset.toml", preset_to_toml(p))
    sel = str(ckpt["step"])
    if args.detach:
        pid = launch.start_detached(run_dir, resume=True, checkpoint=sel, topo=topo)
        print(f"resuming run {run_dir.name} from {ckpt['name']} (pid {pid})")
        print(run_dir.name)
        return 0
    print(f"resuming run {run_dir.name} from {ckpt['name']}")
    return launch.run_foreground(run_dir, resume=True, checkpoint=sel, topo=topo)
