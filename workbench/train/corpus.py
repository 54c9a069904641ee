"""Corpus loading: a text file, a directory of text files, or the built-in corpus.

The built-in corpus needs no network: it is assembled from the documentation
and standard-library sources that ship with the running Python interpreter
(``pydoc_data.topics`` prose, then stdlib ``.py`` files in sorted order) up to
``data.builtin_mb``. It is deterministic for a given Python version.

Policy for awkward input (also in the README):
- bytes that are not UTF-8 are replaced (U+FFFD) with a warning naming the file;
- in a directory, binary files (a NUL byte in the first 8 KB), empty files and
  hidden files/directories are skipped with a warning;
- a single binary file, an empty corpus, or a corpus of only binary files is an error.

No torch here.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import WorkbenchError


class CorpusError(WorkbenchError):
    pass


@dataclass
class Corpus:
    text: str
    source: str
    files: int = 1
    warnings: list[str] = field(default_factory=list)


def _is_binary(head: bytes) -> bool:
    return b"\x00" in head


def _decode(raw: bytes, name: str, warnings: list[str]) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        bad = text.count("\ufffd")
        warnings.append(f"{name}: {bad} byte(s) that are not UTF-8 were replaced with U+FFFD")
        return text


def builtin_corpus(max_mb: float) -> Corpus:
    import pydoc_data.topics as topics

    limit = int(max_mb * 1_000_000)
    parts: list[str] = []
    size = 0
    for key in sorted(topics.topics):
        chunk = topics.topics[key].strip() + "\n\n"
        parts.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = 1
    if size < limit:
        for path in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")):
            if "test" in path.parts[-2:-1] or path.name.startswith("test"):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            chunk = f"# file: {path.relative_to(stdlib)}\n{text}\n"
            parts.append(chunk)
            files += 1
            size += len(chunk)
            if size >= limit:
                break
    text = "".join(parts)[:limit]
    return Corpus(text=text, source=f"builtin (Python {sysconfig.get_python_version()} docs + stdlib, "
                                   f"{len(text) / 1e6:.1f} MB)", files=files)


def load_corpus(spec: str, builtin_mb: float = 6.0) -> Corpus:
    if spec == "builtin":
        return builtin_corpus(builtin_mb)
    path = Path(spec).expanduser()
    if not path.exists():
        raise CorpusError(f"corpus {spec!r} does not exist; give a text file, a directory of text files, "
                          "or --corpus builtin")
    warnings: list[str] = []
    if path.is_file():
        raw = _read(path)
        if _is_binary(raw[:8192]):
            raise CorpusError(f"corpus {spec!r} looks like a binary file (it contains NUL bytes); "
                              "give a UTF-8 text file")
        text = _decode(raw, str(path), warnings)
        if not text.strip():
            raise CorpusError(f"corpus {spec!r} is empty; give a file with text in it")
        return Corpus(text=text, source=str(path), warnings=warnings)
    texts: list[str] = []
    skipped_bin = skipped_empty = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            fp = Path(root) / name
            raw = _read(fp)
            if _is_binary(raw[:8192]):
                skipped_bin += 1
                continue
            text = _decode(raw, str(fp), warnings)
            if not text.strip():
                skipped_empty += 1
                continue
            texts.append(text if text.endswith("\n") else text + "\n")
    if skipped_bin:
        warnings.append(f"skipped {skipped_bin} binary file(s) in {spec}")
    if skipped_empty:
        warnings.append(f"skipped {skipped_empty} empty file(s) in {spec}")
    if not texts:
        what = f" ({skipped_bin} binary, {skipped_empty} empty)" if skipped_bin or skipped_empty else ""
        raise CorpusError(f"corpus directory {spec!r} has no text files{what}; "
                          "put UTF-8 text files in it or use --corpus builtin")
    return Corpus(text="".join(texts), source=f"{path} ({len(texts)} files)", files=len(texts),
                  warnings=warnings)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise CorpusError(f"cannot read corpus file {path}: {e.strerror}") from None
