"""The queue beyond one run at a time, measured side by side in one run (issue 58):

    python bench/queue_scale.py                 # ~4-6 minutes on a 2-core CPU
    python bench/queue_scale.py --parts slots   # only the CPU slots
    python bench/queue_scale.py --quick         # 2 and 4 trials: a smoke test

1. **CPU slots**: one 6-trial grid sweep (a tiny cpu-small, 40 steps a trial) run by `workbench queue run --slots 2`
   (two trials at once, the cores divided), `--slots 1` (one at a time, every core's thread) and with no --slots
   (one at a time, as before), each in a runs directory of its own: the wall time of each, the best trial each
   named (the same learning rate?) and its val loss.
2. **Two machines on one PostgreSQL study** (a server of its own, tests/support/postgres.py; two runner processes
   with separate runs directories standing in for two machines): a 12-trial grid run by one runner, then the same
   grid as another study by two runners at once. Reported: each one's wall time; every grid point completed exactly
   once (no trial run twice); the study-wide count; the best the same as one runner's (every trainer runs one
   thread, OMP_NUM_THREADS=1, so a point's val loss is the same number whichever runner trained it).
3. **A runner killed mid-trial**: the 12-trial grid again with two runners; once the first runner's trial has
   trained a step, that runner is killed with SIGKILL (a lost machine). Reported: the seconds from the kill until
   its trial's retry finished on the other runner (heartbeat 1 s, failed after 3 s of silence), the trials failed
   and completed, and the study-wide count (12).

Trials here are short (a few seconds, most of it each trainer's start-up: a fresh interpreter importing torch), so
two slots gain more than they would on long runs, where the gain is bounded by the cores each run can use. The
machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.postgres import postgres_server  # noqa: E402

TINY = ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.seq_len=32",
        "model.vocab_size=512", "train.batch_size=4", "train.warmup_iters=4", "train.eval_iters=4",
        "train.max_iters=40", "train.eval_interval=20", "train.log_interval=10", "data.builtin_mb=0.3",
        "data.tokenizer_sample_mb=0.3", "hardware.nproc=1", "hardware.compile=false", "train.optimizer=adamw",
        "train.schedule=cosine", "train.min_lr=1e-6", "train.sample_prompt=\"\"", "train.patience=0"]
LRS6 = [3e-4, 1e-3, 2e-3, 3e-3, 6e-3, 1e-2]
LRS12 = [round(1e-4 * 1000 ** (k / 11), 7) for k in range(12)]


def wb(*args: str, env: dict, timeout: float = 1800) -> str:
    cmd = [sys.executable, "-m", "workbench", *args]
    cp = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    if cp.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{cp.stdout}\n{cp.stderr}")
    return cp.stdout


def grid(lrs: list[float]) -> str:
    return "train.lr=" + ",".join(f"{lr:g}" for lr in lrs)


def best_of(show: dict) -> tuple[float | None, float | None]:
    done = [t for t in show["trials"] if t.get("metric") is not None and t["state"] == "finished"]
    if not done:
        return None, None
    b = min(done, key=lambda t: t["metric"])
    return b["params"]["train.lr"], b["metric"]


def slots(tmp: Path, env: dict) -> list[str]:
    """The sweep with --slots 2, --slots 1 (one run with every core's thread) and no --slots (one at a time, the
    trainer's own thread count), in that order, each in its own runs directory."""
    out = ["| queue run | trials | wall s | best lr | best val loss |", "|---|---:|---:|---:|---:|"]
    walls = {}
    for label, flags in (("--slots 2", ["--slots", "2"]), ("--slots 1", ["--slots", "1"]), ("(no --slots)", [])):
        root = tmp / f"slots{len(walls)}"
        wb("sweep", "cpu-small", "--set-grid", grid(LRS6), "--name", "s", "--runs-dir", str(root), "--set", *TINY,
           env=env)
        t0 = time.monotonic()
        wb("queue", "run", *flags, "--runs-dir", str(root), env=env)
        walls[label] = time.monotonic() - t0
        show = json.loads(wb("sweep", "show", "s", "--json", "--runs-dir", str(root), env=env))
        lr, val = best_of(show)
        ended = sum(t["state"] == "finished" for t in show["trials"])
        out.append(f"| `{label}` | {ended} | {walls[label]:.1f} | {lr:g} | {val:.4f} |")
    one = min(walls["--slots 1"], walls["(no --slots)"])
    out.append(f"\ntwo slots: {one / walls['--slots 2']:.2f}x the trials per hour of the faster one-at-a-time run")
    return out


def runner(root: Path, url: str, env: dict, sweep: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workbench", "queue", "run", "--sweep", sweep, "--heartbeat", "1",
                             "--runs-dir", str(root)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(env, WORKBENCH_STORAGE=url), cwd=ROOT, start_new_session=True)


def study_facts(name: str, url: str, env: dict) -> dict:
    import optuna

    from workbench.queue import distributed
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=distributed.open_storage(url))
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    points = [t.params.get("train.lr") for t in complete]
    best = min(complete, key=lambda t: t.value) if complete else None
    return {"trials": len(trials), "complete": len(complete), "failed": sum(t.state == optuna.trial.TrialState.FAIL
                                                                          for t in trials),
            "points_once": sorted(points) == sorted(set(points)) and len(points) == len(LRS12),
            "counted": distributed.counted(study),
            "best": (best.params.get("train.lr"), best.value) if best else (None, None)}


