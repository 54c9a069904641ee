"""The run queue (`workbench queue`): add / ls / rm / move / pause in a real runs directory and database;
the runner starts real tiny runs one after the other through `train --detach`, lists a failed one with its
reason and goes on; a runner killed with kill -9 is replaced by one that adopts the live trainer, or resumes a
dead one from its last checkpoint (the losses after it equal a run never interrupted); one runner at a time."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import TINY, wb
from tests.support.runs import evals, losses, read_jsonl, wait_until
from workbench import rundir
from workbench.queue.store import QueueStore


def ls(root: Path) -> dict:
    cp = wb("queue", "ls", "--json", "--runs-dir", str(root), check=True)
    return json.loads(cp.stdout)


def states(root: Path) -> dict[str, str]:
    return {r["name"]: r["state"] for r in ls(root)["runs"]}


def add(root: Path, name: str, *sets: str, **kw) -> subprocess.CompletedProcess:
    return wb("queue", "add", "cpu-small", "--name", name, "--runs-dir", str(root), "--set", *TINY, *sets, **kw)


def runner(root: Path, env: dict | None = None) -> subprocess.Popen:
    """`workbench queue run` in a process of its own (a fresh interpreter: the test kills it)."""
    e = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "workbench", "queue", "run", "--runs-dir", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
                            start_new_session=True)


def db_item(root: Path, name: str):
    store = QueueStore.open_existing(root)
    try:
        return store.find(name) if store else None
    finally:
        if store:
            store.close()


def test_add_ls_move_rm_pause_and_bad_input(tmp_path):
    root = tmp_path / "runs"
    for name in ("a", "b", "c"):
        add(root, name, "train.max_iters=4", check=True)
    assert [r["name"] for r in ls(root)["runs"]] == ["a", "b", "c"]
    assert set(states(root).values()) == {"queued"}
    # the queue is a real SQLite database in WAL mode, not a file rewritten in place
    conn = sqlite3.connect(root / "queue.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT count(*) FROM items").fetchone()[0] == 3
    conn.close()

    cp = wb("queue", "move", "c", "1", "--runs-dir", str(root), check=True)
    assert "c is now at position 1 of 3" in cp.stdout
    assert [(r["name"], r["position"]) for r in ls(root)["runs"]] == [("c", 1), ("a", 2), ("b", 3)]
    cp = wb("queue", "rm", "b", "--runs-dir", str(root), check=True)
    assert "removed b (queued)" in cp.stdout
    assert [r["name"] for r in ls(root)["runs"]] == ["c", "a"]

    # every bad input: one line, exit 2, the queue as it was
    before = ls(root)["runs"]
    (root / "taken").mkdir()
    bad = [
        (["queue", "add", "cpu-small", "--name", "a"], "run name 'a' is taken (the queue has a run of that name)"),
        (["queue", "add", "cpu-small", "--name", "taken"], "a run directory"),
        (["queue", "add", "no-such-preset"], "no-such-preset"),
        (["queue", "add", "cpu-small", "--set", "train.lrr=1"], "did you mean 'lr'"),
        (["queue", "add", "cpu-small", "--corpus", str(tmp_path / "missing.txt")], "does not exist"),
        (["queue", "add", "cpu-small", "--set", "model.dim=16384", "model.n_layers=48"], "does not fit"),
        (["queue", "move", "cc", "1"], "no run 'cc' in the queue (did you mean 'c'?)"),
        (["queue", "move", "a", "0"], "position 0 is not a place in the queue"),
        (["queue", "rm", "a", "zzz"], "no run 'zzz' in the queue"),
    ]
    for args, words in bad:
        cp = wb(*args, "--runs-dir", str(root))
        assert cp.returncode == 2, (args, cp.stdout, cp.stderr)
        err = cp.stderr.strip().splitlines()
        assert len(err) == 1 and words in err[0], (args, cp.stderr)
    assert ls(root)["runs"] == before   # `rm a zzz` removed nothing

    # paused: the runner starts nothing and says why; resumed, the queue is as it was
    wb("queue", "pause", "--runs-dir", str(root), check=True)
    assert ls(root)["paused"] is True
    cp = wb("queue", "run", "--runs-dir", str(root), check=True)
    assert "the queue is paused: 0 run(s) ended here, 2 queued" in cp.stdout
    assert set(states(root).values()) == {"queued"} and not (root / "c").exists()
    cp = wb("queue", "resume", "--runs-dir", str(root), check=True)
    assert "queue resumed: 2 queued" in cp.stdout and ls(root)["paused"] is False


@pytest.mark.slow
def test_the_runner_runs_the_queue_in_order_and_a_failed_run_is_listed_with_its_reason(tmp_path):
    root = tmp_path / "runs"
    # a corpus whose first record is good (so `train` takes it) and whose third is not JSON: the trainer fails
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text(json.dumps({"text": "def f():\n    return 1\n" * 50}) + "\n"
                      + json.dumps({"text": "x = 2\n" * 50}) + "\n{not json\n")
    add(root, "first", "train.max_iters=6", check=True)
    wb("queue", "add", "cpu-small", "--name", "broken", "--corpus", str(corpus), "--runs-dir", str(root),
       "--set", *TINY, "train.max_iters=6", check=True)
    add(root, "last", "train.max_iters=6", check=True)
    cp = wb("queue", "run", "--runs-dir", str(root), timeout=240, check=True)
    out = cp.stdout
    assert out.index("starting first") < out.index("starting broken") < out.index("starting last"), out
    assert states(root) == {"first": "finished", "broken": "failed", "last": "finished"}
    rows = {r["name"]: r for r in ls(root)["runs"]}
    # the failed run's line says what broke, where (the doctor adds its top finding when it has one)
    assert "notes.jsonl" in rows["broken"]["note"] and "line 3" in rows["broken"]["note"], rows["broken"]
    assert rundir.read_status(root / "broken").state == "failed"
    # one after the other: each started after the one before had ended
    assert rows["first"]["ended"] <= rows["broken"]["started"] and rows["broken"]["ended"] <= rows["last"]["started"]
    for name in ("first", "last"):
        st = rundir.read_status(root / name)
        assert st.state == "finished" and st.step == 6
        final = evals(root / name)
        assert rows[name]["metric"] == pytest.approx(final[max(final)])   # the last eval's val loss
    text = wb("queue", "ls", "--runs-dir", str(root), check=True).stdout
    assert "failed" in text and "line 3" in text


RESUMABLE = ["train.max_iters=40", "train.ckpt_interval=10", "train.eval_interval=10", "train.keep_last=10"]


@pytest.mark.slow
def test_a_killed_runner_and_trainer_resume_from_the_checkpoint_and_the_queue_finishes(tmp_path):
    """kill -9 of the runner mid-run, then its trainer dies too (as in a reboot): `queue run` again resumes the run
    from its last checkpoint (its losses after it equal an uninterrupted run's, bit for bit), then runs the rest;
    nothing runs twice."""
    root = tmp_path / "runs"
    add(root, "long", *RESUMABLE, check=True)
    add(root, "after", "train.max_iters=4", check=True)
    # the trainer kills itself after step 15 (its checkpoint at 10 is the last complete one); it is held (SIGSTOP)
    # until its runner is dead: on a busy machine it reached step 15 first and that runner resumed it, legitimately
    first = runner(root, env={"WORKBENCH_TEST_KILL_AT_STEP": "15"})
    trainer = None
    try:
        trainer = wait_until(lambda: (it := db_item(root, "long")) and it.pid, timeout=60, what="the trainer to start")
        os.kill(trainer, signal.SIGSTOP)
        # a second runner while the first holds the queue: one line, exit 2
        cp = wb("queue", "run", "--runs-dir", str(root))
        assert cp.returncode == 2 and "is already running" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
        if trainer:
            os.kill(trainer, signal.SIGCONT)
    wait_until(lambda: rundir.read_status(root / "long").state == "crashed", timeout=60, what="the trainer to die")
    assert rundir.list_checkpoints(root / "long")[-1]["step"] == 10
    row = next(r for r in ls(root)["runs"] if r["name"] == "long")
    assert row["state"] == "interrupted" and "queue run" in row["note"]

    cp = wb("queue", "run", "--runs-dir", str(root), timeout=240, check=True)
    assert "resuming long from step_0000010" in cp.stdout, cp.stdout
    assert states(root) == {"long": "finished", "after": "finished"}
    assert rundir.read_status(root / "long").step == 40
    events = [r["event"] for r in read_jsonl(root / "long" / "metrics.jsonl") if r["kind"] == "event"]
    assert events.count("start") == 1 and events.count("resume") == 1   # resumed, never started again
    assert "starting long" not in cp.stdout and cp.stdout.count("starting after") == 1
    # the reference: the same run, never interrupted
    ref = tmp_path / "ref"
    wb("train", "cpu-small", "--name", "long", "--runs-dir", str(ref), "--set", *TINY, *RESUMABLE, check=True)
    resumed, straight = losses(root / "long", since_last_start=True), losses(ref / "long")
    assert sorted(resumed) == list(range(11, 41))
    assert all(resumed[s] == straight[s] for s in resumed), [(s, resumed[s], straight[s]) for s in resumed]


@pytest.mark.slow
def test_a_runner_killed_while_its_trainer_lives_is_replaced_by_one_that_adopts_it(tmp_path):
    root = tmp_path / "runs"
    add(root, "budgeted", "train.eval_interval=50", "--time-budget", "5s", check=True)
    first = runner(root)
    try:
        pid = wait_until(lambda: (it := db_item(root, "budgeted")) and it.pid, timeout=60, what="the trainer to start")
        # held (SIGSTOP) until the next runner has looked: on a busy machine its 5 s ran out first
        os.kill(pid, signal.SIGSTOP)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    assert rundir.pid_alive(pid)            # the trainer is in its own session: the runner's death leaves it be
    log = tmp_path / "second.log"
    with open(log, "w") as out:
        second = subprocess.Popen([sys.executable, "-m", "workbench", "queue", "run", "--runs-dir", str(root)],
                                  stdout=out, stderr=subprocess.STDOUT, text=True, env=dict(os.environ,
                                                                                           PYTHONUNBUFFERED="1"))
    try:
        wait_until(lambda: "adopted budgeted" in log.read_text(), timeout=60, what="the next runner to look")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert second.wait(120) == 0, log.read_text()
    assert f"adopted budgeted: its trainer (pid {pid}) is still running" in log.read_text(), log.read_text()
    assert states(root) == {"budgeted": "finished"}
    assert db_item(root, "budgeted").launches == 1
