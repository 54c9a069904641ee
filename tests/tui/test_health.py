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
            await wait_for(pilot, lambda: _train_tab(app) == "3 Train ●1", what=f"the marker; tab {_train_tab(app)!r}")
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
