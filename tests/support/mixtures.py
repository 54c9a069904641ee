"""Two small text corpora of different look for mixture tests: made-up words and number words."""

from __future__ import annotations

import random
from pathlib import Path


def write_two_corpora(d: Path) -> random.Random:
    """``d/words.txt`` (600 documents of made-up words) and ``d/nums.txt`` (150 of number words), the same bytes
    every time (seed 0); the generator, to draw more data from where they left it."""
    r = random.Random(0)
    words = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(2, 9))) for _ in range(800)]
    (d / "words.txt").write_text("\n\n".join(" ".join(r.choice(words) for _ in range(r.randint(5, 60)))
                                             for _ in range(600)))
    nums = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen".split()
    (d / "nums.txt").write_text("\n\n".join(" ".join(r.choice(nums) for _ in range(r.randint(5, 30))) + "."
                                            for _ in range(150)))
    return r
