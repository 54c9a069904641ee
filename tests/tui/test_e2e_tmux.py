"""End to end in tmux, as a user does it: start a tiny run from the TUI on the built-in
corpus, watch tokens/s and loss appear, quit (the trainer keeps running), reopen (the
same run is live), stop it from the TUI, resume it from the checkpoint browser.

Real processes throughout: the TUI, the CLI, the trainer (torch). Marked slow; CI runs it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.rundir import pid_alive, read_status

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]

ROOT = Path(__file__).resolve().parents[2]
TINY = ("model.dim=64 model.n_layers=2 model.n_heads=4 model.n_kv_heads=2 model.seq_len=64 "
        "model.vocab_size=512 train.batch_size=4 train.max_iters=5000 data.builtin_mb=0.3 "
        "data.tokenizer_sample_mb=0.3 train.warmup_iters=2 train.eval_interval=25 train.eval_iters=2 "
        "train.ckpt_interval=25 train.log_interval=5 hardware.compile=false")


class Tmux:
    def __init__(self, socket: str, cwd: Path, env: dict[str, str]):
        self.socket, self.cwd, self.env = socket, cwd, env

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              check=check, env=self.env, cwd=self.cwd)

    def open_tui(self, runs_dir: Path) -> None:
        cmd = shlex.join([sys.executable, "-m", "workbench", "--runs-dir", str(runs_dir)])
        self._tmux("new-session", "-d", "-s", "wb", "-x", "160", "-y", "48", cmd)

    def alive(self) -> bool:
        return self._tmux("has-session", "-t", "wb", check=False).returncode == 0

    def screen(self) -> str:
        r = self._tmux("capture-pane", "-p", "-t", "wb", check=False)
        return r.stdout

    def keys(self, *keys: str) -> None:
        for k in keys:
            self._tmux("send-keys", "-t", "wb", k)
            time.sleep(0.15)

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", "wb", "-l", text)
        time.sleep(0.2)

    def wait_screen(self, pattern: str, timeout: float = 60.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            m = re.search(pattern, text)
            if m:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not on screen after {timeout:.0f}s:\n{text}")
            time.sleep(0.3)

    def kill(self) -> None:
        self._tmux("kill-server", check=False)


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def _events(run_dir: Path) -> list[str]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") == "event":
            out.append(r["event"])
    return out


def test_start_quit_reopen_stop_resume_in_tmux(tmp_path):
    runs = tmp_path / "runs"
    env = dict(os.environ)
    env["WORKBENCH_CACHE_DIR"] = env.get("WORKBENCH_CACHE_DIR") or str(tmp_path / "cache")
    env["WORKBENCH_PRESETS_DIR"] = str(tmp_path / "presets")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TERM"] = "xterm-256color"
    env.pop("TMUX", None)
    tm = Tmux(f"wbtest-{os.getpid()}", tmp_path, env)
    run_dir = runs / "e2e"
    try:
        # 1. open the TUI and start a tiny run from the form
        tm.open_tui(runs)
        tm.wait_screen(r"Recommended preset", 30)
        tm.keys("n")
        tm.wait_screen(r"Start a new run")
        tm.keys("Tab", "Tab")  # preset -> corpus -> name
        tm.type("e2e")
        tm.keys("Tab")
        tm.type(TINY)
        tm.keys("C-s")
        tm.wait_screen(r"step [\d,]+ / 5,000", 120)
        tm.wait_screen(r"tokens/s\s+[\d.]+k?\b", 60)
        tm.wait_screen(r"\bloss\s+\d+\.\d{4}", 60)
        assert run_dir.is_dir()
        # 2. quit: the trainer keeps running
        tm.keys("q")
        _wait(lambda: not tm.alive(), 15, "the TUI to exit")
        st = read_status(run_dir)
        assert st["state"] == "running" and pid_alive(st["pid"], st.get("pid_start")), st
        # 3. reopen: the same run, live
        tm.open_tui(runs)
        tm.wait_screen(r"e2e.*running", 30)
        first = int(tm.wait_screen(r"step ([\d,]+) / 5,000").group(1).replace(",", ""))
        _wait(lambda: int(re.search(r"step ([\d,]+) / 5,000", tm.screen()).group(1).replace(",", "")) > first,
              60, "the step to advance on screen")
        _wait(lambda: any(p.name.startswith("step_") for p in (run_dir / "checkpoints").glob("*")), 120,
              "a first checkpoint")
        # 4. stop it from the TUI (with confirmation)
        tm.keys("3")
        tm.keys("x")
        tm.wait_screen(r"Stop run e2e")
        tm.keys("y")
        _wait(lambda: read_status(run_dir).get("state") == "stopped", 60, "the run to stop")
        tm.wait_screen(r"stopped", 30)
        # 5. resume from the checkpoint browser: runs pane, checkpoint table, c
        tm.keys("6")
        tm.wait_screen(r"checkpoints \(tab here")
        tm.wait_screen(r"step_\d{7}", 20)
        tm.keys("Tab")
        tm.keys("c")
        _wait(lambda: "resume" in _events(run_dir), 120, "a resume event")
        _wait(lambda: read_status(run_dir).get("state") == "running", 60, "the resumed run")
        tm.keys("3")
        tm.wait_screen(r"e2e.*running", 30)
    finally:
        screen = tm.screen() if tm.alive() else ""
        tm.kill()
        st = read_status(run_dir) if run_dir.is_dir() else {}
        if st.get("state") in ("running", "starting") and st.get("pid"):
            subprocess.run([sys.executable, "-m", "workbench", "stop", "e2e", "--runs-dir", str(runs)],
                           env=env, capture_output=True, timeout=60)
            _wait(lambda: not pid_alive(st["pid"], st.get("pid_start")), 60, "the trainer to exit")
        print(screen)
