"""Documents: every reader of what ``data.corpus`` names, streamed (never held whole), in one place.

A corpus is a path, a glob, or a list of them, or ``builtin``. Each file is read by its name:

- ``*.jsonl`` / ``*.json``: one JSON object a line; ``data.text_field`` (default ``text``) is a document
- ``*.parquet``: one document a row, from the ``data.text_field`` column (pyarrow, in batches)
- anything else: UTF-8 text, one document a file (bytes that are not UTF-8 become U+FFFD, with a warning)
- ``.gz``, ``.zst`` and ``.xz`` after any of those: compressed (``x.jsonl.zst``, ``notes.txt.gz``)

Directories are walked recursively (hidden files and directories skipped, symbolic links followed,
a link loop refused); in a directory, binary files (a NUL byte in the first 8 KB) and empty files
are skipped with a warning. ``builtin`` is Python's own documentation and standard-library
sources, assembled on this machine, one document per topic or file.

:func:`open_corpus` only lists and stats the files (:mod:`workbench.data.corpus.sources`; no content is read: a
start whose tokens are cached reads no corpus bytes); :meth:`Corpus.pieces` streams the text, whatever the
format. Bad input raises
:class:`CorpusError` naming the file and, where it applies, the line or row; with
``data.skip_bad_records`` bad records are counted and skipped instead. No torch here.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from workbench.data.corpus.record_reader import RecordReader, Stats, json_type
from workbench.data.corpus.sources import SNIFF_BYTES, ByteStream, CorpusError, Source, builtin_source, expand

HELD_OUT_TOPICS_PERCENT = 12   # of the documentation topics, held out for the built-in eval tasks
HELD_OUT_FILES_PERCENT = 5     # of the standard-library sources, likewise
PIECE_CHARS = 1 << 20       # a long text document is streamed in pieces of about this many characters


Piece = tuple[str, bool]   # (text, whether it ends a document)


READER_VERSION = 2  # bump when what a reader extracts changes, so cached tokens are rebuilt


def split_document(text: str, stats: Stats) -> Iterator[Piece]:
    """One document as pieces of at most ~PIECE_CHARS characters, cut after a newline where there is one."""
    stats.documents += 1
    stats.chars += len(text)
    pos, n = 0, len(text)
    while n - pos > PIECE_CHARS:
        cut = text.rfind("\n", pos, pos + PIECE_CHARS)
        end = cut + 1 if cut > pos else pos + PIECE_CHARS
        yield text[pos:end], False
        pos = end
    yield text[pos:], True


def text_pieces(src: Source, stream: ByteStream, stats: Stats) -> Iterator[Piece]:
    """A text file as one document, decoded incrementally (bad UTF-8 replaced and counted)."""
    head = stream.read(SNIFF_BYTES)
    if b"\x00" in head:
        if src.in_directory:
            stats.skipped_binary += 1
            return
        raise CorpusError(f"corpus {src.path!r} looks like a binary file (it contains NUL bytes); "
                          "give a UTF-8 text file")
    bad = [0]

    def count(e: UnicodeError) -> tuple[str, int]:
        assert isinstance(e, UnicodeDecodeError)  # registered for this decoder only
        bad[0] += e.end - e.start
        return "\ufffd", e.end

    handler = f"workbench-count-{id(bad)}"
    codecs.register_error(handler, count)
    decoder = codecs.getincrementaldecoder("utf-8")(errors=handler)
    buf, started, chunk = "", False, head
    while True:
        final = not chunk
        buf += decoder.decode(chunk, final=final)
        while len(buf) > PIECE_CHARS:
            cut = buf.rfind("\n", 0, PIECE_CHARS)
            end = cut + 1 if cut >= 0 else PIECE_CHARS
            if not started:
                stats.documents, started = stats.documents + 1, True
            stats.chars += end
            yield buf[:end], False
            buf = buf[end:]
        if final:
            break
        chunk = stream.read(PIECE_CHARS)
    if bad[0]:
        stats.replaced[src.path] = bad[0]
    if not started and not buf.strip():  # whitespace only: nothing to learn from
        if not src.in_directory:
            raise CorpusError(f"corpus {src.path!r} is empty; give a file with text in it")
        stats.skipped_empty += 1
        return
    if not started:
        stats.documents += 1
    stats.chars += len(buf)
    yield buf, True


def _held_out(key: str, percent: int) -> bool:
    """Whether a built-in document is held out of every built-in corpus (a stable hash of its name)."""
    return int(hashlib.sha256(f"heldout:{key}".encode()).hexdigest()[:8], 16) % 100 < percent


def _stdlib_files() -> list[tuple[str, Path]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py"))
    return [(str(path.relative_to(stdlib)), path) for path in paths
            if not ("test" in path.parts[-2:-1] or path.name.startswith("test"))]


def _read_source(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def builtin_documents(held_out: bool = False) -> Iterator[tuple[str, str, str]]:
    """The built-in corpus's documents in order, as (kind, name, text): Python's documentation topics
    ("doc"), then standard-library sources ("code"). About 12 % of the topics and 5 % of the sources
    (chosen by a hash of their names; installed packages never) are held out of every built-in corpus,
    whatever its size, for the built-in eval tasks: ``held_out=True`` gives those alone."""
    import pydoc_data.topics as topics  # lazily: a megabyte of text, loaded only for the built-in corpus

    for key in sorted(topics.topics):
        if _held_out(f"topic:{key}", HELD_OUT_TOPICS_PERCENT) == held_out:
            yield "doc", key, topics.topics[key].strip() + "\n"
    for name, path in _stdlib_files():
        package = name.startswith(("site-packages", "dist-packages"))
        if (not package and _held_out(f"file:{name}", HELD_OUT_FILES_PERCENT)) == held_out:
            text = _read_source(path)
            if text is not None:
                yield "code", name, f"# file: {name}\n" + text


def builtin_pieces(src: Source, stats: Stats) -> Iterator[Piece]:
    """The built-in documents that are not held out, up to the size in the source's name."""
    limit = src.size
    size = 0
    for _, _, text in builtin_documents():
        text = text[: max(0, limit - size)]
        if text:
            size += len(text)
            yield from split_document(text, stats)
        if size >= limit:
            return


