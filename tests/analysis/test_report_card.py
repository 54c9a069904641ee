"""Report cards from task records: the headline metric of each task at a checkpoint, and its differences
from the previous scored step and from the weights the run started from, compared only over the same items."""

from __future__ import annotations

from pathlib import Path

from workbench.analysis.report_card import card_lines, report_card, task_scores
from workbench.rundir import TASKS_FILE, EventRecord, MetricsWriter, TaskRecord


def _run(root: Path, name: str, records: list, preset: str = "", evals: list | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "preset.toml").write_text(f'name = "cpu-small"\n{preset}')
    w = MetricsWriter(d / "metrics.jsonl")
    for r in records:
        w.write(r)
    w.close()
    if evals:
        w = MetricsWriter(d / TASKS_FILE)
        for r in evals:
            w.write(r)
        w.close()
    return d


def _t(step, task, value, metric="centered", n=100):
    return TaskRecord(step=step, task=task, metric=metric, value=value, n=n)


def test_card_differences_from_the_previous_step_and_the_source(tmp_path):
    _run(tmp_path, "base", [_t(0, "qa", 0.10, "exact", 50), _t(0, "mc", 0.20)])
    ft = [_t(0, "qa", 0.12, "exact", 50), _t(0, "qa", 0.30, "contains", 50), _t(0, "mc", 0.25),
          _t(100, "qa", 0.20, "exact", 50), _t(100, "mc", 0.35), _t(100, "mc", 0.6, "acc"),
          _t(200, "qa", 0.26, "exact", 50), _t(200, "mc", 0.40)]
    _run(tmp_path, "ft", ft, '[init]\nrun = "base"\nstep = 0\n',
         evals=[_t(200, "mc", 0.50, n=400)])  # workbench eval over all 400 items at step 200
    card = report_card(tmp_path, "ft", 100)
    assert (card.prev_step, card.base_label) == (0, "source base@0")
    got = {r.task: (r.metric, r.value, round(r.d_prev, 6), round(r.d_base, 6)) for r in card.rows}
    assert got == {"qa": ("exact", 0.20, 0.08, 0.10), "mc": ("centered", 0.35, 0.10, 0.15)}
    # at 200 the card shows the 400-item score, and compares it with nothing scored over 400 items
    card = report_card(tmp_path, "ft", 200)
    rows = {r.task: r for r in card.rows}
    assert (rows["mc"].value, rows["mc"].n, rows["mc"].d_prev, rows["mc"].d_base) == (0.50, 400, None, None)
    assert round(rows["qa"].d_prev, 6) == 0.06 and card.prev_step == 100
    lines = card_lines(card)
    assert lines[0].split() == ["task", "metric", "score", "n", "Δ", "step", "100", "Δ", "source", "base@0"]
    assert lines[1].split() == ["qa", "exact", "0.260", "50", "+0.060", "+0.160"]
    assert lines[2].split() == ["mc", "centered", "0.500", "400", "—", "—"]


def test_a_source_never_scored_is_compared_through_the_runs_own_step_0(tmp_path):
    _run(tmp_path, "base", [])
    _run(tmp_path, "ft", [_t(0, "mc", 0.2), _t(50, "mc", 0.3)], '[init]\nrun = "base"\nstep = 0\n')
    card = report_card(tmp_path, "ft", 50)
    assert card.base_label == "step 0 (the source's weights)" and round(card.rows[0].d_base, 6) == 0.1


def test_abandoned_timelines_are_not_scores(tmp_path):
    recs = [_t(0, "mc", 0.1), _t(10, "mc", 0.2), _t(20, "mc", 0.3),
            EventRecord(event="resume", step=10), _t(20, "mc", 0.25)]
    d = _run(tmp_path, "r", recs)
    assert {s: at[("mc", "centered")].value for s, at in task_scores(d).items()} == {0: 0.1, 10: 0.2, 20: 0.25}
    assert card_lines(report_card(tmp_path, "r", 30)) == [
        "no task scores at step 30; score it with `workbench eval r --checkpoint 30 --task builtin` or set "
        "train.eval_tasks"]


def test_an_edited_task_is_not_compared_with_its_old_items(tmp_path):
    old, new = (TaskRecord(step=s, task="qa", metric="exact", value=v, n=10, extra={"digest": d})
                for s, v, d in ((10, 0.1, "aaaa"), (20, 0.5, "bbbb")))
    again = TaskRecord(step=10, task="qa", metric="exact", value=0.3, n=10, extra={"digest": "bbbb"})
    _run(tmp_path, "r", [old, new])
    assert report_card(tmp_path, "r", 20).rows[0].d_prev is None
    _run(tmp_path, "r2", [old, new], evals=[again])  # step 10 scored again on the new items
    card = report_card(tmp_path, "r2", 20)
    assert card.prev_step == 10 and round(card.rows[0].d_prev, 6) == 0.2
