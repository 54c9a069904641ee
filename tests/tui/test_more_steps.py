"""The Runs pane's ``+``: continue an ended run for N more steps. The dialog explains what the extension does
to the learning rate as the user types, refuses what is not a step count, and asks the launcher for
``resume --more N`` (recorded here; ``resume --more`` itself is tested against real runs in test_branch)."""

from __future__ import annotations

import math

from textual.widgets import DataTable, Input

from tests.support.tui import make_app, run, text_of, wait_for
from workbench.tui import launcher


def cosine_lr(step: int, lr: float, min_lr: float, warmup: int, max_iters: int) -> float:
    """The README's schedule, written out: linear warmup, then cosine decay from lr to min_lr at max_iters."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= max_iters:
        return min_lr
    frac = (step - warmup) / (max_iters - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * frac)) * (lr - min_lr)


def note(more: int, lr: float = 6e-4, min_lr: float = 6e-5, warmup: int = 2) -> str:
    """What the dialog says for alpha (400 steps done; the canned preset's lr, min_lr, warmup): N more steps
    stretch the decay to 400 + N, so the learning rate goes back up from the floor."""
    new_max = 400 + more
    before, after = cosine_lr(399, lr, min_lr, warmup, 400), cosine_lr(400, lr, min_lr, warmup, new_max)
    end = cosine_lr(new_max - 1, lr, min_lr, warmup, new_max)
    return (f"to step {new_max:,}; cosine schedule: its decay is stretched to end at step {new_max:,}, so the "
            f"learning rate goes from {before:.2e} at step 400 up to {after:.2e}, then decays to {end:.2e}; "
            "recorded in the run's events as a change of train.max_iters.")


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
            shown = lambda: " ".join(text_of(app.screen.query_one("#dialog-note")).split())  # noqa: E731
            assert shown() == note(200)     # the schedule's own numbers (README), written out above
            assert note(200).split("; ", 1)[1].startswith("cosine schedule: its decay is stretched to end at step "
                                                          "600, so the learning rate goes from 6.00e-05 at step 400 "
                                                          "up to 1.96e-04")
            box.value = "0"
            await pilot.press("enter")
            await pilot.pause()
            assert app.screen.query("#more-n"), "a step count of 0 closed the dialog"
            assert "at least 1" in text_of(app.screen.query_one("#dialog-note"))
            box.value = "250"
            await wait_for(pilot, lambda: shown() == note(250), what=lambda: f"{shown()!r} != {note(250)!r}")
            await pilot.press("enter")
            await wait_for(pilot, lambda: calls == [("alpha", "latest", 250)], what=f"the resume ({calls})")
            # a run that has not ended is refused without a dialog
            await pilot.press("6")
            table.move_cursor(row=table.get_row_index("gamma"))
            await pilot.press("plus")
            await pilot.pause()
            assert not app.screen.query("#more-n")
    run(go())
