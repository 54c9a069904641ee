"""Early stopping (train.patience): the run stops after that many evals without a val-loss improvement,
ends in the state early_stopped, and the count of evals without improvement survives a resume.

A val-loss improvement must beat the best by train.min_delta; with min_delta = 100 no eval after the
first one can, so when the run stops is known exactly: the first eval is the best, every later one
is a bad one.
"""

from __future__ import annotations

import json

from tests.support.cli import tiny, wb
from tests.support.runs import read_jsonl
from workbench import rundir

# evals every 2 steps (none at step 0 counts: the loop's first eval is at step 2)
NO_GAIN = ("train.max_iters=40", "train.eval_interval=2", "train.ckpt_interval=100", "train.min_delta=100")


def _early_stops(d) -> list[dict]:
    return [r for r in read_jsonl(d / "metrics.jsonl") if r.get("event") == "early_stop"]


def test_patience_stops_the_run_as_early_stopped(tmp_path):
    root = str(tmp_path)
    cp = wb("train", "cpu-small", "--name", "es", "--runs-dir", root, *tiny(*NO_GAIN, "train.patience=2"))
    assert cp.returncode == 0, cp.stderr
    d = tmp_path / "es"
    st = rundir.read_status(d)
    assert (st.state, st.step) == ("early_stopped", 6), st  # best at 2, no gain at 4 and 6
    recs = read_jsonl(d / "metrics.jsonl")
    evals = {r["step"]: r["val_loss"] for r in recs if r["kind"] == "eval"}
    assert sorted(evals) == [0, 2, 4, 6]
    [ev] = _early_stops(d)
    assert ev["step"] == 6 and ev["best_val_loss"] == evals[2] == st.best_val_loss
    assert max(r["step"] for r in recs if r["kind"] == "train") == 6  # no step after the stop
    assert "early stop: val loss has not improved for 2 evals" in (d / "train.log").read_text()
    assert "early_stopped at step 6" in cp.stdout
    listed = next(r for r in json.loads(wb("runs", "--json", "--runs-dir", root, check=True).stdout)
                  if r["id"] == "es")
    assert listed["state"] == "early_stopped" and listed["step"] == 6


def test_patience_off_runs_to_the_end(tmp_path):
    root = str(tmp_path)
    wb("train", "cpu-small", "--name", "all", "--runs-dir", root,
       *tiny(*NO_GAIN, "train.max_iters=8", "train.patience=0"), check=True)
    d = tmp_path / "all"
    assert (rundir.read_status(d).state, rundir.read_status(d).step) == ("finished", 8)
    assert _early_stops(d) == []


def test_the_count_of_evals_without_gain_survives_a_resume(tmp_path):
    """patience 3: straight through, the run stops at step 8 (best at 2; no gain at 4, 6, 8). Stopped at
    step 5 (one bad eval counted) and resumed, it must stop at 8 too: a count that restarted at 0
    would stop at 10, and a lost best val loss at 12."""
    root = str(tmp_path)
    args = tiny(*NO_GAIN, "train.patience=3")
    wb("train", "cpu-small", "--name", "straight", "--runs-dir", root, *args, check=True)
    assert [e["step"] for e in _early_stops(tmp_path / "straight")] == [8]
    wb("train", "cpu-small", "--name", "r", "--runs-dir", root, *args, env={"WORKBENCH_TEST_SIGTERM_AT_STEP": "5"},
       check=True)
    d = tmp_path / "r"
    assert (rundir.read_status(d).state, rundir.read_status(d).step) == ("stopped", 5)
    assert _early_stops(d) == []
    wb("resume", "r", "--runs-dir", root, check=True)
    st = rundir.read_status(d)
    assert (st.state, st.step) == ("early_stopped", 8), st
    assert [e["step"] for e in _early_stops(d)] == [8]
    assert _early_stops(d)[0]["best_val_loss"] == _early_stops(tmp_path / "straight")[0]["best_val_loss"]


def _stop_step(evals: dict[int, float], patience: int, reset: bool) -> int | None:
    """Where early stopping stops on this eval sequence (the loop's first eval, at step 0, does not count)."""
    best, bad = None, 0
    for step, v in sorted(evals.items()):
        if step == 0:
            continue
        if best is None or v < best:
            best = v
            bad = 0 if reset else bad
        else:
            bad += 1
        if bad >= patience:
            return step
    return None


def test_an_improvement_resets_the_count_of_evals_without_gain(tmp_path):
    """The learning rate warms up to 1.0, so val loss goes down, up, down and up again: an improvement after a
    bad eval must start the count again. The stop step is read off the run's own evals both ways (with and
    without the reset), which must differ, so a count that never resets fails."""
    root = str(tmp_path)
    wb("train", "cpu-small", "--name", "es", "--runs-dir", root,
       *tiny("train.max_iters=40", "train.eval_interval=2", "train.ckpt_interval=100", "train.lr=1.0",
             "train.min_lr=1.0", "train.warmup_iters=12", "train.patience=2"), check=True)
    d = tmp_path / "es"
    evals = {r["step"]: r["val_loss"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "eval"}
    with_reset, without = _stop_step(evals, 2, True), _stop_step(evals, 2, False)
    assert with_reset is not None and without is not None and without < with_reset, evals
    assert [e["step"] for e in _early_stops(d)] == [with_reset] == [max(evals)]
    assert rundir.read_status(d).state == "early_stopped"
