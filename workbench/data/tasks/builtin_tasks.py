"""Built-in eval tasks: made on this machine, with a fixed seed and size, from the built-in corpus's held-out
documents (:func:`workbench.data.corpus.documents.builtin_documents` keeps them out of every built-in corpus, so no
preset ever trains on them). No download; the same items on every machine with the same Python.

- ``stdlib-next-line``: 400 four-way choices; the context is up to 12 lines of a held-out standard-library
  file, the right choice its next line, the other three code lines of other held-out files. Scored per
  character (``acc_norm``: the lines differ in length). Distractors with the right line's indentation were
  tried: a 5 M-parameter model told them apart from chance only late (random 0.25, 200 steps 0.263, 600
  steps 0.300), where any line separates the three (0.215, 0.295, 0.357).
- ``docs-cloze``: 400 four-way choices over held-out documentation topics; the context is up to ~400
  characters of a paragraph, the right choice the word that follows, the others words of about its length
  from the same documents. Scored by summed log-likelihood (``acc``).

An item whose context and answer also occur in a document that is not held out (documentation topics repeat
each other; some modules share code) is left out. Chance is 0.25 on both; the README gives what a random-init
model and a trained cpu-small score.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from functools import lru_cache

from workbench.data.corpus.documents import builtin_documents
from workbench.data.tasks.task_files import ChoiceItem, Task

SEED = 20261124
SIZE = 400
CHOICES = 4
CONTEXT_LINES = 12
CONTEXT_CHARS = 400


@lru_cache(maxsize=1)
def _trained_text() -> str:
    """Every document a built-in corpus may train on, joined (about 12 MB)."""
    return "".join(text for _, _, text in builtin_documents())


def _seen(context: str, answer: str) -> bool:
    """Whether the end of the context with its answer occurs in the trainable documents: some held-out text is
    repeated elsewhere (documentation topics overlap; lzma, bz2 and gzip share code); such items are dropped."""
    return (context[-100:] + answer) in _trained_text()


def _code_files() -> list[tuple[str, list[str]]]:
    # Codec tables (encodings/) are long runs of numbers: not code anyone asks a model about.
    return [(name, text.split("\n")) for kind, name, text in builtin_documents(held_out=True)
            if kind == "code" and not name.startswith("encodings/")]


def _is_code_line(line: str) -> bool:
    s = line.strip()
    return 10 <= len(s) <= 70 and not s.startswith(("#", '"', "'"))


@lru_cache(maxsize=1)
def next_line_task() -> Task:
    rng = random.Random(SEED)
    files = _code_files()
    lines_of: list[tuple[int, str]] = []
    candidates = []
    for f, (_, lines) in enumerate(files):
        for i, line in enumerate(lines):
            if _is_code_line(line):
                lines_of.append((f, line))
                if i >= 4:
                    candidates.append((f, i))
    items: list[ChoiceItem] = []
    for f, i in rng.sample(candidates, len(candidates)):
        lines = files[f][1]
        gold = lines[i]
        others: list[str] = []
        while len(others) < CHOICES - 1:
            g, line = lines_of[rng.randrange(len(lines_of))]
            if g != f and line != gold and line not in others:
                others.append(line)
        context = "\n".join(lines[max(0, i - CONTEXT_LINES):i]) + "\n"
        while len(context) > CONTEXT_CHARS and "\n" in context[:-1]:
            context = context[context.index("\n") + 1:]
        if _seen(context, gold):
            continue
        choices = others + [gold]
        rng.shuffle(choices)
        items.append(ChoiceItem(context, tuple(choices), choices.index(gold), len(items) + 1))
        if len(items) == SIZE:
            break
    return Task("stdlib-next-line", "mc", "builtin", tuple(items), metric="acc_norm", delimiter="",
                shape="built-in", description="the next line of held-out standard-library code, of 4")


_WORD = re.compile(r"[a-z]{4,}")


@lru_cache(maxsize=1)
def cloze_task() -> Task:
    rng = random.Random(SEED + 1)
    docs = [text for kind, _, text in builtin_documents(held_out=True) if kind == "doc"]
    counts = Counter(w for text in docs for w in _WORD.findall(text))
    vocab = sorted(w for w, c in counts.items() if c >= 2)
    by_len: dict[int, list[str]] = {}
    for w in vocab:
        by_len.setdefault(len(w), []).append(w)
    candidates = []
    for d, text in enumerate(docs):
        for m in _WORD.finditer(text):
            p = m.start()
            if p > 0 and text[p - 1] == " " and (m.end() == len(text) or not text[m.end()].isalnum()) \
                    and counts[m.group()] >= 2:
                start = max(text.rfind("\n\n", 0, p) + 2, p - CONTEXT_CHARS)
                if p - start >= 80:
                    candidates.append((d, p, m.group()))
    items: list[ChoiceItem] = []
    for d, p, word in rng.sample(candidates, len(candidates)):
        text = docs[d]
        start = max(text.rfind("\n\n", 0, p) + 2, p - CONTEXT_CHARS)
        sp = text.find(" ", start, p - 1)
        start = sp + 1 if start > 0 and text[start - 1] not in " \n" and sp >= 0 else start
        if _seen(text[start:p - 1], " " + word):
            continue
        pool = sorted({w for n in (len(word) - 1, len(word), len(word) + 1) for w in by_len.get(n, []) if w != word})
        others = rng.sample(pool, CHOICES - 1)
        choices = others + [word]
        rng.shuffle(choices)
        items.append(ChoiceItem(text[start:p - 1], tuple(choices), choices.index(word), len(items) + 1))
        if len(items) == SIZE:
            break
    return Task("docs-cloze", "mc", "builtin", tuple(items), metric="acc", delimiter=" ", shape="built-in",
                description="the next word of held-out Python documentation, of 4")


BUILTIN_TASKS = {"stdlib-next-line": next_line_task, "docs-cloze": cloze_task}


def builtin_task(name: str) -> Task:
    return BUILTIN_TASKS[name]()


__all__ = ["BUILTIN_TASKS", "builtin_task", "cloze_task", "next_line_task"]
