"""The prompts a reward scores the model's completions of (``workbench pairs --prompts``, ``workbench eval
--prompts``), read as every corpus file is read (:mod:`workbench.data.corpus.record_reader`: JSONL or parquet, plain or
compressed, the same wording for a bad line):

- JSON lines (``.jsonl``/``.json``, optionally ``.gz``/``.zst``/``.xz``) or parquet: one record a line, its
  ``prompt`` a non-empty string; the whole record goes to the reward (``exact:answer`` reads its ``answer``), and
  a ``system`` string is the system message when the run is chat-tuned;
- anything else is plain text: each non-blank line one prompt (its record ``{"prompt": line}``).

A missing file, a file without prompts, a bad line (not JSON, not an object, no ``prompt``) is one
:class:`~workbench.reward.builtin.RewardError` line naming the file and the line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.data.corpus.record_reader import RecordReader, byte_lines, json_type
from workbench.data.corpus.sources import CorpusError, Source, kind_of
from workbench.reward.builtin import RewardError

LABEL = "prompts file"


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, its whole record, and where it came from ("prompts file F, line N")."""
    text: str
    record: dict[str, Any]
    where: str

    @property
    def system(self) -> str | None:
        s = self.record.get("system")
        return s if isinstance(s, str) and s.strip() else None


@dataclass(frozen=True)
class Prompts:
    path: str
    sha256: str             # the file's bytes: results made from it say which prompts they are
    items: tuple[Prompt, ...]


def _text_prompts(src: Source, reader: RecordReader) -> list[Prompt]:
    out: list[Prompt] = []

    def read(stream: Any) -> Any:
        for n, raw in enumerate(byte_lines(stream), 1):
            try:
                line = raw.decode("utf-8").rstrip("\r")
            except UnicodeDecodeError:
                raise RewardError(f"{LABEL} {src.path}, line {n}: not UTF-8 text (save the file as UTF-8)") from None
            if line.strip():
                yield Prompt(line, {"prompt": line}, f"{LABEL} {src.path}, line {n}")
    for p in reader.stream(src, read):
        out.append(p)
    return out


def held_out_count(n: int, val_fraction: float) -> int:
    """How many of a prompts file's ``n`` prompts a GRPO run holds out for its eval's reward (the last ones): its
    data.val_fraction, at least one when there are two or more."""
    return 0 if n < 2 else max(1, round(n * val_fraction))


def read_prompts(path: str | Path, limit: int | None = None) -> Prompts:
    """Every prompt of ``path`` (the first ``limit`` with a limit), in order; one line if there are none."""
    p = Path(path).expanduser()
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise RewardError(f"{LABEL} {path} {what}; give a JSONL file of {{\"prompt\": ...}} records or a text file "
                          "of one prompt a line")
    try:
        kind, compression = kind_of(p)
        data = p.read_bytes()
    except CorpusError as e:
        raise RewardError(str(e).replace("corpus file", LABEL)) from None
    except OSError as e:
        raise RewardError(f"cannot read {LABEL} {path}: {e.strerror}") from None
    src = Source(str(path), kind, compression, len(data), 0)
    reader = RecordReader(label=LABEL, error=RewardError, fix="fix the line")
    items: list[Prompt] = []
    if kind == "text":
        items = _text_prompts(src, reader)
    else:
        for where, rec in reader.records(src):
            if "prompt" not in rec:
                have = ", ".join(map(repr, rec)) or "no fields"
                raise RewardError(f"{where}: no 'prompt' field (the record has {have}); each line is "
                                  "{\"prompt\": \"...\", ...}")
            text = rec["prompt"]
            if not isinstance(text, str):
                raise RewardError(f"{where}: 'prompt' is {json_type(text)}, not a string")
            if not text.strip():
                raise RewardError(f"{where}: 'prompt' is empty")
            items.append(Prompt(text, rec, str(where)))
            if limit and len(items) >= limit:
                break
    if limit:
        items = items[:limit]
    if not items:
        raise RewardError(f"{LABEL} {path} has no prompts; give one {{\"prompt\": ...}} record (JSONL) or one "
                          "prompt (text) a line")
    return Prompts(str(path), hashlib.sha256(data).hexdigest(), tuple(items))


__all__ = ["LABEL", "Prompt", "Prompts", "read_prompts"]
