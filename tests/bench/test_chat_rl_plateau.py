"""bench/chat_rl.py --extend: the rule that picks the arms' start (the first checkpoint no later one beats by more
than two standard errors, with checkpoints after it to show it) and its options' bad input (one line, exit 2,
nothing written)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import chat_rl  # noqa: E402


def test_the_plateau_starts_after_the_jump_and_not_while_the_score_rises():
    # the shape the bench sees: sort's jump between 200 and 400 more steps, then flat within the noise
    jump = [(0, 48.0), (100, 49.3), (200, 51.0), (300, 60.3), (400, 66.0), (500, 65.0), (600, 67.3), (700, 66.3)]
    assert chat_rl.plateau(jump, 300) == 400
    # 2 SE at 300 items near 60 % is ~5.7 points: a later checkpoint 6 points up means still rising there
    assert chat_rl.plateau([(0, 60.0), (100, 60.0), (200, 66.0), (300, 66.0), (400, 66.0)], 300) == 200
    # on 3,000 items the same 3 points are a rise, not noise
    flat = [(0, 60.0), (100, 61.0), (200, 63.0), (300, 63.0), (400, 63.0)]
    assert chat_rl.plateau(flat, 300) == 0
    assert chat_rl.plateau(flat, 3000) == 200
    # still rising at the last checkpoints, or too few after the flat part: no plateau
    assert chat_rl.plateau([(0, 40.0), (100, 50.0), (200, 60.0), (300, 70.0)], 300) is None
    assert chat_rl.plateau([(0, 40.0), (100, 50.0), (200, 60.0), (300, 61.0)], 300) is None
    assert chat_rl.plateau([(0, 40.0), (100, 50.0), (200, 60.0), (300, 61.0)], 300, after=1) == 200
    # 0 % and 100 % still have a spread (one item's worth), not a zero standard error
    assert chat_rl.plateau([(0, 0.0), (100, 0.0), (200, 0.0)], 300) == 0
    assert chat_rl.plateau([(0, 0.0), (100, 2.0), (200, 2.0), (300, 2.0)], 300) == 100


@pytest.mark.parametrize("args, says", [
    (["--start-step", "100"], "--start-step picks a checkpoint of --extend's run; give --extend N too"),
    (["--extend", "250"], "--extend 250 is not a multiple of --extend-every 100; make it one"),
    (["--extend", "400", "--start-step", "150"], "--start-step 150: not one of --extend's checkpoints"),
    (["--extend", "400", "--start-step", "500"], "--start-step 500: not one of --extend's checkpoints"),
])
def test_bad_extend_options_say_what_is_wrong_and_write_nothing(tmp_path, args, says):
    out = tmp_path / "out"
    cp = subprocess.run([sys.executable, str(ROOT / "bench" / "chat_rl.py"), "--out", str(out), *args],
                        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert cp.returncode == 2
    errors = [ln for ln in cp.stderr.splitlines() if ln.startswith("chat_rl.py: error:")]
    assert len(errors) == 1 and says in errors[0], cp.stderr
    assert not out.exists()
