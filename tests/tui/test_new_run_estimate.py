"""The new-run form shows, before anything starts, whether the run fits this machine and how long it
will take, and asks before starting one that does not fit."""

from __future__ import annotations

from textual.widgets import Select

from tests.support.cli import wb
from tests.support.tui import make_app, run, text_of, wait_for


def test_new_run_form_shows_fit_and_time_and_asks_when_it_does_not_fit(runs_dir, monkeypatch):
    from workbench.tui import launcher
    started = []
    monkeypatch.setattr(launcher, "start_run", lambda root, req, timeout=120: started.append(req.preset) or "")

    async def go():
        app = make_app(runs_dir)  # the fixture machine: an RTX 4060 with 7 of 8 GiB free
        async with app.run_test(size=(160, 48)) as pilot:
            app.action_new_run("gpu-8gb")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen", what="the form")
            await wait_for(pilot, lambda: "fits:" in text_of(app.screen.query_one("#nr-estimate")), what="the estimate")
            est = app.screen.query_one("#nr-estimate")
            text = text_of(est)
            assert "fits: ~3.98 GiB of 7.00 GiB NVIDIA GeForce RTX 4060 free VRAM" in text, text
            assert "for 10,000 steps at" in text and "tokens/s (estimate)" in text, text
            # another preset: gpu-24gb needs ~8.6 GiB
            app.screen.query_one("#nr-preset", Select).value = "gpu-24gb"
            await wait_for(pilot, lambda: "does not fit" in text_of(est), what="the new estimate")
            assert "does not fit: ~8.55 GiB of 7.00 GiB" in text_of(est) and "try " in text_of(est)
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen", what="the question")
            assert "does not fit this machine" in text_of(app.screen.query_one("#confirm-question"))
            await pilot.press("n")  # no: back to the form, nothing started
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen")
            assert started == []
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen")
            await pilot.press("y")  # yes: started anyway
            await wait_for(pilot, lambda: started == ["gpu-24gb"], what=f"the start ({started})")
    run(go())


def test_the_form_takes_a_time_budget(runs_dir, monkeypatch):
    """A budget in the form: the estimate gives the steps that fit it, a bad one is the preset's own line, and
    the run starts with train.time_budget set (what `train --time-budget` sets)."""
    from textual.widgets import Input

    from workbench.config import resolve_preset
    from workbench.machine.detect import Machine
    from workbench.plan.report import fit_check
    from workbench.tui import launcher
    started = []
    monkeypatch.setattr(launcher, "start_run", lambda root, req, timeout=120: started.append(req) or "")

    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            app.action_new_run("gpu-8gb")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen"
                           and bool(app.screen.query("#nr-estimate")), what="the form")
            est = app.screen.query_one("#nr-estimate")
            await wait_for(pilot, lambda: "fits:" in text_of(est), what="the estimate")
            app.screen.query_one("#nr-budget", Input).value = "soon"
            await pilot.press("ctrl+s")
            err = app.screen.query_one("#nr-error")
            await wait_for(pilot, lambda: "time_budget" in text_of(err), what="the error")
            assert text_of(err).endswith("train.time_budget = 'soon' is not a duration; write it like 45m, 2h, "
                                         "1h30m or 90s"), text_of(err)
            app.screen.query_one("#nr-budget", Input).value = "45m"
            want = fit_check(resolve_preset("gpu-8gb", ["train.time_budget=45m"]),
                             Machine.from_info(app.machine_info)).time
            assert want.startswith("time budget 45m 00s: ~")
            await wait_for(pilot, lambda: want in text_of(est), what=lambda: f"the budget's estimate {text_of(est)!r}")
            # a budget too short to buy a complete run says so, with the budget that would, and the form asks
            # before starting it (`train` refuses it unless --yes; issue 53)
            app.screen.query_one("#nr-budget", Input).value = "3s"
            short = fit_check(resolve_preset("gpu-8gb", ["train.time_budget=3s"]),
                              Machine.from_info(app.machine_info))
            assert short.budget_problem.startswith("a 3s budget ") and "give at least" in short.time, short.time
            await wait_for(pilot, lambda: short.time in text_of(est), what=lambda: f"the problem {text_of(est)!r}")
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen", what="the question")
            assert "cannot buy a complete run in its time budget" in text_of(app.screen.query_one("#confirm-question"))
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen")
            assert started == []
            app.screen.query_one("#nr-budget", Input).value = "45m"
            await wait_for(pilot, lambda: want in text_of(est), what="the 45m estimate again")
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: len(started) == 1, what="the start")
            assert list(started[0].new_run().preset_sets()) == ["train.time_budget=45m"]
    run(go())


def test_the_form_knows_a_rate_this_machine_measured_after_the_ui_opened(tmp_path, monkeypatch):
    """Issue 43: "time: unknown" in the form while `workbench estimate` gave a time. The form estimated from the
    Hardware pane's reading, taken when the UI opened; a run (here `workbench estimate`, the same calibration)
    measured this machine's matmul rate after that, into the cache, and the form never saw it: for a model no run
    has measured, the time was 'unknown until this machine's speed is measured'."""
    cache = tmp_path / "cache"  # a machine that has never measured itself
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(cache))
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    (tmp_path / "runs").mkdir()

    async def go():
        # the real machine, read once (the pane reads again only every hour here, as it does while hidden)
        app = make_app(tmp_path / "runs", hardware_info=None, hardware_interval=3600)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.machine_info is not None, what="the hardware read")
            assert not app.machine_info.get("calibration")
            cp = wb("estimate", "cpu-small", "--set", "hardware.device=cpu", env={"WORKBENCH_CACHE_DIR": str(cache)})
            assert cp.returncode == 0 and "matmul rate:" in cp.stdout, cp.stderr
            app.action_new_run("cpu-small")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen", what="the form")
            await wait_for(pilot, lambda: "fits:" in text_of(app.screen.query_one("#nr-estimate")), what="the estimate")
            text = text_of(app.screen.query_one("#nr-estimate"))
            assert "unknown" not in text, text
            assert "tokens/s (estimate from this machine's measured matmul rate)" in text, text
    run(go())
