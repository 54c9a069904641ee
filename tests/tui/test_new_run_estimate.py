"""The new-run form shows, before anything starts, whether the run fits this machine and how long it
will take, and asks before starting one that does not fit."""

from __future__ import annotations

from textual.widgets import Select

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
            assert "fits: ~4.02 GiB of 7.00 GiB NVIDIA GeForce RTX 4060 free VRAM" in text, text
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
