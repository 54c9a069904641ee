"""The panes' requests reach the app and the launcher: start, resume (of a chosen checkpoint), sample
and "train with it", each from the key a user presses. The launcher's CLI calls are replaced by
recorders (no trainer starts); the runs are the canned ones."""

from __future__ import annotations

import shutil

from textual.widgets import DataTable, Input, Select

from tests.support.tui import make_app, open_preset, run, text_of, wait_for
from workbench.cli_client import CliError
from workbench.tui import launcher
from workbench.tui.messages import ResumeRun


def _notes(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


def test_runs_pane_resumes_the_checkpoint_chosen_or_the_latest(runs_dir, monkeypatch):
    calls = []
    def resume(root, rid, ck="latest", timeout=120, more=None):
        """As the real command answers (tests/tui/test_launcher.py runs it): the run that goes on, a new
        branch `RUN-from-STEP` (a run directory beside its parent's) when the checkpoint is not the latest."""
        calls.append((rid, ck))
        if ck == "latest":
            return rid
        shutil.copytree(root / rid, root / f"{rid}-from-{ck}")
        return f"{rid}-from-{ck}"

    monkeypatch.setattr(launcher, "resume_run", resume)

    async def go():
        app = make_app(runs_dir, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 3)
            table.move_cursor(row=table.get_row_index("alpha"))
            await pilot.pause()
            await pilot.press("tab")  # to the checkpoint table: step_0000400, step_0000200
            assert app.focused is app.query_one("#ckpt-table")
            await pilot.press("down", "c")
            # step 200 is not alpha's latest checkpoint: it goes on in a new run, after the user says so
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen", what="the question")
            question = text_of(app.screen.query_one("#confirm-question"))
            assert "not the latest of alpha (step 400)" in question and "alpha-from-200" in question, question
            await pilot.press("y")
            await wait_for(pilot, lambda: calls == [("alpha", "200")], what=f"the resume ({calls})")
            # the branch (not its parent) is followed in the Train pane
            await wait_for(pilot, lambda: app.monitored == "alpha-from-200"
                           and app.query_one("#tabs").active == "train",
                           what=lambda: f"the branch followed ({app.monitored}, {app.query_one('#tabs').active})")
            assert any("Resuming alpha from checkpoint 200" in n for n in _notes(app))
            await pilot.press("6")
            table.move_cursor(row=table.get_row_index("beta"))
            await pilot.press("r")
            await wait_for(pilot, lambda: calls[-1:] == [("beta", "latest")], what=f"the resume ({calls})")
    run(go())


def test_a_running_run_is_not_resumed_again(live_runs_dir, monkeypatch):
    calls = []
    monkeypatch.setattr(launcher, "resume_run", lambda *a, **k: calls.append(a))

    async def go():
        app = make_app(live_runs_dir)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.summary("delta") is not None)
            app.post_message(ResumeRun("delta"))
            await wait_for(pilot, lambda: any("delta is already running" in n for n in _notes(app)))
            assert calls == []
    run(go())


def test_new_run_form_starts_the_run_it_describes(runs_dir, monkeypatch, tmp_path):
    requests = []

    def fake_start(root, req, timeout=120):
        requests.append(req)
        return "beta"  # as if the trainer had made this run

    monkeypatch.setattr(launcher, "start_run", fake_start)
    corpus = 'C:\\corpora\\it\'s "mine".txt'
    monkeypatch.chdir(tmp_path)  # the form lists the corpus (a file of this name, backslashes and quotes kept)
    (tmp_path / corpus).write_text("some text\n" * 100)

    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.summaries)
            await pilot.press("n")
            await pilot.pause()
            screen = app.screen
            screen.query_one("#nr-preset", Select).value = "cpu-small"
            screen.query_one("#nr-corpus", Input).value = corpus
            screen.query_one("#nr-overrides", Input).value = "train.max_iters=500"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: requests, what="the start")
            req = requests[0]
            assert (req.preset, req.corpus, req.overrides) == ("cpu-small", corpus, ["train.max_iters=500"])
            await wait_for(pilot, lambda: app.monitored == "beta" and app.query_one("#tabs").active == "train")
    run(go())


def test_a_failed_start_says_why(runs_dir, monkeypatch):
    def failing(root, req, timeout=120):
        raise CliError("no space left on device")

    monkeypatch.setattr(launcher, "start_run", failing)

    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("n")
            await pilot.pause()
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: any("train failed: no space left on device" in n for n in _notes(app)))
    run(go())


def test_runs_pane_samples_from_the_checkpoint_under_the_cursor(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 3)
            table.move_cursor(row=table.get_row_index("alpha"))
            await pilot.pause()
            await pilot.press("tab", "down", "s")
            await wait_for(pilot, lambda: app.query_one("#tabs").active == "sample")
            assert app.query_one("#smp-run", Select).value == "alpha"
            assert app.query_one("#smp-ckpt-a", Select).value == "200"
    run(go())


def test_presets_train_with_it_opens_the_form_on_that_preset(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(140, 44)) as pilot:
            await open_preset(pilot, app, "cpu-small")
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen")
            assert app.screen.query_one("#nr-preset", Select).value == "cpu-small"
            await pilot.press("escape")
    run(go())
