"""bench/tui_first_paint.py, once: it opens the real TUI in tmux, finds the Hardware pane's text on the screen, and
reports the time to it (and to the first frame, which is never later) for this checkout and, with --against, for
another one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_first_paint_bench_times_the_hardware_pane_in_tmux():
    assert shutil.which("tmux"), "tmux is not installed; the bench needs it (apt-get install tmux)"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "tui_first_paint.py"), "--repeat", "1", "--json",
                        "--against", str(REPO)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for k in ("this", "against"):
        (start,) = out[k]["starts"]
        assert 0 < start["frame_s"] <= start["pane_s"] < 30, start
        assert out[k]["pane"]["min"] == start["pane_s"]
