"""Records: every JSON-lines and parquet file a user gives (corpus documents, conversations, eval tasks) is read
here, one record at a time, as ``(where, record)``: ``where`` names the file and the line or row ("corpus file
F, line N", "task F, row N") and ``record`` is a JSON object (a dict); and a whole JSON document (a tokenizer's
config, a template file) is parsed here too (:func:`parse_json`). No torch.

The wording of what can go wrong with the records themselves lives here, once: a line that is not JSON or not UTF-8, a
record that is not an object, a file that is one JSON array instead of JSON lines, a parquet file that cannot be opened,
a compressed stream that is truncated or corrupt. The readers above it (:mod:`~workbench.data.corpus.documents`,
:mod:`~workbench.data.chat.conversations`, :mod:`~workbench.data.tasks.task_files`) check only their own fields, and
report a bad record through :meth:`RecordReader.bad`, which raises or, with ``data.skip_bad_records``, counts it and
goes on.
"""

from __future__ import annotations

import gzip
import json
import lzma
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator, TypeVar

from workbench.data.corpus.sources import ByteStream, CorpusError, Source, open_bytes
from workbench.errors import WorkbenchError

FIX_RECORDS = "fix it, or set data.skip_bad_records = true to skip bad records"

T = TypeVar("T")
Record = dict[str, Any]


class Where(str):
    """Where a message about a record points, "corpus file F, line N" (or "row N" in parquet); ``number`` is
    that N. A string everywhere a message is made (and pickled as one, with its number, to encoding processes)."""
    number: int

    def __new__(cls, text: str, number: int) -> "Where":
        where = super().__new__(cls, text)
        where.number = number
        return where

    def __getnewargs__(self) -> tuple[str, int]:  # type: ignore[override]  # str's has no number to carry
        return str(self), self.number

    @classmethod
    def of(cls, label: str, path: str, unit: str, number: int) -> "Where":
        return cls(f"{label} {path}, {unit} {number}", number)


@dataclass
class Stats:
    """What a pass over a corpus saw."""
    documents: int = 0
    chars: int = 0
    bytes_read: int = 0        # input bytes consumed (compressed bytes for compressed files)
    skipped_binary: int = 0
    skipped_empty: int = 0
    skipped_records: int = 0
    first_bad_record: str = ""
    replaced: dict[str, int] = field(default_factory=dict)  # file -> count of undecodable bytes replaced
    position: Callable[[], int] = lambda: 0        # bytes consumed of the file being read

    def bytes_done(self) -> int:
        return self.bytes_read + self.position()


def json_type(v: Any) -> str:
    """A JSON value's type as a message names it ("a list", "null")."""
    return {bool: "true/false", int: "a number", float: "a number", list: "a list", dict: "an object",
            type(None): "null"}.get(type(v), type(v).__name__)


def byte_lines(stream: ByteStream, block: int = 1 << 20) -> Iterator[bytes]:
    """The lines of a byte stream (without their newlines), read a block at a time."""
    rest = b""
    while True:
        chunk = stream.read(block)
        if not chunk:
            break
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


def parse_json(text: str | bytes, what: str, error: type[WorkbenchError], fix: str = "") -> Any:
    """A whole JSON document (a tokenizer's config, a template file), not records: its value, or ``error``
    naming ``what`` and, if given, how to ``fix`` it."""
    try:
        return json.loads(text)
    except ValueError as e:  # UnicodeDecodeError too
        raise error(f"{what} is not valid JSON ({e})" + (f"; {fix}" if fix else "")) from None


def _is_zstd_error(e: BaseException) -> bool:
    """zstandard.ZstdError and friends (the module is imported only when a .zst file is read)."""
    return type(e).__module__.startswith("zstandard") or "zstd" in type(e).__name__.lower()


