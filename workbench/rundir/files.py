"""The one writer of run directories: making a run (never half of one) in each of its four ways — fresh,
fine-tuned from another run's weights, imported, branched from a checkpoint (its lineage written in its
preset's ``[parent]``) —, its preset's file, the files it shares with another run (hard links, else copies),
the lock its trainer holds, and deleting a run or a checkpoint (never one a trainer is working on). What goes
into the files is decided above: ``train``, ``resume`` and ``import`` call :func:`make_run` and
:func:`make_branch` with the preset's text; the trainer writes the rest."""

from __future__ import annotations

import os
import re
import shutil
import time
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from workbench.errors import WorkbenchError
from workbench.fs import PidLock, atomic_dir, fsync_dir, write_atomic
from workbench.rundir.names import (
    CHECKPOINTS_DIR,
    CKPT_META,
    CKPT_MODEL,
    INIT_DIR,
    LOCK_FILE,
    PRESET_FILE,
    TEMPLATES_DIR,
    TOKENIZER_FILES,
    ckpt_name,
)
from workbench.rundir.status import read_status


class RunError(WorkbenchError):
    pass


# ----------------------------------------------------------------------------- making a run

_RUN_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")


def sanitize_run_name(name: str) -> str:
    """A run name that cannot escape the runs directory: letters, digits, '.', '_', '-'."""
    clean = _RUN_NAME_RE.sub("-", name.strip()).strip(".-")[:80]
    if not clean:
        raise RunError(f"run name {name!r} has no usable characters; use letters, digits, '.', '_' or '-'")
    return clean


def _new_run_dir(root: Path, preset_name: str, name: str | None = None) -> Path:
    """Create and return a fresh run directory. An explicit name that exists is an error."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"cannot create runs directory {root}: {e.strerror}; "
                       "choose another with --runs-dir or WORKBENCH_RUNS_DIR") from None
    if not os.access(root, os.W_OK):
        raise RunError(f"runs directory {root} is not writable; choose another with --runs-dir "
                       "or WORKBENCH_RUNS_DIR")
    if name:
        rid = sanitize_run_name(name)
        path = root / rid
        try:
            path.mkdir()
        except FileExistsError:
            raise RunError(f"a run named {rid!r} already exists in {root}; choose another --name "
                           f"or resume it with `workbench resume {rid}`") from None
        return path
    base = sanitize_run_name(f"{preset_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    for i in range(1000):
        path = root / (base if i == 0 else f"{base}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RunError(f"could not create a new run directory under {root}")


@contextmanager
def _create_run(root: Path, preset_name: str, name: str | None = None) -> Iterator[Path]:
    """A new run directory (:func:`_new_run_dir`) for the block to fill, removed again if the block raises, so
    a failed start, import or branch leaves nothing behind. The block's last write should be
    :func:`write_preset`: the preset's file is what makes a directory a run."""
    path = _new_run_dir(root, preset_name, name)
    try:
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def write_preset(run_dir: Path, toml_text: str) -> None:
    """The run's preset file (the resolved preset as TOML text), replaced atomically: written when the run
    is made, and again only by a resume that changes its keys."""
    write_atomic(Path(run_dir) / PRESET_FILE, toml_text)


# ----------------------------------------------------------------------------- files shared with another run

def link_file(src: Path, dst: Path) -> None:
    """``dst`` is ``src``: a hard link where the filesystem allows, else a copy. A run's weights and checkpoint
    files are never changed in place (only written whole and renamed, or deleted), so a link is as safe as a
    copy and costs no space; deleting either side never touches the other's."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def link_tree(src: Path, dst: Path) -> None:
    """``dst`` holds the files of ``src`` (:func:`link_file` each), made whole or not at all."""
    with atomic_dir(dst) as tmp:
        for f in sorted(Path(src).iterdir()):
            link_file(f, tmp / f.name)


def copy_tokenizer(src_dir: Path, dst_dir: Path) -> None:
    """``src_dir``'s tokenizer files and chat templates (TOKENIZER_FILES, TEMPLATES_DIR) into ``dst_dir``."""
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    for name in TOKENIZER_FILES:
        if (src_dir / name).is_file():
            write_atomic(dst_dir / name, (src_dir / name).read_bytes())
    if (src_dir / TEMPLATES_DIR).is_dir():
        (dst_dir / TEMPLATES_DIR).mkdir(exist_ok=True)
        for f in sorted((src_dir / TEMPLATES_DIR).glob("*.jinja")):
            write_atomic(dst_dir / TEMPLATES_DIR / f.name, f.read_bytes())


# ----------------------------------------------------------------------------- a new run, each way

def make_run(root: Path, preset_name: str, fill: Callable[[Path], str], name: str | None = None,
             cannot_write: Callable[[Path, OSError], Exception] | None = None) -> Path:
    """The one maker of run directories: a new one in ``root`` (``name``, else ``<preset_name>-<time>``),
    ``fill(run_dir)`` writes what the run starts with (a fine-tune's :func:`start_from`, an import's weights,
    a branch's checkpoint) and returns the preset's TOML text, written last: the preset's file is what makes
    the directory a run. Removed again if anything raises, so a failed start, import or branch leaves nothing
    behind. ``cannot_write``: the error an OSError of the filling becomes (else it goes up as it is)."""
    with _create_run(root, preset_name, name) as run_dir:
        try:
            write_preset(run_dir, fill(run_dir))
        except OSError as e:
            if cannot_write is None:
                raise
            raise cannot_write(run_dir, e) from None
    return run_dir