__all__ = ["Corpus", "CorpusError", "Piece", "Source", "Stats", "builtin_documents", "open_corpus", "warnings_of"]


@dataclass
class Corpus:
    """The files a ``data.corpus`` names, and how to read documents out of them."""
    spec: list[str]
    sources: list[Source]
    text_field: str = "text"
    skip_bad: bool = False
    empty_files: int = 0        # empty files found in directories (skipped when listing)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.sources)

    @property
    def description(self) -> str:
        if len(self.sources) == 1 and self.sources[0].kind == "builtin":
            return f"builtin (Python {sysconfig.get_python_version()} docs + stdlib)"
        files = f"{len(self.sources)} file{'s' if len(self.sources) != 1 else ''}"
        name = self.spec[0] if len(self.spec) == 1 else f"{self.spec[0]} and {len(self.spec) - 1} more"
        return name if len(self.sources) == 1 and self.sources[0].path == name else f"{name} ({files})"

    def manifest(self) -> dict:
        """What identifies the input without reading it: paths, sizes, modification times, options."""
        return {"sources": [s.stat_key() for s in self.sources], "text_field": self.text_field,
                "skip_bad_records": self.skip_bad, "reader": READER_VERSION}

    def manifest_key(self) -> str:
        return hashlib.sha256(json.dumps(self.manifest(), sort_keys=True).encode()).hexdigest()[:20]

    def check_first_records(self) -> None:
        """Read the first record of the first JSONL and the first parquet file (and nothing more), so a
        wrong data.text_field is reported before a run starts preparing in the background."""
        for kind in ("jsonl", "parquet"):
            src = next((s for s in self.sources if s.kind == kind), None)
            if src is not None:
                one = Corpus(self.spec, [src], self.text_field, self.skip_bad)
                next(one.pieces(), None)

    def pieces(self, stats: Stats | None = None, on_source_done: Callable[[Source], None] | None = None
               ) -> Iterator[Piece]:
        """Every document's text, in pieces of at most about PIECE_CHARS characters (cut at newlines), the
        last piece of each document marked. Counts into ``stats``."""
        stats = stats if stats is not None else Stats()
        reader = RecordReader(skip_bad=self.skip_bad, stats=stats)
        for src in self.sources:
            if src.kind == "builtin":
                yield from builtin_pieces(src, stats)
            elif src.kind == "text":
                yield from reader.stream(src, lambda stream: text_pieces(src, stream, stats))
            else:
                yield from self._record_pieces(reader, src)
            if on_source_done:
                on_source_done(src)
        if stats.documents == 0:
            raise CorpusError(self._no_documents(stats))

    def _no_documents(self, stats: Stats) -> str:
        empty = stats.skipped_empty + self.empty_files
        if len(self.spec) == 1 and os.path.isdir(os.path.expanduser(self.spec[0])):
            return (f"corpus directory {self.spec[0]!r} has no text files ({stats.skipped_binary} binary, {empty} "
                    "empty); put UTF-8 text files in it or use --corpus builtin")
        return (f"corpus {', '.join(self.spec)} has no documents with text in them ({stats.skipped_binary} binary "
                f"file(s), {empty} empty, {stats.skipped_records} bad record(s) skipped)")

    def _record_pieces(self, reader: RecordReader, src: Source) -> Iterator[Piece]:
        """The documents of a JSONL or parquet file: each record's ``data.text_field``."""
        field_ = self.text_field
        if src.kind == "parquet":
            columns = reader.parquet_columns(src)
            if field_ not in columns:
                raise CorpusError(f"corpus file {src.path} has no column {field_!r} (its columns: "
                                  f"{', '.join(list(columns)[:20])}); set data.text_field to the column that holds "
                                  "the text")
            if columns[field_] not in ("string", "large_string"):
                raise CorpusError(f"corpus file {src.path}: column {field_!r} is {columns[field_]}, not a string; "
                                  "set data.text_field to the column that holds the text")
        for where, rec in reader.records(src, columns=[field_], batch_size=1024):
            if field_ not in rec:
                reader.bad(f"{where}: the record has no field {field_!r} (it has: {', '.join(list(rec)[:12])}); "
                           "set data.text_field to the field that holds the text")
                continue
            text = rec[field_]
            if not isinstance(text, str):
                reader.bad(f"{where}: field {field_!r} is {json_type(text)}, not a string")
                continue
            if text:
                yield from split_document(text, reader.stats)


