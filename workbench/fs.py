"""The filesystem helpers every layer shares: the one atomic writer, fsync, small JSON reads, a TOML file read.

Readers of a file written here see the old or the new contents, never half of one: data goes
to a temporary file in the same directory, is flushed (and fsynced unless asked not to), then
renamed over the target. No torch, no textual, no other workbench imports.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def cache_root() -> Path:
    """Where workbench keeps what it can rebuild: prepared corpora, the machine's measured matmul rate."""
    return Path(os.environ.get("WORKBENCH_CACHE_DIR") or Path.home() / ".cache" / "workbench")


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_atomic(path: str | os.PathLike, data: str | bytes, fsync: bool = True) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` by temporary file and rename.

    ``fsync=False`` keeps the atomicity but not the durability across a power loss (for files
    rewritten every few steps, such as status.json)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextmanager
def atomic_dir(final: str | os.PathLike, tmp_name: str | None = None, old_name: str | None = None) -> Iterator[Path]:
    """A directory written whole or not at all: yields a fresh temporary directory beside ``final``
    (``tmp_name``, default ``.<name>.tmp-<pid>``); when the block ends without an exception it is fsynced
    and renamed to ``final`` (a ``final`` already there is first renamed to ``old_name`` and removed after),
    and the rename made durable. On any exception the temporary directory is removed and ``final`` is
    left as it was. Checkpoints, branches, exports and TensorBoard files are written through it."""
    final = Path(final)
    tmp = final.with_name(tmp_name or f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        fsync_dir(tmp)
        if final.exists():  # a directory cannot be renamed over another on every OS: move it aside first
            old = final.with_name(old_name or f".{final.name}.old-{os.getpid()}")
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json_atomic(path: str | os.PathLike, obj: Any, fsync: bool = True) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n", fsync)


def read_json(path: str | os.PathLike) -> Any:
    """The parsed file, or None when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_toml(path: str | os.PathLike, error: type[Exception], unreadable: str, invalid: str) -> dict[str, Any]:
    """A TOML file's table. ``error`` with the ``unreadable`` or ``invalid`` message (formatted with ``path`` and
    ``why``) where the file cannot be read or is not valid TOML, so each reader keeps its own wording."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise error(unreadable.format(path=path, why=e.strerror or e)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise error(invalid.format(path=path, why=e)) from None


def dir_size(path: str | os.PathLike[str]) -> int:
    """Bytes of every file under ``path`` (links not followed), each file once however many hard links to it
    are there."""
    return dir_usage(path, set())[0]


def dir_usage(path: str | os.PathLike[str], seen: set[tuple[int, int]]) -> tuple[int, int]:
    """(bytes of the files under ``path`` not in ``seen``, bytes of those that were): each file (device, inode)
    counted once, across calls that share ``seen`` (this call's files are added to it). Links not followed."""
    new = old = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                old += st.st_size
            else:
                seen.add(key)
                new += st.st_size
    return new, old


class PidLock:
    """An exclusive flock on ``path`` holding the holder's pid, which the OS drops when the holder dies: one
    trainer per run (``rundir.RunLock``), one queue runner per runs directory (``queue.runner.RunnerLock``)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd: int | None = None

    def try_acquire(self) -> str | None:
        """Take the lock; None when taken, else the holder's pid as it wrote it ("?" if unknown)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return os.read(fd, 64).decode().strip() or "?"
            finally:
                os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def holder(self) -> int | None:
        """The pid of a live process holding the lock (-1 if it wrote none), None when none does; checked
        without keeping the lock."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except BlockingIOError:
            text = os.read(fd, 64).decode().strip()
            return int(text) if text.isdigit() else -1
        finally:
            os.close(fd)

    def held_by_other(self) -> bool:
        return self.holder() is not None
