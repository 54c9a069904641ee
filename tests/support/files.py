"""Files the data tests write and read back: zstd-compressed text (as ``gzip.open`` writes gzip), and where a
preparation run in a child process says it put its tokens."""

from __future__ import annotations

import io
from pathlib import Path

import zstandard


def zst_open(path, mode: str = "wt", encoding: str = "utf-8") -> io.TextIOWrapper:
    """A text file written through zstd: an ``opener`` beside ``open`` and ``gzip.open`` (``mode`` is always
    write-text)."""
    return io.TextIOWrapper(zstandard.ZstdCompressor().stream_writer(open(path, "wb")), encoding=encoding)


def tokens_path(out: str) -> Path:
    """The token file a preparation child named on its ``TOKENS <path>`` line."""
    return Path(next(ln for ln in out.splitlines() if ln.startswith("TOKENS")).split(" ", 1)[1])
