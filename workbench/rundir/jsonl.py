"""The JSON-lines files of a run (``metrics.jsonl``, ``tasks.jsonl``, ``samples.jsonl``, the feedback files):
the trainer's writer, appends by other processes, and the readers: by byte offset (:class:`LineTail`), a
file's tail or head, or whole. The records themselves are :mod:`workbench.rundir.records`'s."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from workbench.rundir.records import EventRecord, Record, parse_record


def _line(d: dict[str, Any]) -> str:
    return json.dumps(d, separators=(",", ":")) + "\n"


class MetricsWriter:
    """Appends one JSON object per line to metrics.jsonl and flushes each line (the trainer's stream)."""

    def __init__(self, path: Path):
        self.f = open(path, "a", encoding="utf-8")

    def write(self, record: Record) -> None:
        self.f.write(_line(record.to_dict()))
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def append_jsonl(path: Path, objs: Iterable[dict[str, Any]]) -> None:
    """Append JSON objects to a JSON-lines file of a run, one a line (samples.jsonl's generations)."""
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(_line(d) for d in objs)


def append_feedback(path: Path, record: dict[str, Any]) -> int:
    """Append one preference pair or rating (the Sample pane's picks) to a run's preferences.jsonl or
    ratings.jsonl, flushed to disk; returns how many records the file holds now."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(_line(record))
        f.flush()
        os.fsync(f.fileno())
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def append_records(path: Path, records: Iterable[Record]) -> None:
    """Append typed records to a records file at once (``workbench eval``'s task records to tasks.jsonl)."""
    append_jsonl(path, (r.to_dict() for r in records))


class NullWriter:
    """What processes that do not own the run directory (ranks other than 0) write to."""

    def write(self, record: Record) -> None:
        pass

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------- reading

class LineTail:
    """Complete lines appended to a file since the last call, by byte offset (never re-reading it).

    A half-written last line waits for its newline. If the file shrinks (replaced),
    reading starts again from the beginning.
    """

    def __init__(self, path: Path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset
        self._partial = b""

    def read_lines(self, max_bytes: int = 4 << 20) -> list[bytes]:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return []
        if size < self.offset:
            self.offset, self._partial = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(max_bytes)
        self.offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        return lines


def _json_lines(lines: list[bytes]) -> list[dict]:
    out = []
    for line in lines:
        if line.strip():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


class MetricsTail(LineTail):
    """The records appended to metrics.jsonl since the last call (see LineTail)."""

    def read_new(self, max_bytes: int = 4 << 20) -> list[dict]:
        """As parsed JSON objects (``workbench metrics`` keeps every key, known or not)."""
        return _json_lines(self.read_lines(max_bytes))

    def read_records(self, max_bytes: int = 4 << 20) -> list[Record]:
        return [r for d in self.read_new(max_bytes) if (r := parse_record(d)) is not None]


def read_metrics(path: Path) -> list[Record]:
    """Every record of a metrics file (for one-shot readers)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return []
    return MetricsTail(path).read_records(max_bytes=size + 1)


def read_jsonl_tail(path: Path, tail_bytes: int = 65536) -> list[dict]:
    """The JSON objects in the last ``tail_bytes`` of a JSON-lines file (metrics, samples)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return []
    return MetricsTail(path, offset=max(0, size - tail_bytes)).read_new(max_bytes=tail_bytes)


def last_records(path: Path, tail_bytes: int = 65536) -> list[Record]:
    """Records from the last ``tail_bytes`` of a metrics file, for quick summaries."""
    return [r for d in read_jsonl_tail(path, tail_bytes) if (r := parse_record(d)) is not None]


def first_event(path: Path, event: str | tuple[str, ...], head_bytes: int = 16384) -> EventRecord | None:
    """The first event of that name (or one of those names) within the file's first ``head_bytes``
    (e.g. the run's start, or a branch's first resume)."""
    names = (event,) if isinstance(event, str) else event
    try:
        with open(path, "rb") as f:
            head = f.read(head_bytes)
    except OSError:
        return None
    for d in _json_lines(head.split(b"\n")):
        r = parse_record(d)
        if isinstance(r, EventRecord) and r.event in names:
            return r
    return None


__all__ = ["append_feedback", "append_jsonl", "append_records", "first_event", "last_records", "LineTail",
           "MetricsTail", "MetricsWriter", "NullWriter", "read_jsonl_tail", "read_metrics"]
