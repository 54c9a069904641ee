"""`workbench train`: start a run from a preset."""

from __future__ import annotations

import shutil
from pathlib import Path

from workbench import launch, rundir
from workbench.commands.common import add_set_option
from workbench.config import preset_paths, preset_to_toml


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model from a preset",
                       description="Start a new run. Foreground by default (progress on stdout, Ctrl-C "
                                   "saves a checkpoint and stops); --detach starts it in the background.")
    p.add_argument("preset", nargs="?", default=None,
                   help="preset name or path to a .toml (default: the one that suits this machine)")
    p.add_argument("--corpus", default=None, help="text file, directory of text files, or builtin")
    p.add_argument("--name", default=None, help="run id (default: <preset>-<date>-<time>)")
    add_set_option(p)
    p.add_argument("--detach", action="store_true", help="start in the background and print the run id")
    launch.add_topology_options(p)
    p.set_defaults(func=run)


def default_preset_name() -> str:
    try:
        from workbench.hardware import recommend_preset
        name, _why = recommend_preset()
        if name in preset_paths():
            return name
    except Exception:
        pass
    return "cpu-small"


def resolve_for_run(preset_arg: str | None, overrides: list[str], corpus: str | None):
    """The validated preset for a new run, with data.corpus made absolute."""
    from workbench.config import resolve_preset
    name = preset_arg or default_preset_name()
    ov = list(overrides)
    if corpus is not None:
        ov.append(f"data.corpus={_toml_str(corpus)}")
    p = resolve_preset(name, ov)
    if p.data.corpus != "builtin":
        p.data.corpus = str(Path(p.data.corpus).expanduser().resolve())
    return p


def _toml_str(s: str) -> str:
    import json
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def run(args) -> int:
    overrides = list(args.overrides) + ([f"hardware.nproc={args.nproc}"] if args.nproc else [])
    p = resolve_for_run(args.preset, overrides, args.corpus)
    topo = launch.topology_from_args(args, p)
    root = rundir.runs_root(getattr(args, "runs_dir", None))
    # Prepare the data first: corpus and tokenizer problems are reported before any
    # run directory exists, and the trainer then finds tokenizer and tokens cached.
    from workbench.train.data import prepare_data
    prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: print(m, flush=True))
    run_dir = rundir.new_run_dir(root, p.name, args.name)
    try:
        rundir.write_text_atomic(run_dir / "preset.toml", preset_to_toml(p))
    except OSError as e:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise rundir.RunError(f"cannot write to {run_dir}: {e.strerror}") from None
    if args.detach:
        pid = launch.start_detached(run_dir, topo=topo)
        print(f"started run {run_dir.name} (pid {pid}); watch it with `workbench runs` or the TUI, "
              f"stop it with `workbench stop {run_dir.name}`")
        print(run_dir.name)
        return 0
    print(f"run {run_dir.name} in {run_dir}")
    return launch.run_foreground(run_dir, topo=topo)