def _pyarrow() -> tuple[Any, Any]:
    """(pyarrow, pyarrow.parquet), imported only when a parquet file is read."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise CorpusError("reading parquet needs pyarrow, which is not installed; pip install pyarrow") from None
    return pa, pq


@dataclass
class RecordReader:
    """Reads the records of one kind of user file and says what is wrong with them.

    ``label`` is how a message names a file ("corpus file", "task"); ``error`` is raised for a file that cannot
    be read as records at all, ``bad_error`` (default: ``error``) for one bad record, whose message ends with
    ``fix``; with ``skip_bad`` a bad record is counted into ``stats`` instead. ``stats`` also counts the bytes
    read, for progress."""
    label: str = "corpus file"
    error: type[WorkbenchError] = CorpusError
    bad_error: type[WorkbenchError] | None = None
    skip_bad: bool = False
    fix: str = FIX_RECORDS
    stats: Stats = field(default_factory=Stats)

    def bad(self, msg: str) -> None:
        """One bad record (``msg`` starts with its ``where``): raised, or counted and skipped."""
        if not self.skip_bad:
            raise (self.bad_error or self.error)(f"{msg}; {self.fix}")
        self.stats.skipped_records += 1
        self.stats.first_bad_record = self.stats.first_bad_record or msg

    def corrupt(self, src: Source, e: BaseException) -> WorkbenchError:
        detail = str(e).strip() or type(e).__name__
        return self.error(f"{self.label} {src.path} is truncated or corrupt ({src.compression or 'read'}: "
                          f"{detail}); download or compress it again")

    # ------------------------------------------------------------------------- streams of bytes

    def stream(self, src: Source, read: Callable[[ByteStream], Iterator[T]]) -> Generator[T, None, None]:
        """What ``read`` makes of ``src``'s decompressed bytes, with an unreadable file, a truncated or corrupt
        stream each one line, and the bytes it read counted."""
        try:
            stream, raw = open_bytes(src)
        except OSError as e:
            raise self.error(f"cannot read {self.label} {src.path}: {e.strerror}") from None
        self.stats.position = raw.tell
        try:
            yield from read(stream)
            end = raw.tell()
        except (EOFError, OSError, lzma.LZMAError, gzip.BadGzipFile) as e:
            if isinstance(e, OSError) and not src.compression:
                raise self.error(f"cannot read {self.label} {src.path}: {e.strerror or e}") from None
            raise self.corrupt(src, e) from None
        except Exception as e:  # noqa: BLE001 - zstandard.ZstdError and friends: the file is not what it says
            if _is_zstd_error(e):
                raise self.corrupt(src, e) from None
            raise
        finally:
            self.stats.position = lambda: 0
            raw.close()
        self.stats.bytes_read += end

    # ------------------------------------------------------------------------- records

    def records(self, src: Source, columns: tuple[str, ...] | list[str] | None = None,
                batch_size: int = 256) -> Generator[tuple[Where, Record], None, None]:
        """Every record of a JSONL or parquet file, in order. ``columns``: a parquet file's columns to read
        (those it has; default all), ``batch_size`` its rows read at once."""
        if src.kind == "parquet":
            return self._parquet(src, columns, batch_size)
        return self.stream(src, lambda stream: self._lines(src, stream))

    def first(self, src: Source) -> Record | None:
        """The file's first record, read alone (None: it has none)."""
        records = self.records(src, batch_size=1)
        try:
            item = next(records, None)
        finally:
            records.close()
        return item[1] if item else None

    def _lines(self, src: Source, stream: ByteStream) -> Iterator[tuple[Where, Record]]:
        array = (f"{self.label} {src.path} is one JSON array, not JSON lines (one object a line); convert it, e.g. "
                 f"`jq -c '.[]' {src.path} > x.jsonl`")
        for lineno, line in enumerate(byte_lines(stream), 1):
            if not line.strip():
                continue
            where = Where.of(self.label, src.path, "line", lineno)
            try:
                rec = json.loads(line)
            except UnicodeDecodeError:
                self.bad(f"{where}: not UTF-8 text (save the file as UTF-8)")
                continue
            except ValueError as e:
                if lineno == 1 and line.lstrip()[:1] == b"[":
                    raise self.error(array) from None
                self.bad(f"{where}: not valid JSON ({str(e).split(':')[0]})")
                continue
            if not isinstance(rec, dict):
                if lineno == 1 and isinstance(rec, list):
                    raise self.error(array)
                self.bad(f"{where}: a record is a JSON object, not {json_type(rec)}")
                continue
            yield where, rec

    def parquet_columns(self, src: Source) -> dict[str, str]:
        """A parquet file's columns and their types (``string``, ``large_string``, ``int64``, ...), from its
        schema (no rows read)."""
        return {f.name: str(f.type) for f in self._parquet_file(src).schema_arrow}

    def _parquet_file(self, src: Source) -> Any:
        pa, pq = _pyarrow()
        try:
            return pq.ParquetFile(src.path)
        except (OSError, pa.ArrowException) as e:
            raise self.error(f"{self.label} {src.path} is not a readable parquet file "
                             f"({str(e).splitlines()[0][:160]})") from None

    def _parquet(self, src: Source, columns: tuple[str, ...] | list[str] | None,
                 batch_size: int) -> Generator[tuple[Where, Record], None, None]:
        pa, _ = _pyarrow()
        pf = self._parquet_file(src)
        names = pf.schema_arrow.names
        wanted = None if columns is None else [c for c in columns if c in names]
        row, rows = 0, max(1, pf.metadata.num_rows)
        self.stats.position = lambda: int(src.size * row / rows)
        try:
            for batch in pf.iter_batches(columns=wanted, batch_size=batch_size):
                for rec in batch.to_pylist():
                    row += 1
                    yield Where.of(self.label, src.path, "row", row), rec
        except (OSError, pa.ArrowException) as e:
            raise self.corrupt(src, e) from None
        finally:
            self.stats.position = lambda: 0
        self.stats.bytes_read += src.size


__all__ = ["FIX_RECORDS", "Record", "RecordReader", "Stats", "Where", "byte_lines", "json_type", "parse_json"]
