"""The one writer of run directories: making a run (never half of one), its preset's file, the files it
shares with another run (hard links, else copies), the lock its trainer holds, and deleting a run or a
checkpoint (never one a trainer is working on). What goes into the files is decided above: the trainer,
the launcher and ``workbench import`` call these."""

from __future__ import annotations

import os
import re
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from workbench.errors import WorkbenchError
from workbench.fs import PidLock, atomic_dir, write_atomic
from workbench.rundir.names import (
    CKPT_META,
    LOCK_FILE,
    PRESET_FILE,
    TEMPLATES_DIR,
    TOKENIZER_FILES,
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


def new_run_dir(root: Path, preset_name: str, name: str | None = None) -> Path:
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
def create_run(root: Path, preset_name: str, name: str | None = None) -> Iterator[Path]:
    """A new run directory (:func:`new_run_dir`) for the block to fill, removed again if the block raises, so
    a failed start, import or branch leaves nothing behind. The block's last write should be
    :func:`write_preset`: the preset's file is what makes a directory a run."""
    path = new_run_dir(root, preset_name, name)
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


__all__ = ["check_deletable", "copy_tokenizer", "create_run", "delete_checkpoint", "delete_run", "link_file",
           "link_tree", "new_run_dir", "RunError", "RunLock", "sanitize_run_name", "write_preset"]
