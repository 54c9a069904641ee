"""`workbench doctor` sees the queue: a run still queued (no directory yet) is told with its place, a sweep's
trial with how it ended there (pruned by the sweep's rule, failed with its note, refused before it was queued,
ranked among the finished), and a runs directory whose queue has runs waiting with no runner gets the finding
`N runs queued and no runner: `workbench queue run``, gone while a runner holds the queue (a real lock) and
replaced by `queue.paused` when that runner has been told to start nothing. The queue is a real queue.db made
through QueueStore; the trials' directories are a real tiny run."""

from __future__ import annotations

import json
import os
import shutil
import time

from tests.support.cli import wb
from workbench.queue.runner import RunnerLock
from workbench.queue.store import NewItem, QueueStore

TINY = ("model.dim=64", "model.n_layers=2")
PRUNED = "val_loss 5.2000 (step 40) at 50% of its budget is worse than the median of the trials before it there"
OOM = "out of memory at step 3; doctor: the run ran out of memory (--set train.batch_size=2)"


def make_queue(root, trained_run=None) -> None:
    """q1, q2 queued; sweep sw (median pruner): t0001 finished (3.5, beside a busy process), t0002 pruned,
    t0003 failed, t0004 refused; t0002 and t0003 have run directories (copies of a real tiny run)."""
    store = QueueStore(root)
    now = time.time()
    store.add(NewItem("cpu-small", TINY, name="q1"))
    store.add(NewItem("cpu-small", TINY, name="q2"))
    lrs = (0.001, 0.01, 0.03)
    store.add_sweep("sw", {"name": "sw", "preset": "cpu-small", "method": "grid", "trials": 4,
                           "params": [{"key": "train.lr", "values": [*lrs, 1.0]}], "metric": "val_loss",
                           "goal": "minimize", "pruner": "median"},
                    [*(({"train.lr": lr}, NewItem("cpu-small", TINY + (f"train.lr={lr}",)), None, None) for lr in lrs),
                     ({"train.lr": 1.0}, None, None, "does not fit this machine's memory by the estimate")])
    ends = {"sw-t0001": dict(state="finished", metric=3.5, others_cpu=0.41,
                             others=[{"pid": 812, "name": "python3", "cpu_share": 0.38}]),
            "sw-t0002": dict(state="pruned", note=PRUNED), "sw-t0003": dict(state="failed", note=OOM)}
    for name, fields in ends.items():
        store.update(store.find(name).id, started=now - 60, ended=now - 30, launches=1, **fields)
        if trained_run is not None and name != "sw-t0001":
            shutil.copytree(trained_run, root / name)   # the run the runner started under that name
    store.close()


def doctor(root, run: str) -> dict:
    return json.loads(wb("doctor", run, "--runs-dir", str(root), "--json", check=True).stdout)


def test_a_queued_run_is_told_with_its_place_and_the_queue_without_a_runner(tmp_path):
    root = tmp_path / "runs"
    make_queue(root)
    cp = wb("doctor", "q2", "--runs-dir", str(root))
    assert cp.returncode == 0, cp.stderr     # it has no directory: before, "no run 'q2'", exit 2
    out = cp.stdout
    assert out.startswith("run q2 (queued, not started yet; no run directory): 1 finding(s)"), out
    assert "   in queue  queued at position 2 of 2\n" in out
    assert "   queue     2 queued; no runner: `workbench queue run` starts one\n" in out
    assert "1. [medium] queue: 2 runs queued and no runner: `workbench queue run`" in out
    assert "evidence  waiting: q1, q2" in out and "change    workbench queue run --detach" in out
    r = doctor(root, "q2")
    assert r["state"] == "queued" and r["path"] is None and not r["ok"]
    assert [f["code"] for f in r["findings"]] == ["queue.no_runner"]
    assert r["findings"][0]["command"] == "workbench queue run --detach"
    assert r["queue"] == {"state": "queued", "run": "queued at position 2 of 2",
                          "queue": "2 queued; no runner: `workbench queue run` starts one", "runner_pid": None}

    # a runner at work (this process holds the queue's lock, as `queue run` does): no finding
    lock = RunnerLock(root).acquire()
    try:
        r = doctor(root, "q2")
        assert r["findings"] == [] and r["ok"] and r["queue"]["runner_pid"] == os.getpid()
        assert r["queue"]["queue"] == f"2 queued; runner pid {os.getpid()}"
        QueueStore(root).set_paused(True)     # ... told to start nothing: the queue waits on `queue resume`
        r = doctor(root, "q2")
        assert [f["code"] for f in r["findings"]] == ["queue.paused"]
        assert r["findings"][0]["change"] == "workbench queue resume"
        assert r["queue"]["run"] == "queued at position 2 of 2; the queue is paused (`workbench queue resume`)"
    finally:
        lock.release()
    # neither a run nor in the queue: refused as before
    cp = wb("doctor", "q3", "--runs-dir", str(root))
    assert cp.returncode == 2 and "no run 'q3'" in cp.stderr and not cp.stdout


def test_a_sweeps_trial_is_told_how_it_ended_in_the_queue(tmp_path, trained_run):
    root = tmp_path / "runs"
    make_queue(root, trained_run)
    own = {f["code"] for f in doctor(trained_run.parent, trained_run.name)["findings"]}

    r = doctor(root, "sw-t0002")    # a run directory: the run's own findings, and the queue's
    assert r["queue"]["state"] == "pruned"
    assert r["queue"]["run"] == f"trial 2 of sweep sw (train.lr=0.01): pruned by the sweep's median rule: {PRUNED}"
    assert {f["code"] for f in r["findings"]} == own | {"queue.no_runner"}
    text = wb("doctor", "sw-t0002", "--runs-dir", str(root), check=True).stdout
    assert "\n   in queue  trial 2 of sweep sw (train.lr=0.01): pruned by the sweep's median rule: val_loss" in text

    failed = doctor(root, "sw-t0003")["queue"]["run"]
    assert failed == f"trial 3 of sweep sw (train.lr=0.03): failed in the queue: {OOM}"
    # no directory: its state, its rank among the finished, the busy neighbour that makes it not comparable
    r = doctor(root, "sw-t0001")
    assert r["queue"]["run"] == (
        "trial 1 of sweep sw (train.lr=0.001): finished in the queue: val_loss 3.5000, rank 1 of 1 finished; ran "
        "beside other processes (41 % of the CPU; busiest: python3 (pid 812) 38 %) (not comparable with runs that "
        "had the machine to themselves)")
    r = doctor(root, "sw-t0004")
    assert r["state"] == "refused" and r["queue"]["run"] == (
        "trial 4 of sweep sw (train.lr=1.0): refused before it was queued: does not fit this machine's memory by "
        "the estimate")
    text = wb("doctor", "sw-t0004", "--runs-dir", str(root), check=True).stdout
    assert text.startswith("run sw-t0004 (refused by its sweep; no run directory)")
    # a run of a runs directory without a queue: nothing about a queue
    assert doctor(trained_run.parent, trained_run.name)["queue"] is None
