"""The Runs pane's ``+``: continue an ended run for N more steps. The dialog explains what the extension does
to the learning rate as the user types, refuses what is not a step count, and asks the launcher for
``resume --more N`` (recorded here; ``resume --more`` itself is tested against real runs in test_branch)."""

from __future__ import annotations

from textual.widgets import DataTable, Input

from tests.support.tui import make_app, run, text_of, wait_for
from workbench.tui import launcher


def test_plus_asks_how_many_steps_explains_the_schedule_and_resumes_with_more(runs_dir, monkeypatch):
    calls = []
    monkeypatch.setattr(launcher, "resume_run", lambda root, rid, ck="latest", timeout=120, more=None:
                        calls.append((rid, ck, more)) or rid)

    async def go():
        app = make_app(runs_dir, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 3)
            table.move_cursor(row=table.get_row_index("alpha"))
            await pilot.pause()
            await pilot.press("plus")
            await wait_for(pilot, lambda: app.screen.query("#more-n"), what="the more-steps dialog")
            box = app.screen.query_one("#more-n", Input)
            assert box.value == "200"  # half of alpha's 400 steps
            note = text_of(app.screen.query_one("#dialog-note"))
            assert "to step 600" in note and "max_iters" in note, note
            box.value = "0"
            await pilot.press("enter")
            await pilot.pause()
            assert app.screen.query("#more-n"), "a step count of 0 closed the dialog"
            assert "at least 1" in text_of(app.screen.query_one("#dialog-note"))
            box.value = "250"
            await wait_for(pilot, lambda: "to step 650" in text_of(app.screen.query_one("#dialog-note")))
            await pilot.press("enter")
            await wait_for(pilot, lambda: calls == [("alpha", "latest", 250)], what=f"the resume ({calls})")
            # a run that has not ended is refused without a dialog
            await pilot.press("6")
            table.move_cursor(row=table.get_row_index("gamma"))
            await pilot.press("plus")
            await pilot.pause()
            assert not app.screen.query("#more-n")
    run(go())
