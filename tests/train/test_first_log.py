"""Each trainer process logs its first step whatever train.log_interval says (issue 53, bug 10: on a slow CPU, ~5 s a
step at log_interval 10, the Train pane showed nothing for the first 45-60 s). Real tiny runs: one stopped dead
after its third step (a stand-in for "the first seconds of a slow run": what is on disk when step 3 is done), one
resumed (the resuming process's own first step)."""

from __future__ import annotations

import json

from tests.support.cli import tiny, wb
from tests.support.tui import make_app, run, text_of, wait_for
from workbench import rundir


def train_steps(run_dir) -> list[int]:
    return [r.step for r in rundir.read_metrics(run_dir / "metrics.jsonl") if r.kind == "train"]


def test_a_run_logs_its_first_step_though_log_interval_is_ten(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    root = tmp_path / "runs"
    cp = wb("train", "cpu-small", "--name", "slow", "--runs-dir", str(root),
            *tiny("train.log_interval=10", "train.max_iters=40", "train.eval_interval=20", "train.ckpt_interval=20"),
            env={"WORKBENCH_TEST_KILL_AT_STEP": "3"})
    assert cp.returncode != 0, cp.stdout                               # killed after step 3, as planned
    recs = [r for r in rundir.read_metrics(root / "slow" / "metrics.jsonl") if r.kind == "train"]
    assert [r.step for r in recs] == [1], [r.step for r in recs]       # before the fix: none until step 10
    first = recs[0]
    assert first.loss is not None and first.lr is not None, first   # no tokens/s yet: one step is no rate
    assert f"step 1/40: loss {first.loss:.4f}" in (root / "slow" / "train.log").read_text()
    # what `workbench runs` reports of it: the step-1 loss
    listed = {r["id"]: r for r in json.loads(wb("runs", "--runs-dir", str(root), "--json", check=True).stdout)}
    assert listed["slow"]["train_loss"] == first.loss, listed["slow"]

    async def go():  # and the Train pane shows it
        app = make_app(root, initial_tab="train")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: f"{first.loss:.4f}" in text_of(app.query_one("#mon-stats")),
                           what=lambda: text_of(app.query_one("#mon-stats")))
    run(go())


def test_a_resumed_process_logs_its_own_first_step(tmp_path):
    root = tmp_path / "runs"
    wb("train", "cpu-small", "--name", "r", "--runs-dir", str(root),
       *tiny("train.log_interval=10", "train.max_iters=12", "train.eval_interval=100"), check=True)
    assert train_steps(root / "r") == [1, 10, 12]                      # the first, the interval's, the last
    wb("resume", "r", "--runs-dir", str(root), "--more", "15", check=True)
    assert train_steps(root / "r") == [1, 10, 12, 13, 20, 27]          # the resuming process's first: step 13
