"""The tailer reads only bytes appended since its last read, and the run model built from them."""

import json

import pytest

from workbench.rundir import MetricsTail, RunStatus
from workbench.tui.rundata import RunData, downsample, ema
from workbench.tui.watcher import LogTail, RunWatcher


def _rec(step, **kw):
    return json.dumps({"kind": "train", "step": step, "loss": 5.0 - step / 100, "elapsed_s": step * 0.5,
                       "tokens_seen": step * 256, **kw}) + "\n"


def test_metrics_tail_reads_only_new_bytes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_rec(1) + _rec(2))
    tail = MetricsTail(path)
    assert [r["step"] for r in tail.read_new()] == [1, 2]
    size = path.stat().st_size
    assert tail.offset == size
    # Scribble over the bytes already read: a reader that re-read the file would see it.
    with open(path, "r+b") as f:
        f.write(b"X" * size)
    assert tail.read_new() == []
    with open(path, "a") as f:
        f.write(_rec(3))
        f.write('{"kind": "train", "step": 4')  # half a line: kept until its newline arrives
    assert [r["step"] for r in tail.read_new()] == [3]
    with open(path, "a") as f:
        f.write(', "loss": 1.0}\n')
    assert [r["step"] for r in tail.read_new()] == [4]


def test_log_tail_starts_near_the_end_and_follows(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("".join(f"line {i}\n" for i in range(5000)))
    tail = LogTail(path, start_tail_bytes=100)
    first = tail.read_new()
    assert first[-1] == "line 4999" and len(first) < 20
    assert all(ln.startswith("line ") for ln in first)  # no half line from the cut
    with open(path, "a") as f:
        f.write("step 1\rstep 2\n")
    assert tail.read_new() == ["step 2"]


def test_watcher_posts_only_what_is_new(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "metrics.jsonl").write_text(_rec(10))
    (run / "status.json").write_text(json.dumps({"state": "finished", "step": 10, "max_iters": 20}))
    posted = []
    w = RunWatcher(tmp_path, posted.append)
    w.watch("r1", with_log=True)
    assert w.poll_once() == 1
    assert [r["step"] for r in posted[0].records] == [10] and posted[0].status.state == "finished"
    assert w.poll_once() == 0  # nothing new: nothing posted
    with open(run / "metrics.jsonl", "a") as f:
        f.write(_rec(20))
    with open(run / "train.log", "a") as f:
        f.write("hello\n")
    w.poll_once()
    assert [r["step"] for r in posted[-1].records] == [20] and posted[-1].log_lines == ["hello"]


def test_eta_leaves_out_warmup_and_compile():
    d = RunData("r")
    d.status = RunStatus(state="running", max_iters=1000)
    d.feed([{"kind": "event", "event": "start", "step": 0}])
    # first record is slow (compile / warm-up): 10 steps in 60 s
    d.feed([{"kind": "train", "step": 10, "loss": 5.0, "elapsed_s": 60.0}])
    assert d.steps_per_s() is None
    d.feed([{"kind": "train", "step": s, "loss": 4.0, "elapsed_s": 60.0 + (s - 10) / 10} for s in (20, 30, 40)])
    assert abs(d.steps_per_s() - 10.0) < 1e-9  # 10 steps/s, not diluted by the first minute
    assert abs(d.eta_s() - (1000 - 40) / 10.0) < 1e-9
    d.feed([{"kind": "event", "event": "resume", "step": 40}])
    assert d.steps_per_s() is None  # a resume starts the measurement over


def test_non_finite_losses_are_not_plotted():
    d = RunData("r")
    d.feed([{"kind": "train", "step": 1, "loss": float("nan")}, {"kind": "train", "step": 2, "loss": 3.0},
            {"kind": "eval", "step": 2, "val_loss": None}])
    assert d.steps == [2] and d.eval_steps == []


def test_ema_and_downsample():
    assert ema([1.0, 1.0, 1.0], 0.9) == [1.0, 1.0, 1.0]  # bias-corrected: no ramp from zero
    # it smooths: (0.5 * 0 + 0.5 * 10) / (1 - 0.5 ** 2) for the second point, not 10
    assert ema([0.0, 10.0, 10.0], 0.5) == pytest.approx([0.0, 20 / 3, 60 / 7])
    assert ema([3.0, 1.0], 0.0) == [3.0, 1.0]  # smoothing off
    xs, ys = downsample(list(range(1000)), [2 * x for x in range(1000)], 100)
    assert xs == [*range(0, 1000, 10), 999]  # evenly strided, the last point kept
    assert ys == [2 * x for x in xs]  # each y stays with its x
    assert downsample([1, 2, 3], [4, 5, 6], 100) == ([1, 2, 3], [4, 5, 6])  # few points: all of them


def test_watching_a_run_for_its_log_later_does_not_repeat_its_metrics(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "metrics.jsonl").write_text(_rec(10) + _rec(20))
    (run / "train.log").write_text("a\nb\n")
    posted = []
    w = RunWatcher(tmp_path, posted.append)
    w.watch("r1")  # for the loss curves: metrics only
    w.poll_once()
    w.watch("r1", with_log=True, fresh_log=True)  # now shown in the Train pane
    w.poll_once()
    steps = [r["step"] for m in posted for r in m.records]
    assert steps == [10, 20]
    assert posted[-1].log_lines == ["a", "b"]
    w.watch("r1", with_log=True, fresh_log=True)  # shown again after another run: the tail again
    w.poll_once()
    assert posted[-1].log_lines == ["a", "b"] and posted[-1].records == []


def _task(step, task, metric, value, n=20):
    return {"kind": "task", "step": step, "task": task, "metric": metric, "value": value, "n": n}


def test_watcher_reads_tasks_jsonl_whole_only_when_it_changed(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "metrics.jsonl").write_text(_rec(10))
    posted = []
    w = RunWatcher(tmp_path, posted.append)
    w.watch("r1")
    w.poll_once()
    assert posted[-1].task_file is None  # no tasks.jsonl: nothing to say
    (run / "tasks.jsonl").write_text(json.dumps(_task(10, "qa", "exact", 0.5)) + "\n")
    assert w.poll_once() == 1 and [r["value"] for r in posted[-1].task_file] == [0.5]
    assert w.poll_once() == 0  # unchanged: not read again
    with open(run / "tasks.jsonl", "a") as f:
        f.write(json.dumps(_task(20, "qa", "exact", 0.75)) + "\n")
    w.poll_once()
    assert [r["value"] for r in posted[-1].task_file] == [0.5, 0.75]  # the whole file, not only the new line
    (run / "tasks.jsonl").unlink()
    w.poll_once()
    assert posted[-1].task_file == []


def test_run_data_task_scores_from_both_files_one_line_per_number_of_items():
    from workbench.tui.plot import task_series

    d = RunData("r")
    d.feed([_task(10, "nl", "centered", 0.1), _task(10, "nl", "acc", 0.3),
            _task(20, "nl", "centered", 0.2), _task(30, "nl", "centered", 0.4)])
    # workbench eval scored step 20 again over the same 20 items (it wins), and 10 and 20 over 100 items
    d.set_task_file([_task(20, "nl", "centered", 0.25), _task(10, "nl", "centered", 0.05, n=100),
                     _task(20, "nl", "centered", 0.15, n=100), _task(20, "qa", "exact", 0.5, n=50)])
    assert d.task_names() == ["nl", "qa"]
    assert d.task_points("nl", "centered") == {20: ([10, 20, 30], [0.1, 0.25, 0.4]), 100: ([10, 20], [0.05, 0.15])}
    assert d.task_points("qa", "exact") == {50: ([20], [0.5])}
    metric, series = task_series([d], "nl")
    assert metric == "centered"  # the headline, not acc
    assert [(s.label, s.xs, s.ys) for s in series] == [("nl centered n=20", [10.0, 20.0, 30.0], [0.1, 0.25, 0.4]),
                                                       ("nl centered n=100", [10.0, 20.0], [0.05, 0.15])]
    assert series[0].color == series[1].color  # one run, one colour
    # a resume from 20 abandons the trainer's step 30 (as current_timeline does)
    d.feed([{"kind": "event", "event": "resume", "step": 20}])
    assert d.task_points("nl", "centered")[20] == ([10, 20], [0.1, 0.25])
    d.set_task_file([])
    assert d.task_points("nl", "centered") == {20: ([10, 20], [0.1, 0.2])}
