"""Stopping a run from the Train pane: x asks, y stops, even when y follows x at once.

The "trainer" is a real process (tests/tui/fixtures/fake_trainer.py, no torch) and the
stop goes through the real `workbench stop` CLI, which sends it SIGTERM.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.canned_runs import make_runs
from tests.support.tui import make_app, run, wait_for
from workbench.rundir import read_status

FAKE_TRAINER = Path(__file__).parent / "fixtures" / "fake_trainer.py"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def live_run(tmp_path, monkeypatch):
    """The canned runs plus ``delta``, marked running by a real child process that stops on SIGTERM."""
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    root = make_runs(tmp_path / "runs", live_pid=1)  # delta, its status rewritten by the child below
    proc = subprocess.Popen([sys.executable, str(FAKE_TRAINER), str(root / "delta")], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.readline().strip() == "ready"
    yield root, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.mark.parametrize("gap", [0.0, 0.7], ids=["at-once", "0.7s"])
def test_x_then_y_stops_the_run(live_run, gap):
    root, proc = live_run

    async def go():
        app = make_app(root, initial_tab="train")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "delta"
                           and app.run_data["delta"].state == "running", what="the live run shown")
            await pilot.press("x")
            if gap:
                await pilot.pause(gap)
            await pilot.press("y")
            await wait_for(pilot, lambda: proc.poll() is not None, timeout=30, what="the trainer to get SIGTERM")
            assert read_status(root / "delta").state == "stopped"
            await wait_for(pilot, lambda: app.run_data["delta"].state == "stopped", what="the pane to show it")
            assert app.screen.__class__.__name__ != "ConfirmScreen"
    run(go())


@pytest.mark.parametrize("start", ["train", "hardware", "curves"])
def test_keys_typed_ahead_reach_the_new_pane_and_the_dialog(live_run, start):
    """Keys that arrive together (typed ahead while the app was busy, or a fast `3 x y` over ssh)
    are queued before any of them is handled: the tab switch, the stop and the yes must all land."""
    from textual import events
    root, proc = live_run

    async def go():
        app = make_app(root, initial_tab=start)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: shown(app) == ("delta", "running"), what="the live run in the Train pane")
            for key in (["x", "y"] if start == "train" else ["3", "x", "y"]):
                app.post_message(events.Key(key, key))  # all queued at once, as a terminal delivers them
            await wait_for(pilot, lambda: proc.poll() is not None, timeout=30,
                           what=f"the trainer to get SIGTERM (screen {app.screen}, focus {app.focused})")
            assert app.query_one("#tabs").active == "train"
            if start == "curves":  # the x went to the stop, not to the curves' step/tokens toggle
                assert app.query_one("#curves-pane").x_axis == "step"
    run(go())


def test_x_then_n_leaves_the_run_alone(live_run):
    """n closes the question and sends nothing: asked again and answered y, exactly one stop goes out."""
    root, proc = live_run

    async def go():
        app = make_app(root, initial_tab="train")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: shown(app) == ("delta", "running"), what="the live run shown")
            await pilot.press("x")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen", what="the question")
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ != "ConfirmScreen", what="the answer")
            assert proc.poll() is None
            # A stop sent by the "n" would show as a second "Stopping delta" (or, if it landed first, as no
            # question below: the run shown would no longer be running).
            await pilot.press("x")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen", what="the question again")
            await pilot.press("y")
            await wait_for(pilot, lambda: proc.poll() is not None, timeout=30, what="the trainer to get SIGTERM")
            await wait_for(pilot, lambda: not any(w.group == "stop" for w in app.workers), what="the stop to end")
            stops = [str(n.message) for n in app._notifications if str(n.message).startswith("Stopping delta")]
            assert len(stops) == 1, [str(n.message) for n in app._notifications]
            assert not any("failed" in str(n.message) for n in app._notifications)
    run(go())


def shown(app) -> tuple[str, str] | None:
    """(run id, state) of the run the Train pane shows."""
    from workbench.tui.widgets.monitor import MonitorPane
    d = app.query_one(MonitorPane).shown
    return (d.run_id, d.state) if d is not None else None
