"""How long does a new user wait for the Hardware pane? Time from launching `workbench` in tmux to the
pane's text on screen.

Each repetition opens the TUI in a fresh tmux server on an empty runs directory (a new user's first
start: the app opens on the Hardware pane) and polls `tmux capture-pane` until the pane's first line is
drawn ("frame": the app's first paint, "reading hardware…" or the pane itself) and until the detected
machine is there ("Recommended preset:": the pane's text). Prints every repetition and the minimum and
median of each; on a shared machine the minimum is the number to compare (the others are the noise of
whatever else runs).

    .venv/bin/python bench/tui_first_paint.py [--repeat 7] [--json] [--against DIR]

`--against DIR` also times another checkout of workbench (e.g. `git worktree add /tmp/old HEAD~3`) with
this interpreter, one start of each in turn, so both see the same machine.

Where the time goes: `python -X importtime -c "import workbench.tui.app"` for the imports, and
`python -m cProfile -o FILE -m workbench` for the rest. Needs tmux.
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
FRAME = "Hardware"                 # the tab bar: the app has painted
PANE = "Recommended preset:"       # the Hardware pane's text, from the detected machine


def _tmux(sock: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, env=env)


def one_start(env: dict, runs: Path, sock: str, timeout: float = 60.0) -> dict:
    """Seconds from launch to the first frame and to the pane's text, in a tmux server of its own."""
    cmd = shlex.join([sys.executable, "-m", "workbench", "--runs-dir", str(runs)])
    t0 = time.perf_counter()
    # started in the runs directory's parent: `python -m` puts the working directory first on the path,
    # so the checkout timed is the one on PYTHONPATH whatever directory the bench runs in
    r = _tmux(sock, env, "new-session", "-d", "-s", "b", "-x", "160", "-y", "48", "-c", str(runs.parent), cmd)
    if r.returncode:
        raise SystemExit(f"tmux new-session failed: {r.stderr.strip()}")
    frame = pane = None
    try:
        while time.perf_counter() - t0 < timeout:
            screen = _tmux(sock, env, "capture-pane", "-p", "-t", "b").stdout
            now = time.perf_counter() - t0
            if frame is None and FRAME in screen:
                frame = now
            if PANE in screen:
                pane = now
                break
            time.sleep(0.005)
        if pane is None:
            raise SystemExit(f"the Hardware pane did not appear within {timeout:.0f}s:\n{screen}")
        return {"frame_s": frame if frame is not None else pane, "pane_s": pane}
    finally:
        _tmux(sock, env, "kill-server")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="starts to time (default 7)")
    ap.add_argument("--json", action="store_true", help="one JSON object: every start, the minimum and median")
    ap.add_argument("--against", metavar="DIR", help="also time the workbench checkout in DIR, alternating")
    args = ap.parse_args()
    if not shutil.which("tmux"):
        raise SystemExit("tmux is needed for this benchmark")
    tmp = Path(tempfile.mkdtemp(prefix="wb-first-paint-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color",
               WORKBENCH_PRESETS_DIR=str(tmp / "presets"))
    env.setdefault("WORKBENCH_CACHE_DIR", str(tmp / "cache"))
    env.pop("TMUX", None)
    runs = tmp / "runs"
    trees = {"this": ROOT, **({"against": Path(args.against).resolve()} if args.against else {})}
    envs = {k: dict(env, PYTHONPATH=str(d)) for k, d in trees.items()}
    try:
        for k in trees:  # the OS's file cache warm, as for a user's second start
            one_start(envs[k], runs, f"wbfp-{os.getpid()}-warm-{k}")
        starts: dict[str, list[dict]] = {k: [] for k in trees}
        for i in range(args.repeat):
            for k in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
                s = one_start(envs[k], runs, f"wbfp-{os.getpid()}-{k}-{i}")
                starts[k].append(s)
                if not args.json:
                    print(f"start {i + 1} ({k}, {trees[k]}): first frame {s['frame_s']:.3f} s, "
                          f"Hardware pane {s['pane_s']:.3f} s", flush=True)
        out = {"cpus": os.cpu_count(), "load_1min": os.getloadavg()[0], "repeat": args.repeat}
        for k in trees:
            out[k] = {"tree": str(trees[k]), "starts": starts[k]}
            for m in ("frame_s", "pane_s"):
                vals = [s[m] for s in starts[k]]
                out[k][m.removesuffix("_s")] = {"min": min(vals), "median": statistics.median(vals)}
        if args.json:
            print(json.dumps(out, indent=1))
        else:
            for k in trees:
                r = out[k]
                print(f"{k} ({trees[k]}): first frame min {r['frame']['min']:.3f} s, "
                      f"median {r['frame']['median']:.3f} s;"
                      f" Hardware pane min {r['pane']['min']:.3f} s, median {r['pane']['median']:.3f} s")
            print(f"({args.repeat} starts each, {out['cpus']} CPUs, load {out['load_1min']:.2f} at the end)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
