"""The filesystem helpers every layer shares: the one atomic writer, fsync, small JSON reads.

Readers of a file written here see the old or the new contents, never half of one: data goes
to a temporary file in the same directory, is flushed (and fsynced unless asked not to), then
renamed over the target. No torch, no textual, no other workbench imports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


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


def write_json_atomic(path: str | os.PathLike, obj: Any, fsync: bool = True) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n", fsync)


def read_json(path: str | os.PathLike) -> Any:
    """The parsed file, or None when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def dir_size(path: str | os.PathLike) -> int:
    """Bytes of every file under ``path`` (links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total
