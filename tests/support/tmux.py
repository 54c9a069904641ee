"""One TUI in a tmux session, driven by keys and read back by `tmux capture-pane`, as a user sees it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.support.runs import wait_until

ROOT = Path(__file__).resolve().parents[2]


def tui_env(tmp_path: Path) -> dict[str, str]:
    """The environment a TUI in tmux runs in (its cache, its user presets, this checkout, a 256-colour terminal,
    outside any tmux). tmux missing is a failure, not a skip: CI must not go green without the end-to-end tests."""
    assert shutil.which("tmux"), "tmux is not installed; the end-to-end tests need it (apt-get install tmux)"
    env = dict(os.environ)
    env["WORKBENCH_CACHE_DIR"] = env.get("WORKBENCH_CACHE_DIR") or str(tmp_path / "cache")
    env["WORKBENCH_PRESETS_DIR"] = str(tmp_path / "presets")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TERM"] = "xterm-256color"
    env.pop("TMUX", None)
    return env


class Tmux:
    """One TUI in a tmux session ``name`` on the server ``socket``."""

    def __init__(self, socket: str, cwd: Path, env: dict[str, str], name: str = "wb"):
        # COLUMNS and LINES, where the test process has them (pytest-xdist's workers: 80 and 24), would size the
        # TUI instead of its 160 x 48 window: the new-run form's buttons fell below a 24-line screen
        env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
        self.socket, self.cwd, self.env, self.name = socket, cwd, env, name

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              check=check, env=self.env, cwd=self.cwd)

    def open_tui(self, runs_dir: Path) -> None:
        cmd = shlex.join([sys.executable, "-m", "workbench", "--runs-dir", str(runs_dir)])
        self._tmux("new-session", "-d", "-s", self.name, "-x", "160", "-y", "48", cmd)

    def server_pid(self) -> int:
        return int(self._tmux("display-message", "-p", "-t", self.name, "#{pid}").stdout)

    def alive(self) -> bool:
        return self._tmux("has-session", "-t", self.name, check=False).returncode == 0

    def pid(self) -> int:
        """The TUI's process (the pane runs it directly)."""
        return int(self._tmux("list-panes", "-t", self.name, "-F", "#{pane_pid}").stdout.split()[0])

    def screen(self, colours: bool = False) -> str:
        return self._tmux("capture-pane", "-p", *(["-e"] if colours else []), "-t", self.name, check=False).stdout

    def focused_field(self, labels: tuple[str, ...]) -> str | None:
        """Which of the form's fields has the focus: the one whose border (the ▊ after its label) is drawn
        in a colour none of the others has."""
        colour = {}
        for line in self.screen(colours=True).splitlines():
            for label in labels:
                m = re.search(re.escape(label) + r"(?:\x1b\[[\d;]*m|\s)*?((?:\x1b\[[\d;]*m)+)▊", line)
                if m and label not in colour:
                    colour[label] = m.group(1)
        if len(colour) < len(labels):
            return None
        odd = [label for label in labels if list(colour.values()).count(colour[label]) == 1]
        return odd[0] if len(odd) == 1 else None

    def tab_to(self, field: str, labels: tuple[str, ...] = ("preset", "corpus", "name", "budget", "--set")) -> None:
        """Tab until ``field`` has the focus, one Tab at a time: two Tabs that arrive together move the
        focus only once (Textual), and keys typed then would land in the wrong field."""
        for _ in range(len(labels)):
            now = wait_until(lambda: self.focused_field(labels), 10, "a focused field")
            if now == field:
                return
            self.keys("Tab")
            wait_until(lambda now=now: self.focused_field(labels) not in (None, now), 10, "the focus to move")
        raise AssertionError(f"could not tab to {field}:\n{self.screen()}")

    def keys(self, *keys: str) -> None:
        """Keys are delivered in order; the app queues what arrives while it is busy (tests/tui/test_stop.py)."""
        for k in keys:
            self._tmux("send-keys", "-t", self.name, k)

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", self.name, "-l", text)

    def wait_screen(self, pattern: str, timeout: float = 60.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            m = re.search(pattern, text)
            if m:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not on screen after {timeout:.0f}s:\n{text}")
            time.sleep(0.2)

    def shown_step(self) -> int | None:
        m = re.search(r"step ([\d,]+) / 5,000", self.screen())
        return int(m.group(1).replace(",", "")) if m else None

    def kill_server(self) -> None:
        self._tmux("kill-server", check=False)
