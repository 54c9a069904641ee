"""A precomputed reference (``train.pref_reference``): the reference model's summed log-prob of every answer of a
prepared preference corpus, one float32 per conversation, kept **with the prepared data** (in its cache
directory, which its own key names) and memory-mapped like its tokens. No torch: the pass that fills it is
:mod:`workbench.train.reference`.

Two files per table, named by a key of what its numbers depend on (the reference checkpoint's digest, the rows'
length ``model.seq_len`` that cuts an answer, the precision and the device type of the forward):

* ``reference-<key>.f32``: the log-probs, conversation ``c`` at ``c``, little-endian float32; written in chunks as
  the pass goes (bounded memory) to a temporary, fsynced and renamed;
* ``reference-<key>.json``: written last, so a table without it is unfinished: what it was computed from (the
  data's key, the checkpoint's digest, seq_len, precision, device, the chunk of rows a forward took), its row
  count and the sha256 of the ``.f32``.

Opening checks all of it; a table that is corrupt (bytes changed, cut short), of the wrong row count or made
from other inputs is refused with one line naming the file and the fix (remove it: the next start computes it
again; or ``--set train.pref_reference=live``), never used.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np

from workbench.data.text.prepare import DataError
from workbench.fs import fsync_dir, read_json, write_json_atomic

TABLE_VERSION = 1
DTYPE = np.dtype("<f4")
_BLOCK = 1 << 20


class ReferenceTableError(DataError):
    """A precomputed reference that cannot be used as it is (exit 2)."""


def file_digest(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks (a checkpoint of gigabytes never whole in memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def table_facts(data_key: str, reference_digest: str, seq_len: int, precision: str, device: str) -> dict:
    """What a table's numbers depend on (its sidecar records them; the file's name is their hash)."""
    return {"version": TABLE_VERSION, "data": data_key, "reference_sha256": reference_digest, "seq_len": seq_len,
            "precision": precision, "device": device}


def table_paths(data_dir: Path, facts: dict) -> tuple[Path, Path]:
    """The table's ``.f32`` and its sidecar in the prepared data's directory."""
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return data_dir / f"reference-{key}.f32", data_dir / f"reference-{key}.json"


def _refuse(path: Path, what: str) -> ReferenceTableError:
    return ReferenceTableError(
        f"the precomputed reference log-probs {path} {what}: remove them (rm {path.with_suffix('')}.*) and the next "
        "start computes them again, or --set train.pref_reference=live")


def open_table(data_dir: Path, facts: dict, rows: int) -> tuple[np.ndarray, dict] | None:
    """The table of ``facts`` for a corpus of ``rows`` answers, memory-mapped, and its sidecar; None when there is
    none yet (or an unfinished one: no sidecar). A ReferenceTableError for one that cannot be used."""
    path, side_path = table_paths(data_dir, facts)
    side = read_json(side_path) if side_path.exists() else None
    if side_path.exists() and not isinstance(side, dict):
        raise _refuse(path, f"have an unreadable sidecar {side_path.name}")
    if side is None:
        return None
    made = {k: side.get(k) for k in facts}
    if made != facts:
        diff = ", ".join(f"{k} {made[k]!r} (wanted {facts[k]!r})" for k in facts if made[k] != facts[k])
        raise _refuse(path, f"were made from other inputs: {diff}")
    if not path.exists():
        raise _refuse(path, "are missing (their sidecar is there)")
    size = path.stat().st_size
    if side.get("rows") != rows or size != rows * DTYPE.itemsize:
        raise _refuse(path, f"hold {size // DTYPE.itemsize:,} rows ({size:,} bytes; the sidecar says "
                            f"{side.get('rows')}), but the prepared corpus has {rows:,} answers: truncated or "
                            "of another corpus")
    if file_digest(path) != side.get("sha256"):
        raise _refuse(path, "do not match the sha256 their sidecar recorded (the file was changed or corrupted)")
    table = np.memmap(path, dtype=DTYPE, mode="r", shape=(rows,))
    if not np.isfinite(table).all():
        raise _refuse(path, "hold a value that is not finite")
    return table, side


def write_table(data_dir: Path, facts: dict, rows: int, chunks: Iterable[np.ndarray], extra: dict) -> Path:
    """Write a table from ``chunks`` (the log-probs in row order, as the pass computes them): a temporary file,
    fsynced and renamed, then the sidecar (``facts``, ``extra``, the row count and the sha256) last. Nothing
    half-written is ever taken for a table: an interrupted pass leaves only a temporary, removed here."""
    path, side_path = table_paths(data_dir, facts)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    h = hashlib.sha256()
    n = 0
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                b = np.ascontiguousarray(chunk, dtype=DTYPE).tobytes()
                h.update(b)
                f.write(b)
                n += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        if n != rows:
            raise RuntimeError(f"the reference pass gave {n} rows, not {rows}")
        side_path.unlink(missing_ok=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    write_json_atomic(side_path, {**facts, **extra, "rows": rows, "sha256": h.hexdigest()})
    fsync_dir(data_dir)
    return path


def clean_temporaries(data_dir: Path) -> None:
    """Remove what interrupted passes (kill -9) left."""
    for t in data_dir.glob(".reference-*.tmp"):
        t.unlink(missing_ok=True)


__all__ = ["ReferenceTableError", "TABLE_VERSION", "clean_temporaries", "file_digest", "open_table", "table_facts",
           "table_paths", "write_table"]
