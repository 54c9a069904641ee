"""Which lines of an old README.md are in neither README.md nor docs/ now: the check that moving the README's text
into the docs site lost nothing.

    python docs/gen/check_moved.py OLD_README.md        # e.g. git show 3e0b65c:README.md > /tmp/old.md

A line counts as kept when it appears, stripped, in README.md or a page under docs/, with its heading marks and
its links' targets left out (a heading moves up a level on its page; a link to a section becomes a link to a
page). Prints each line that is not kept with its line number, and exits 1 when there is one.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def norm(line: str) -> str:
    line = re.sub(r"^\s*#+ ", "", line.strip())
    return re.sub(r"\]\([^)]*\)", "]()", line).strip()


def missing(old: str, new_texts: list[str]) -> list[tuple[int, str]]:
    kept = {norm(ln) for text in new_texts for ln in text.splitlines()}
    return [(i, ln) for i, ln in enumerate(old.splitlines(), 1) if norm(ln) and norm(ln) not in kept]


def main(argv: list[str]) -> int:
    old = Path(argv[0]).read_text(encoding="utf-8")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    lost = missing(old, [p.read_text(encoding="utf-8") for p in pages])
    for i, ln in lost:
        print(f"{i}: {ln}")
    print(f"{len(lost)} of {len(old.splitlines())} lines not found in README.md or docs/", file=sys.stderr)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
