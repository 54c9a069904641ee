"""The files a ``data.corpus`` entry names: listed and stat'ed (nothing read: a cached start reads no corpus
bytes), each a :class:`Source` of a kind (text, JSONL, parquet, builtin) and a compression, and opened as
a stream of decompressed bytes. Reading records out of them is :mod:`workbench.data.corpus.record_reader`, documents
:mod:`workbench.data.corpus.documents`."""

from __future__ import annotations

import glob
import gzip
import lzma
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Protocol

from workbench.errors import WorkbenchError

SNIFF_BYTES = 8192          # a NUL byte in these first bytes marks a binary file
COMPRESSIONS = {".gz": "gz", ".zst": "zst", ".xz": "xz"}
JSONL_SUFFIXES = (".jsonl", ".json")


class CorpusError(WorkbenchError):
    pass


@dataclass(frozen=True)
class Source:
    """One input file: what it is, and its size and modification time (the cache's manifest)."""
    path: str
    kind: str                  # text | jsonl | parquet | builtin
    compression: str | None    # gz | zst | xz
    size: int
    mtime_ns: int
    in_directory: bool = False  # found by walking a directory (binary / empty files skipped, not errors)

    def stat_key(self) -> list:
        return [self.path, self.size, self.mtime_ns]


def kind_of(path: Path) -> tuple[str, str | None]:
    """(kind, compression) from a file's name."""
    name = path.name.lower()
    comp = next((c for suffix, c in COMPRESSIONS.items() if name.endswith(suffix)), None)
    if comp:
        name = name[: name.rfind(".")]
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl", comp
    if name.endswith(".parquet"):
        if comp:
            raise CorpusError(f"corpus file {path}: compressed parquet is not supported (parquet compresses its "
                              "own columns); decompress it")
        return "parquet", None
    return "text", comp


# ----------------------------------------------------------------------------- listing the files

def _stat_source(path: Path, in_directory: bool) -> Source:
    try:
        st = path.stat()
    except OSError as e:
        what = " (a dangling symbolic link?)" if path.is_symlink() else ""
        raise CorpusError(f"cannot read corpus file {path}: {e.strerror}{what}") from None
    kind, comp = kind_of(path)
    return Source(str(path), kind, comp, st.st_size, st.st_mtime_ns, in_directory)


def _walk(root: Path) -> Iterator[Path]:
    """Files under ``root`` in sorted order, following symbolic links, refusing a link loop."""
    seen: set[tuple[int, int]] = set()

    def visit(d: Path) -> Iterator[Path]:
        st = d.stat()
        if (st.st_dev, st.st_ino) in seen:
            raise CorpusError(f"corpus directory {root} contains a symbolic-link loop at {d} (it leads back to "
                              f"{os.path.realpath(d)}); remove the link or point --corpus at a directory without it")
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as e:
            raise CorpusError(f"cannot read corpus directory {d}: {e.strerror}") from None
        for entry in entries:
            if entry.name.startswith("."):
                continue
            p = Path(entry.path)
            if entry.is_dir(follow_symlinks=True):
                yield from visit(p)
            else:
                yield p

    yield from visit(root)


def expand(spec: str) -> list[Source]:
    """The files one corpus entry names (a file, a directory, or a glob), stat'ed, not read."""
    if any(c in spec for c in "*?["):
        matches = sorted(glob.glob(os.path.expanduser(spec), recursive=True))
        if not matches:
            raise CorpusError(f"corpus glob {spec!r} matches no files; check the pattern (quote it in the shell so "
                              "workbench sees the pattern, e.g. --corpus 'data/*.jsonl')")
        out: list[Source] = []
        for m in matches:
            p = Path(m)
            out += expand_path(p, p.is_dir())
        return out
    path = Path(spec).expanduser()
    if not path.exists() and not path.is_symlink():
        raise CorpusError(f"corpus {spec!r} does not exist; give a text file, a directory of text files, "
                          "or builtin (the built-in corpus)")
    return expand_path(path, path.is_dir())


def expand_path(path: Path, is_dir: bool) -> list[Source]:
    if not is_dir:
        src = _stat_source(path, in_directory=False)
        if src.size == 0:
            raise CorpusError(f"corpus {str(path)!r} is empty; give a file with text in it")
        return [src]
    return [_stat_source(p, in_directory=True) for p in _walk(path)]


# The built-in corpus's edition, in its manifest where a file has its mtime: a cache made from another
# edition is re-encoded (2: documents held out for the built-in eval tasks).
BUILTIN_EDITION = 2


def builtin_source(max_mb: float) -> Source:
    return Source(f"builtin:python-{sysconfig.get_python_version()}:{max_mb:g}MB", "builtin", None,
                  int(max_mb * 1_000_000), BUILTIN_EDITION)


# ----------------------------------------------------------------------------- reading bytes

class ByteStream(Protocol):
    """What a reader reads a file's decompressed bytes from (a plain file, gzip, xz or zstd)."""

    def read(self, n: int, /) -> bytes: ...


class _ZstdReader:
    """A zstd stream that says when it is truncated (the library's stream reader does not)."""

    def __init__(self, raw: IO[bytes]):
        import zstandard  # lazily: loaded only when a .zst file is read
        self.raw, self.dctx = raw, zstandard.ZstdDecompressor()
        self.obj, self.fed, self.pending = self.dctx.decompressobj(), False, b""

    def read(self, n: int) -> bytes:
        while not self.pending:
            chunk = self.raw.read(n)
            if not chunk:
                if self.fed:
                    raise EOFError("the file ends in the middle of a zstd frame")
                return b""
            out = []
            while chunk:
                self.fed = True
                out.append(self.obj.decompress(chunk))
                if self.obj.eof:
                    chunk, self.obj, self.fed = self.obj.unused_data, self.dctx.decompressobj(), False
                else:
                    chunk = b""
            self.pending = b"".join(out)
        data, self.pending = self.pending[:n], self.pending[n:]
        return data


def open_bytes(src: Source) -> tuple[ByteStream, IO[bytes]]:
    """(the decompressed stream, the raw file) of a source; OSError if it cannot be opened (what that means
    to a user is worded by its reader, :class:`workbench.data.corpus.record_reader.RecordReader`)."""
    raw = open(src.path, "rb")
    if src.compression == "gz":
        return gzip.GzipFile(fileobj=raw), raw
    if src.compression == "xz":
        return lzma.LZMAFile(raw), raw
    if src.compression == "zst":
        return _ZstdReader(raw), raw
    return raw, raw

