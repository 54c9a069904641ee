"""One run at a glance: `workbench runs` and the Runs pane say the same best val loss as the Train pane; `workbench
runs` shows the share of a run's wall-clock spent in evals and checkpoint saves, as its metrics' times say."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.cli import wb
from tests.support.rundirs import RunDir
from tests.support.runs import read_jsonl
from workbench.analysis.summary import summarize_run
from workbench.commands.runs import share
from workbench.rundir import read_status
from workbench.tui.rundata import RunData


def _data(run_dir) -> RunData:
    """What the Train pane holds for the run (its records fed as the watcher feeds them)."""
    from workbench.rundir import read_metrics, read_status
    d = RunData(run_dir.name)
    d.status = read_status(run_dir)
    d.feed(read_metrics(run_dir / "metrics.jsonl"))
    return d


def test_best_val_is_one_number_for_a_run_with_only_its_step_0_eval(tmp_path):
    """A running run whose first eval (step 0) exists and nothing better yet: the Train pane showed it, the
    Runs table and `workbench runs` showed "—"."""
    with RunDir(tmp_path, "r", 'name = "cpu-small"\n') as r:
        r.eval(0, 9.1, 8.9672)
        r.train(1, 9.0)
        r.status(state="finished", step=1, max_iters=100)
    s = summarize_run(tmp_path / "r")
    assert s.best_val_loss == 8.9672 == _data(tmp_path / "r").best_val()


def test_workbench_runs_shows_the_share_of_the_wall_clock_in_evals(trained_run):
    """The tiny run's eval records time each eval (as the metrics' own times say: from the record before it, the
    train record of its step or the start event, to it); the run's totals add the evals and their samples up
    against its wall-clock since it started; `workbench runs` shows that share, and the save share."""
    recs = read_jsonl(trained_run / "metrics.jsonl")
    evals = [r for r in recs if r["kind"] == "eval"]
    for i, r in enumerate(recs):
        if r["kind"] == "eval":
            assert r["seconds"] == pytest.approx(r["time"] - recs[i - 1]["time"], abs=0.05), r["step"]
    end = recs[-1]
    assert end["event"] == "finish"
    samples = read_jsonl(trained_run / "samples.jsonl")  # one after each eval but step 0's
    assert [s["step"] for s in samples] == [e["step"] for e in evals[1:]]
    sampling = sum(s["time"] - e["time"] for s, e in zip(samples, evals[1:]))
    assert end["eval_s"] == pytest.approx(sum(e["seconds"] for e in evals) + sampling, abs=0.05)
    saves = sum(r["seconds"] for r in recs if r.get("event") == "checkpoint")
    assert end["ckpt_s"] == pytest.approx(saves, abs=0.01)
    assert end["elapsed_s"] == pytest.approx(end["time"] - read_status(trained_run).started, abs=0.05)
    # (records' times against the trainer's own clock: 0.05 s as above; a loaded run differed by 0.021 s)
    assert evals[-1]["eval_s"] == pytest.approx(end["eval_s"] - (samples[-1]["time"] - evals[-1]["time"]), abs=0.05)

    out = wb("runs", "--runs-dir", str(trained_run.parent), check=True).stdout.splitlines()
    head = re.split(r"\s{2,}", out[0])
    row = dict(zip(head, re.split(r"\s{2,}", next(line for line in out if line.startswith("tiny ")))))
    assert row["EVAL %"] == share(end["eval_s"] / end["elapsed_s"]) != "-"
    assert row["SAVE %"] == share(end["ckpt_s"] / end["elapsed_s"])
    js = json.loads(wb("runs", "--json", "--runs-dir", str(trained_run.parent), check=True).stdout)
    s = next(r for r in js if r["id"] == "tiny")
    assert s["eval_share"] == end["eval_s"] / end["elapsed_s"] and s["eval_s"] == end["eval_s"]


def test_a_run_from_before_the_time_totals_shows_no_eval_share(tmp_path):
    with RunDir(tmp_path, "old", 'name = "cpu-small"\n') as r:
        r.eval(0, 9.1, 8.9)
        r.train(1, 9.0, elapsed_s=1.0)
        r.event("finish", 1)
        r.status(state="finished", step=1, max_iters=1)
    s = summarize_run(tmp_path / "old")
    assert s.eval_share is None and s.elapsed_s is None