def open_corpus(spec: str | list[str], text_field: str = "text", skip_bad: bool = False,
                builtin_mb: float = 6.0) -> Corpus:
    """The files ``spec`` names, listed and stat'ed (nothing read yet)."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        raise CorpusError("data.corpus is an empty list; give a path, a glob, a list of them, or builtin")
    found: list[Source] = []
    for s in specs:
        found += [builtin_source(builtin_mb)] if s == "builtin" else expand(s)
    sources = [s for s in found if s.size > 0]
    corpus = Corpus(spec=specs, sources=sources, text_field=text_field, skip_bad=skip_bad,
                    empty_files=len(found) - len(sources))
    if not sources:
        raise CorpusError(corpus._no_documents(Stats()))
    return corpus


def warnings_of(corpus: Corpus, stats: Stats) -> list[str]:
    """The warnings a pass over the corpus produced, one line each."""
    out = [f"{path}: {n} byte(s) that are not UTF-8 were replaced with U+FFFD" for path, n in stats.replaced.items()]
    where = ", ".join(corpus.spec)
    if stats.skipped_binary:
        out.append(f"skipped {stats.skipped_binary} binary file(s) in {where}")
    if stats.skipped_empty + corpus.empty_files:
        out.append(f"skipped {stats.skipped_empty + corpus.empty_files} empty file(s) in {where}")
    if stats.skipped_records:
        out.append(f"skipped {stats.skipped_records} bad record(s) (data.skip_bad_records); the first: "
                   f"{stats.first_bad_record}")
    return out
