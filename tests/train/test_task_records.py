"""Task scores while training (train.eval_tasks): records at the chosen steps, the same scores as
`workbench eval` gives for the checkpoint, and a kill -9 and resume that neither repeats nor loses one."""

from __future__ import annotations

import json
import signal

import pytest

from tests.support.cli import tiny, wb
from tests.support.runs import read_jsonl
from workbench.analysis.report_card import task_scores

RUN = tiny("train.max_iters=24", "train.lr_decay_iters=24", "train.ckpt_interval=8", "train.eval_interval=12",
           "train.eval_tasks=['builtin']", "train.task_eval_every=6", "train.task_limit=16", "model.dropout=0.1")


def scores(run_dir) -> dict[tuple[int, str, str], float]:
    return {(s, t, m): r.value for s, at in task_scores(run_dir).items() for (t, m), r in at.items()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    root = tmp_path_factory.mktemp("straight")
    wb("train", "cpu-small", "--name", "s", "--runs-dir", str(root), *RUN, check=True)
    return root / "s"


def test_task_records_at_every_interval_and_step_0(straight):
    recs = [r for r in read_jsonl(straight / "metrics.jsonl") if r["kind"] == "task"]
    assert sorted({r["step"] for r in recs}) == [0, 6, 12, 18, 24]
    assert len(recs) == 5 * 2 * 3 and all(r["n"] == 16 for r in recs)
    assert {r["task"] for r in recs} == {"stdlib-next-line", "docs-cloze"}
    log = (straight / "train.log").read_text()
    assert "step 24: tasks stdlib-next-line " in log and "(centered; " in log


def test_the_trainer_scores_as_workbench_eval_does(straight):
    cp = wb("eval", str(straight), "--task", "builtin", "--limit", "16", "--json", "--no-save", check=True)
    ours = {t["task"]: t for t in json.loads(cp.stdout)["checkpoints"][0]["tasks"]}
    s = scores(straight)
    for task, t in ours.items():
        for metric in ("acc", "acc_norm", "centered"):
            assert s[(24, task, metric)] == pytest.approx(t[metric], abs=1e-12)


def test_kill_and_resume_neither_repeats_nor_loses_a_task_record(tmp_path, straight):
    root = str(tmp_path)
    cp = wb("train", "cpu-small", "--name", "k", "--runs-dir", root, *RUN, env={"WORKBENCH_TEST_KILL_AT_STEP": "20"})
    assert cp.returncode == -signal.SIGKILL
    d = tmp_path / "k"
    killed = [r["step"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "task" and r["metric"] == "acc"]
    assert killed == [0, 0, 6, 6, 12, 12, 18, 18]  # 18 was scored after the last checkpoint (16)
    wb("resume", "k", "--runs-dir", root, check=True)
    # in the file, 18 appears twice (the abandoned timeline is never rewritten); readers see each step once
    assert [r["step"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "task" and r["metric"] == "acc"
            and r["task"] == "docs-cloze"] == [0, 6, 12, 18, 18, 24]
    assert scores(d) == scores(straight)  # every step, bit for bit: the resumed weights are the same


def test_a_task_that_cannot_be_scored_is_refused_before_the_run_starts(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "options": ["a", "b"]}\n')
    cp = wb("train", "cpu-small", "--name", "x", "--runs-dir", str(tmp_path / "runs"),
            *tiny(f"train.eval_tasks=['{bad}']"))
    assert cp.returncode == 2
    assert cp.stderr.strip().splitlines()[-1].startswith(f"workbench: error: task {bad}, line 1: no task shape matches")
    assert not (tmp_path / "runs" / "x").exists()
