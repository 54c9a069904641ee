"""The Train pane's Health box and the Train tab's marker (the run doctor in the TUI)."""

from __future__ import annotations

import json

from tests.support.canned_runs import HARDWARE
from tests.support.tui import make_app, run, text_of, wait_for
from workbench.machine.activity import HardwareSnapshot
from workbench.rundir import write_status

CPU_ONLY = {**HARDWARE, "nvidia": []}


def _health(app) -> str:
    return text_of(app.query_one("#mon-health"))


def _train_tab(app) -> str:
    return app.query_one("#tabs").get_tab("train").label.plain


def test_health_box_shows_the_findings_of_the_run_shown(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="train")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 3, what="run list")
            app.monitor("beta", switch=False)  # a non-finite step was skipped at step 60
            await wait_for(pilot, lambda: "unstable: 1 training step went non-finite" in _health(app),
                           what=f"beta's finding; box: {_health(app)!r}")
            assert "→ --set train.lr=" in _health(app) and "workbench doctor beta" in _health(app)
            app.monitor("gamma", switch=False)  # failed: CUDA out of memory
            await wait_for(pilot, lambda: "memory: the run ran out of memory" in _health(app), what="gamma's finding")
            app.monitor("alpha", switch=False)
            await wait_for(pilot, lambda: "no problems found" in _health(app), what="alpha: healthy")
            assert _train_tab(app) == "3 Train"  # runs that ended before we watched them: no marker
    run(go())


def test_a_finding_during_a_run_marks_the_train_tab(live_runs_dir, monkeypatch):
    from workbench.tui.widgets import health
    monkeypatch.setattr(health.HealthBox, "INTERVAL", 0.2)
    # the machine as the fixture describes it, without a GPU, and nothing else busy: only the run's own data counts
    monkeypatch.setattr(health, "take_snapshot", lambda pid=None, interval=1.0: HardwareSnapshot(info=CPU_ONLY))

    async def go():
        app = make_app(live_runs_dir, initial_tab="hardware")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "delta", what="the live run followed")
            await wait_for(pilot, lambda: "no problems found" in _health(app), what="a healthy start")
            assert _train_tab(app) == "3 Train"
            with open(live_runs_dir / "delta" / "metrics.jsonl", "a") as f:  # the trainer skips a NaN step
                f.write(json.dumps({"kind": "event", "event": "nonfinite_skip", "step": 121, "loss": None}) + "\n")
            await wait_for(pilot, lambda: _train_tab(app) == "3 Train ●1 finding",
                           what=f"the marker; tab {_train_tab(app)!r}")
            assert app.query_one("#tabs").active == "hardware"  # marked while the user looks elsewhere
            assert "unstable" in _health(app)
            # the run ends (issue 43: the marker stayed): the findings stay in the box, the tab's marker goes
            write_status(live_runs_dir / "delta", state="finished", step=130)
            await wait_for(pilot, lambda: app.run_data["delta"].state == "finished", what="delta's end read")
            await wait_for(pilot, lambda: _train_tab(app) == "3 Train", what=f"no marker; tab {_train_tab(app)!r}")
            assert "unstable" in _health(app)
    run(go())


def test_the_last_eval_of_a_run_is_shown_as_such(live_runs_dir):
    """Issue 43: while a budgeted run's last eval ran (its steps done, no rate measured yet on a busy CPU) the bar
    said "warming up… 100%"."""
    async def go():
        app = make_app(live_runs_dir, initial_tab="train")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "delta", what="the live run followed")
            write_status(live_runs_dir / "delta", step=400, max_iters=400, budget_s=60.0, budget_spent_s=57.5)
            label = app.query_one("#mon-progress-text")
            await wait_for(pilot, lambda: "step 400 / 400" in text_of(label), what=lambda: text_of(label))
            assert text_of(label).split() == ["step", "400", "/", "400", "100%", "final", "eval…"], text_of(label)
    run(go())


def test_health_box_shows_the_queue_and_the_run_shown_in_it(runs_dir, monkeypatch):
    """Under the findings: the run shown's place in the queue (a sweep's trial pruned, by the sweep's rule) and the
    queue's line, which follows the queue (a runner taking the lock; a run started), read from a real queue.db."""
    import os
    import shutil
    import time

    from workbench.queue.runner import RunnerLock
    from workbench.queue.store import NewItem, QueueStore
    from workbench.tui.widgets import health
    monkeypatch.setattr(health.HealthBox, "INTERVAL", 0.2)
    tiny = ("model.dim=64", "model.n_layers=2")
    store = QueueStore(runs_dir)
    store.add(NewItem("cpu-small", tiny, name="q1"))
    store.add(NewItem("cpu-small", tiny, name="q2"))
    store.add_sweep("sw", {"name": "sw", "preset": "cpu-small", "method": "grid", "trials": 1, "pruner": "median",
                           "params": [{"key": "train.lr", "values": [0.01]}], "metric": "val_loss", "goal": "minimize"},
                    [({"train.lr": 0.01}, NewItem("cpu-small", tiny + ("train.lr=0.01",)), None, None)])
    note = "val_loss 5.2000 (step 40) at 50% of its budget is worse than the median of the trials before it there"
    store.update(store.find("sw-t0001").id, state="pruned", note=note, started=time.time() - 9, ended=time.time())
    shutil.copytree(runs_dir / "alpha", runs_dir / "sw-t0001")   # the directory its trainer left

    async def go():
        app = make_app(runs_dir, initial_tab="train")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.summaries, what="run list")
            app.monitor("sw-t0001", switch=False)
            await wait_for(pilot, lambda: "no problems found" in _health(app), what=lambda: _health(app))
            await wait_for(pilot, lambda: "in the queue: trial 1 of sweep sw (train.lr=0.01): pruned by the sweep's "
                                          f"median rule: {note}" in _health(app), what=lambda: _health(app))
            assert "queue: 2 queued; no runner: r in the Queue tab (7) starts one" in _health(app)
            lock = RunnerLock(runs_dir).acquire()     # a runner at work, as `queue run` holds it
            try:
                await wait_for(pilot, lambda: f"queue: 2 queued; runner pid {os.getpid()}" in _health(app),
                               what=lambda: _health(app))
                writer = QueueStore(runs_dir)
                writer.update(writer.claim_next().id, pid=os.getpid())   # q1 starts
                await wait_for(pilot, lambda: f"queue: 1 running (q1, starting), 1 queued; runner pid {os.getpid()}"
                               in _health(app), what=lambda: _health(app))
            finally:
                lock.release()
            # not a queue item: the queue's line alone; the runner gone before q1's trainer came: interrupted
            app.monitor("alpha", switch=False)
            await wait_for(pilot, lambda: "no problems found" in _health(app) and "in the queue" not in _health(app)
                           and "queue: q1 interrupted, 1 queued; no runner: r in the Queue tab (7) starts one"
                           in _health(app), what=lambda: _health(app))
    run(go())


def test_health_box_with_no_run_shown_still_shows_the_queue(tmp_path, monkeypatch):
    """Runs queued before any has started: no run to check, and the box says what waits and how to start it."""
    from workbench.queue.store import NewItem, QueueStore
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "presets"))
    QueueStore(tmp_path / "runs").add(NewItem("cpu-small", name="first"))

    async def go():
        app = make_app(tmp_path / "runs", initial_tab="train")
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: "queue: 1 queued; no runner: r in the Queue tab (7) starts one"
                           in _health(app), what=lambda: _health(app))
            assert "No run shown" in text_of(app.query_one("#mon-stats"))
    run(go())
