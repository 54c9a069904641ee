"""The Runs pane's ``+``: continue an ended run for N more steps. The dialog explains what the extension does
to the learning rate as the user types, refuses what is not a step count, and asks the launcher for
``resume --more N`` (recorded here; ``resume --more`` itself is tested against real runs in test_branch)."""

from __future__ import annotations

import json
import math

from textual.widgets import DataTable, Input

from tests.support.rundirs import RunDir
from tests.support.tui import make_app, run, text_of, wait_for
from workbench.tui import launcher

# the walk's run (issue 53, bug 2): cpu-small's schedule (wsd, lr 3e-3, warmup 30) at a 20 s budget that trained 3
# steps, its decay begun at step 2 by the clock
SHORT = """name = "cpu-small"
[model]
vocab_size = 512
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
seq_len = 64

[train]
batch_size = 4
max_iters = 2000
schedule = "wsd"
decay_fraction = 0.4
lr = 3e-3
min_lr = 1e-4
warmup_iters = 30
eval_interval = 200
time_budget = "20s"
"""


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
            assert box.value == "400"  # as many again as alpha's 400 steps (more_steps.default_more)
            shown = lambda: " ".join(text_of(app.screen.query_one("#dialog-note")).split())  # noqa: E731
            assert shown() == note(400)     # the schedule's own numbers (README), written out above
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


def test_a_short_budgeted_run_is_offered_enough_steps_to_leave_its_warmup(tmp_path, monkeypatch):
    """The walk: "+" on a 3-step budgeted run offered 1 more step (half of 3) and described a schedule the branch
    would not follow; resume then refuses a run that ends inside its 30-step warmup. The offer is as many steps
    again as the run trained, at least enough to end at twice its warmup (57 here: to step 60), the note says the
    warmup goes on, and a count that would end inside the warmup is refused in the dialog with one line."""
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    calls = []
    monkeypatch.setattr(launcher, "resume_run", lambda root, rid, ck="latest", timeout=120, more=None:
                        calls.append((rid, ck, more)) or rid)
    root = tmp_path / "runs"
    with RunDir(root, "short", SHORT) as r:
        r.event("start", 0, device="cpu", precision="fp32", params=131392, compile=False)
        for step in (1, 2, 3):
            r.train(step, 9.0 - 0.01 * step, lr=3e-3 * (step + 1) / 31, tokens_seen=step * 256)
        r.eval(3, 9.0, 9.01)
        for step in (2, 3):
            c = r.checkpoint(step, train_loss=9.0, val_loss=9.01, tokens_seen=step * 256, wall_time=1.7e9 + step,
                             elapsed_s=float(step))
            (c / "trainer_state.json").write_text(json.dumps({"step": step, "decay_step": 2,
                                                              "budget_progress": 1.0 if step == 3 else 0.7}))
        r.event("finish", 3, message="finished")
        r.status(state="finished", pid=999999, step=3, max_iters=3, started=1.7e9, compiling=False)

    async def go():
        app = make_app(root, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 1)
            await pilot.pause()
            await pilot.press("plus")
            await wait_for(pilot, lambda: app.screen.query("#more-n"), what="the more-steps dialog")
            box = app.screen.query_one("#more-n", Input)
            shown = lambda: " ".join(text_of(app.screen.query_one("#dialog-note")).split())  # noqa: E731
            assert box.value == "57", box.value
            assert shown().startswith("to step 60; wsd: it goes on from step 2, where the decay began (a new run, "
                                      "the decayed one kept), so the warmup goes on to step 30, where the learning "
                                      "rate reaches its peak 3.00e-03"), shown()
            box.value = "1"
            await wait_for(pilot, lambda: "inside its warmup" in shown(), what=shown)
            assert shown() == ("the run would end inside its warmup (train.warmup_iters = 30, to step 30): give "
                               "more than 27 more steps")
            await pilot.press("enter")
            await pilot.pause()
            assert app.screen.query("#more-n") and not calls, "a count that ends inside the warmup was accepted"
            box.value = "57"
            await wait_for(pilot, lambda: shown().startswith("to step 60"), what=shown)
            await pilot.press("enter")
            await wait_for(pilot, lambda: calls == [("short", "latest", 57)], what=f"the resume ({calls})")
    run(go())