def shared(tmp: Path, env: dict, url: str) -> list[str]:
    env = dict(env, OMP_NUM_THREADS="1")
    rows = ["| runners | wall s | trials | completed | every point once | counted | best lr | best val loss |",
            "|---:|---:|---:|---:|---|---:|---:|---:|"]
    facts = {}
    for n, name in ((1, "one"), (2, "two")):
        roots = [tmp / f"{name}-{k}" for k in range(n)]
        wb("sweep", "cpu-small", "--set-grid", grid(LRS12), "--name", name, "--storage", url, "--runs-dir",
           str(roots[0]), "--set", *TINY, env=env)
        t0 = time.monotonic()
        procs = [runner(r, url, env, name) for r in roots]
        for p in procs:
            out, _ = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise SystemExit(f"a runner failed:\n{out}")
        wall = time.monotonic() - t0
        f = facts[n] = study_facts(name, url, env)
        rows.append(f"| {n} | {wall:.1f} | {f['trials']} | {f['complete']} | {f['points_once']} | {f['counted']} | "
                    f"{f['best'][0]:g} | {f['best'][1]:.6f} |")
    same = facts[1]["best"] == facts[2]["best"]
    rows.append(f"\nthe same best (learning rate and val loss) with two runners as with one: {same}")
    return rows


def killed(tmp: Path, env: dict, url: str) -> list[str]:
    from workbench import rundir
    env = dict(env, OMP_NUM_THREADS="1")
    a_root, b_root = tmp / "kill-a", tmp / "kill-b"
    wb("sweep", "cpu-small", "--set-grid", grid(LRS12), "--name", "kill", "--storage", url, "--runs-dir",
       str(a_root), "--set", *TINY, env=env)
    a = runner(a_root, url, env, "kill")
    b = runner(b_root, url, env, "kill")
    deadline = time.monotonic() + 600
    victim = None
    while time.monotonic() < deadline and victim is None:
        for d in sorted(a_root.glob("kill-t*")):
            st = rundir.read_status(d) if (d / rundir.STATUS_FILE).is_file() else None
            if st is not None and st.live and st.step >= 1:
                victim = (d.name, st.step)
        time.sleep(0.1)
    if victim is None:
        raise SystemExit("runner a never trained a step")
    os.killpg(a.pid, signal.SIGKILL)   # the runner and everything in its session: the machine is lost
    killed_at = time.monotonic()
    a.wait()
    retried = finished = None
    out_lines: list[str] = []
    assert b.stdout is not None
    for line in b.stdout:   # read as b writes it: the seconds are when each line came
        out_lines.append(line)
        if retried is None and "retries trial" in line:
            retried = time.monotonic() - killed_at
        elif retried is not None and finished is None and " complete" in line:   # "<run> complete, val_loss"
            finished = time.monotonic() - killed_at
    b.wait()
    f = study_facts("kill", url, env)
    took = (f"runner b took the trial up {retried:.1f} s after the kill and finished it {finished:.1f} s after"
            if retried is not None and finished is not None else "runner b never retried the trial to its end")
    return [f"runner a killed (SIGKILL, its whole session) at step {victim[1]} of {victim[0]}; {took}",
            f"the study: {f['trials']} trials, {f['complete']} completed, {f['failed']} failed, every point once: "
            f"{f['points_once']}, counted {f['counted']}",
            "runner b's retry line: " + next((ln.strip() for ln in out_lines if "retries trial" in ln), "none")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="slots,shared,killed", help="which parts, comma-separated")
    ap.add_argument("--quick", action="store_true", help="2 and 4 trials instead of 6 and 12 (a smoke test)")
    args = ap.parse_args()
    if args.quick:
        LRS6[:] = LRS6[:2]
        LRS12[:] = LRS12[4:8]
    parts = args.parts.split(",")
    print(f"load average before: {os.getloadavg()[0]:.2f}; {os.cpu_count()} logical cores")
    with tempfile.TemporaryDirectory(prefix="wb-queue-scale-") as t:
        tmp = Path(t)
        env = dict(os.environ, WORKBENCH_CACHE_DIR=str(tmp / "cache"), PYTHONUNBUFFERED="1")
        env.pop("WORKBENCH_TEST_SPAWN", None)   # trainers start as a user's do: fresh interpreters
        wb("data", "prepare", "builtin", "--preset", "cpu-small", "--set", *TINY, env=env)   # the cache warmed once
        # and this machine's matmul rate measured once (the first run's calibration), not inside the first timing
        wb("train", "cpu-small", "--name", "warm", "--runs-dir", str(tmp / "warm"), "--set", *TINY,
           "train.max_iters=5", "train.warmup_iters=1", env=env)
        if "slots" in parts:
            print("\n## CPU slots: a 6-trial grid\n")
            print("\n".join(slots(tmp, env)))
        if "shared" in parts or "killed" in parts:
            with postgres_server() as pg:
                if "shared" in parts:
                    print("\n## One PostgreSQL study, a 12-trial grid: one runner, then two\n")
                    print("\n".join(shared(tmp, env, pg["url"])))
                if "killed" in parts:
                    print("\n## Two runners, one killed with SIGKILL mid-trial\n")
                    print("\n".join(killed(tmp, env, pg["url"])))
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
