"""A run's history is never rewritten: resuming from a checkpoint other than the latest makes a
new run (a branch) that starts from a copy of that checkpoint and records its parent; the parent
is left exactly as it was.

    runs/tiny/                    finished at 600; its latest checkpoint stays step_0000600
    runs/tiny-from-540/           preset.toml has [parent] run = "tiny", step = 540
        checkpoints/step_0000540/ the parent's checkpoint (hard links: no copy, and deleting either
                                  side's files never touches the other's)
        tokenizer.model           the parent's (or its tokenizer.json and tokenizer_config.json)
        init/                     the parent's starting weights, if it has them (hard links; a LoRA
                                  run's checkpoints are adapters on top of them)

Readers follow a run's ancestors to draw it as one line (``lineage``). Torch-free.
"""

from __future__ import annotations

import re
from pathlib import Path

from workbench.config import PresetError, parse_toml, preset_from_dict, preset_to_toml
from workbench.rundir import (
    CHECKPOINTS_DIR,
    INIT_DIR,
    PRESET_FILE,
    RunError,
    ckpt_name,
    copy_tokenizer,
    create_run,
    link_tree,
    write_preset,
)


def branch_name(run_dir: Path, step: int) -> str:
    """``<run>-from-<step>``: which run and which step, all the way back (``first-from-2`` at 30 is
    ``first-from-2-from-30``, never ``first-from-30``, which reads as ``first``'s own step 30). At the very step a
    branch started from, its checkpoint is its parent's: that branch of a branch is named from the parent (``p-from-40``
    at 40 again is ``p-from-40-2`` once that exists), never ``p-from-40-from-40``. A branch the user named keeps that
    name (``mine`` at 40 is ``mine-from-40``)."""
    run_dir = Path(run_dir)
    for _ in range(32):  # (a chain of branches at one step; a cycle in hand-edited presets ends here too)
        parent = parent_of(run_dir)
        m = _BRANCH_NAME.fullmatch(run_dir.name)
        if parent is None or parent[1] != step or m is None or int(m.group(2)) != step:
            break
        run_dir = run_dir.parent / parent[0]
    return f"{run_dir.name}-from-{step}"


_BRANCH_NAME = re.compile(r"(.+?)-from-(\d+)(?:-\d+)?")


def branch(run_dir: Path, ckpt: dict, root: Path, name: str | None = None,
           overrides_applied: dict | None = None) -> Path:
    """A new run that continues ``run_dir``'s checkpoint ``ckpt``; ``overrides_applied``: the preset data
    the new run starts with (default: the parent's). Nothing in ``run_dir`` changes."""
    run_dir = Path(run_dir)
    preset_file = run_dir / PRESET_FILE
    data = overrides_applied or parse_toml(preset_file.read_text(encoding="utf-8"), str(preset_file))
    data = dict(data, parent={"run": run_dir.name, "step": int(ckpt["step"])})
    try:
        preset = preset_from_dict(data, str(preset_file), name=data.get("name"))
    except PresetError as e:
        raise RunError(str(e)) from None
    with create_run(root, preset.name, name or _free_name(root, branch_name(run_dir, ckpt["step"]))) as child:
        (child / CHECKPOINTS_DIR).mkdir()
        link_tree(Path(ckpt["path"]), child / CHECKPOINTS_DIR / ckpt_name(int(ckpt["step"])))
        copy_tokenizer(run_dir, child)
        if (run_dir / INIT_DIR).is_dir():
            link_tree(run_dir / INIT_DIR, child / INIT_DIR)
        write_preset(child, preset_to_toml(preset))
    return child


def _free_name(root: Path, base: str) -> str:
    for i in range(1000):
        candidate = base if i == 0 else f"{base}-{i + 1}"
        if not (root / candidate).exists():
            return candidate
    raise RunError(f"too many runs named {base}-N in {root}; give --name")


def parent_of(run_dir: Path) -> tuple[str, int] | None:
    """(parent run id, branch step) from the run's preset.toml, or None."""
    try:
        data = parse_toml((Path(run_dir) / PRESET_FILE).read_text(encoding="utf-8"), str(run_dir))
    except (OSError, PresetError):
        return None
    p = data.get("parent")
    if isinstance(p, dict) and isinstance(p.get("run"), str) and isinstance(p.get("step"), int):
        return p["run"], p["step"]
    return None


def lineage(root: Path, run_id: str, limit: int = 32) -> list[tuple[str, int | None]]:
    """The run and its ancestors, oldest first: [(run id, the step up to which it counts), ...]; the
    last entry is the run itself (None: all of it). Stops at a missing parent or a cycle."""
    chain: list[tuple[str, int | None]] = [(run_id, None)]
    seen = {run_id}
    current = run_id
    while len(chain) < limit:
        p = parent_of(Path(root) / current)
        if p is None or p[0] in seen or not (Path(root) / p[0]).is_dir():
            break
        chain.append(p)
        seen.add(p[0])
        current = p[0]
    return list(reversed(chain))