def start_from(run_dir: Path, weights: Path | None, tokenizer_dir: Path) -> None:
    """A fine-tune's start (``train --init-from``): ``run_dir``'s init/model.pt a hard link to ``weights``
    (else a copy; None: the caller writes it, e.g. a LoRA source's merged weights), and the source's tokenizer
    files and chat templates from ``tokenizer_dir``."""
    init = Path(run_dir) / INIT_DIR
    init.mkdir(exist_ok=True)
    if weights is not None:
        link_file(weights, init / CKPT_MODEL)
        fsync_dir(init)
    copy_tokenizer(tokenizer_dir, run_dir)


def make_branch(parent_dir: Path, ckpt: dict, root: Path, preset_toml: str, name: str | None = None) -> Path:
    """A new run (``name``, else :func:`branch_name`'s, numbered if taken) that continues ``parent_dir``'s
    checkpoint ``ckpt`` (a list_checkpoints entry): the checkpoint, the tokenizer and the starting weights
    (init/) linked, and ``preset_toml`` (whose ``[parent]`` names the run and step: its lineage) as its preset.
    Nothing in ``parent_dir`` changes."""
    parent_dir = Path(parent_dir)
    step = int(ckpt["step"])

    def fill(child: Path) -> str:
        (child / CHECKPOINTS_DIR).mkdir()
        link_tree(Path(ckpt["path"]), child / CHECKPOINTS_DIR / ckpt_name(step))
        copy_tokenizer(parent_dir, child)
        if (parent_dir / INIT_DIR).is_dir():
            link_tree(parent_dir / INIT_DIR, child / INIT_DIR)
        return preset_toml
    return make_run(root, parent_dir.name, fill, name or _free_name(root, branch_name(parent_dir, step)))


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


def _free_name(root: Path, base: str) -> str:
    for i in range(1000):
        candidate = base if i == 0 else f"{base}-{i + 1}"
        if not (root / candidate).exists():
            return candidate
    raise RunError(f"too many runs named {base}-N in {root}; give --name")


def parent_of(run_dir: Path) -> tuple[str, int] | None:
    """(parent run id, branch step) from the run's preset.toml (its ``[parent]``, written by
    :func:`make_branch`'s caller), or None."""
    try:
        data = tomllib.loads((Path(run_dir) / PRESET_FILE).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    p = data.get("parent")
    if isinstance(p, dict) and isinstance(p.get("run"), str) and isinstance(p.get("step"), int):
        return p["run"], p["step"]
    return None


# ----------------------------------------------------------------------------- the lock

class RunLock(PidLock):
    """One trainer per run directory: an flock on LOCK_FILE that the OS drops when the holder dies."""

    def __init__(self, run_dir: Path):
        super().__init__(Path(run_dir) / LOCK_FILE)

    def acquire(self) -> "RunLock":
        holder = self.try_acquire()
        if holder is not None:
            raise RunError(f"run {self.path.parent.name} is already being trained by process {holder}; "
                           f"stop it first with `workbench stop {self.path.parent.name}`")
        return self


# ----------------------------------------------------------------------------- deleting

def check_deletable(run_dir: Path, checkpoint: bool = False) -> None:
    """Refuse (RunError, one line) to delete a run, or one of its checkpoints, while a trainer works on it."""
    run_dir = Path(run_dir)
    if read_status(run_dir).live or RunLock(run_dir).held_by_other():
        raise RunError(f"{run_dir.name} is running; stop it first." if not checkpoint else
                       f"{run_dir.name} is running (it prunes its own checkpoints); stop it first.")


def delete_checkpoint(ckpt: dict) -> None:
    """Remove a checkpoint (its sidecar from ``list_checkpoints``): the completion marker first, so a kill
    mid-delete leaves no directory that looks complete but lacks files."""
    path = Path(ckpt["path"])
    try:
        os.unlink(path / CKPT_META)
    except OSError:
        pass
    shutil.rmtree(path, ignore_errors=True)


def delete_run(root: Path, run_dir: Path, ckpt: dict | None = None) -> None:
    """Delete the run ``run_dir`` inside the runs directory ``root``, or only its checkpoint ``ckpt``; refused
    for anything outside ``root`` and while a trainer works on the run (:func:`check_deletable`)."""
    root, run_dir = Path(root).resolve(), Path(run_dir)
    target = Path(ckpt["path"]) if ckpt is not None else run_dir
    if root not in target.resolve().parents:  # never remove anything outside the runs directory
        raise RunError(f"refusing to delete {target}: not inside {root}")
    check_deletable(run_dir, checkpoint=ckpt is not None)
    if ckpt is not None:
        delete_checkpoint(ckpt)
    else:
        shutil.rmtree(run_dir)


__all__ = ["branch_name", "check_deletable", "copy_tokenizer", "delete_checkpoint", "delete_run", "link_file",
           "link_tree", "make_branch", "make_run", "parent_of", "RunError", "RunLock", "sanitize_run_name",
           "start_from", "write_preset"]
