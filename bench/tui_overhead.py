"""How much does watching a run in the TUI slow the trainer down?

Trains the same small config twice per round on the built-in corpus: once headless
(nobody watching) and once with the TUI open in tmux on the Train pane (the pane
that redraws most), alternating to spread machine noise. Prints tokens/s for each
and the ratio TUI-open / headless (the issue's target: >= 0.98).

    .venv/bin/python bench/tui_overhead.py [--rounds 2] [--max-iters 300] [--pane train]

A benchmark, not a test: it takes minutes and needs tmux.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ("model.dim=128 model.n_layers=4 model.n_heads=4 model.n_kv_heads=2 model.seq_len=128 "
          "model.vocab_size=1024 train.batch_size=8 data.builtin_mb=1 data.tokenizer_sample_mb=1 "
          "train.warmup_iters=10 train.eval_interval=100 train.eval_iters=5 train.ckpt_interval=100000 "
          "train.log_interval=5")


def cli(env, runs: Path, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "workbench", *args, "--runs-dir", str(runs)],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"workbench {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout.strip().splitlines()[-1]


def wait_done(run_dir: Path, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            st = json.loads((run_dir / "status.json").read_text())
        except (OSError, ValueError):
            st = {}
        if st.get("state") not in (None, "starting", "running"):
            if st.get("state") != "finished":
                raise SystemExit(f"{run_dir.name} ended {st.get('state')}: {st.get('error')}")
            return
        time.sleep(0.5)
    raise SystemExit(f"{run_dir.name} did not finish in {timeout:.0f}s")


def tokens_per_s(run_dir: Path) -> float:
    """Tokens over wall time between the 3rd train record and the last (warm-up left out)."""
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    train = [r for r in recs if r.get("kind") == "train"]
    a, b = train[2], train[-1]
    return (b["tokens_seen"] - a["tokens_seen"]) / (b["elapsed_s"] - a["elapsed_s"])


def one_run(env, runs: Path, name: str, max_iters: int, with_tui: bool, pane: str) -> float:
    sock = f"wbbench-{os.getpid()}-{name}"  # one tmux server per run: reusing a socket name races its kill
    if with_tui:
        cmd = shlex.join([sys.executable, "-m", "workbench", "--runs-dir", str(runs)])
        subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-s", "b", "-x", "160", "-y", "48", cmd],
                       check=True, env=env)
        time.sleep(3)
    try:
        cli(env, runs, "train", "cpu-small", "--name", name, "--set", *CONFIG.split(),
            f"train.max_iters={max_iters}", "--detach")
        if with_tui:
            time.sleep(2)
            key = {"hardware": "1", "presets": "2", "train": "3", "curves": "4", "sample": "5", "runs": "6"}[pane]
            subprocess.run(["tmux", "-L", sock, "send-keys", "-t", "b", key], env=env)
        wait_done(runs / name)
    finally:
        if with_tui:
            subprocess.run(["tmux", "-L", sock, "kill-server"], env=env, capture_output=True)
    return tokens_per_s(runs / name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-iters", type=int, default=300)
    ap.add_argument("--pane", default="train", help="pane left open during the TUI runs")
    args = ap.parse_args()
    if not shutil.which("tmux"):
        raise SystemExit("tmux is needed for this benchmark")
    tmp = Path(tempfile.mkdtemp(prefix="wb-tui-bench-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color")
    env.setdefault("WORKBENCH_CACHE_DIR", str(tmp / "cache"))
    env.pop("TMUX", None)
    runs = tmp / "runs"
    # warm the tokenizer/corpus cache so neither side pays for it
    one_run(env, runs, "warmup", 20, False, args.pane)
    headless, watched = [], []
    for i in range(args.rounds):
        order = [(False, headless), (True, watched)] if i % 2 == 0 else [(True, watched), (False, headless)]
        for with_tui, out in order:
            tps = one_run(env, runs, f"r{i}-{'tui' if with_tui else 'headless'}", args.max_iters, with_tui, args.pane)
            out.append(tps)
            print(f"round {i + 1}: {'TUI open' if with_tui else 'headless'}: {tps:,.0f} tokens/s", flush=True)
    h, w = statistics.median(headless), statistics.median(watched)
    print(f"headless {h:,.0f} tokens/s, TUI open ({args.pane} pane) {w:,.0f} tokens/s, "
          f"ratio TUI/headless = {w / h:.3f}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
