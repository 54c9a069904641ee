"""One run at a glance: `workbench runs` and the Runs pane say the same best val loss as the Train pane."""

from __future__ import annotations

from tests.support.rundirs import RunDir
from workbench.analysis.summary import summarize_run
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
