"""The built-in rewards: pure functions of (prompt, completion, record), each made from the text after its name in
``--reward NAME:ARG``. No torch, no model: testable alone (tests/reward/test_builtin.py).

- ``exact[:FIELD]``   1.0 when the completion's first line, stripped, equals the record's FIELD (default
                      ``answer``; a string, or a list of strings any of which counts), stripped; else 0.0. The first
                      line, as the exact-match eval task reads a generation up to its ``until`` (a newline): a text
                      model goes on past its answer, a chat model's reply ends at its end-of-turn token anyway.
- ``regex:PATTERN``   1.0 when Python's ``re.search(PATTERN, completion)`` finds a match; else 0.0 (anchor it
                      with ``^``/``$`` or ``\\A``/``\\Z`` for a whole match).
- ``contains:TEXT``   1.0 when TEXT occurs in the completion (case-sensitive); else 0.0.
- ``length:TARGET``   graded: ``max(0, 1 - |len(completion) - TARGET| / TARGET)``, the length in characters: 1 at
                      the target, 0 at twice it or at an empty completion.
- ``lexicon:POS[,NEG]`` graded: ``(positive words - negative words) / words`` of the completion, in [-1, 1] (0 for
                      a completion without words). POS and NEG are word lists, one word a line (blank lines and
                      ``#`` comments skipped), matched case-insensitively against the completion's words
                      (``[\\w']+``). A sentiment score in the spirit of the DPO paper's sentiment task, without
                      a classifier.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from workbench.errors import WorkbenchError

Scorer = Callable[[str, str, dict[str, Any]], float]
WORDS = re.compile(r"[\w']+")


class RewardError(WorkbenchError):
    pass


@dataclass(frozen=True)
class Made:
    """What a built-in's argument makes: its scorer, the record field it needs (None: none), the digest of the
    files it read (None: none)."""
    score: Scorer
    field: str | None = None
    sha256: str | None = None


def first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip() if text.strip() else ""


def exact(arg: str) -> Made:
    name = arg or "answer"

    def score(prompt: str, completion: str, record: dict[str, Any]) -> float:
        want = record[name]
        answers = want if isinstance(want, list) else [want]
        got = first_line(completion)
        return 1.0 if any(got == str(a).strip() for a in answers) else 0.0
    return Made(score, field=name)


def regex(arg: str) -> Made:
    if not arg:
        raise RewardError("--reward regex:PATTERN needs a pattern after the colon, e.g. regex:'^\\d+$'")
    try:
        pattern = re.compile(arg)
    except re.error as e:
        raise RewardError(f"--reward regex:{arg}: not a regular expression ({e})") from None
    return Made(lambda p, c, r: 1.0 if pattern.search(c) else 0.0)


def contains(arg: str) -> Made:
    if not arg:
        raise RewardError("--reward contains:TEXT needs the text after the colon, e.g. contains:Paris")
    return Made(lambda p, c, r: 1.0 if arg in c else 0.0)


def length(arg: str) -> Made:
    try:
        target = int(arg)
    except ValueError:
        target = 0
    if target < 1:
        raise RewardError(f"--reward length:{arg}: the target is a whole number of characters, at least 1, "
                          "e.g. length:200")
    return Made(lambda p, c, r: max(0.0, 1.0 - abs(len(c) - target) / target))


def read_words(path: Path, what: str) -> tuple[frozenset[str], bytes]:
    """A word list's words (lowercased) and its bytes (for the digest); one line if it cannot be one."""
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except OSError as e:
        raise RewardError(f"--reward lexicon: cannot read the {what} word list {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise RewardError(f"--reward lexicon: the {what} word list {path} is not UTF-8 text") from None
    words = frozenset(w.strip().lower() for w in text.splitlines() if w.strip() and not w.lstrip().startswith("#"))
    if not words:
        raise RewardError(f"--reward lexicon: the {what} word list {path} has no words (one word a line)")
    return words, data


def lexicon(arg: str) -> Made:
    files = [f for f in arg.split(",")] if arg else []
    if not 1 <= len(files) <= 2 or not all(files):
        raise RewardError("--reward lexicon:POS_FILE[,NEG_FILE] takes one or two word lists, e.g. "
                          "lexicon:positive.txt,negative.txt")
    pos, pos_bytes = read_words(Path(files[0]).expanduser(), "positive")
    neg, neg_bytes = read_words(Path(files[1]).expanduser(), "negative") if len(files) == 2 else (frozenset(), b"")
    digest = hashlib.sha256(hashlib.sha256(pos_bytes).digest() + hashlib.sha256(neg_bytes).digest()).hexdigest()

    def score(prompt: str, completion: str, record: dict[str, Any]) -> float:
        words = WORDS.findall(completion.lower())
        if not words:
            return 0.0
        return (sum(w in pos for w in words) - sum(w in neg for w in words)) / len(words)
    return Made(score, sha256=digest)


BUILTINS: dict[str, Callable[[str], Made]] = {"exact": exact, "regex": regex, "contains": contains,
                                              "length": length, "lexicon": lexicon}

__all__ = ["BUILTINS", "Made", "RewardError", "Scorer", "first_line", "read_words"]
