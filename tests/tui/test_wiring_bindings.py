"""TUI keys that write something, pressed, and what they wrote read back (issue 54, round 4): the keys no test
pressed before (bench/wiring_audit.py lists them): the new-run form's ctrl+l (a queue entry with the form's
settings), the Queue tab's shift+down (a queued run's place) and r (a runner that trains the queue's runs)."""

from __future__ import annotations

import json

from textual.widgets import DataTable, Input

from tests.support.cli import TINY, wb
from tests.support.runs import read_jsonl
from tests.support.tui import make_app, run, wait_for
from workbench.queue.store import NewItem, QueueStore


def queued(root) -> list[str]:
    store = QueueStore(root)
    try:
        return [i.name for i in store.items(("queued",))]
    finally:
        store.close()


def test_the_new_run_forms_ctrl_l_queues_the_run_with_the_forms_settings(runs_dir):
    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            app.action_new_run("cpu-small")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen"
                           and app.screen.query_one("#nr-estimate").render(), what="the form")
            app.screen.query_one("#nr-name", Input).value = "formq"
            app.screen.query_one("#nr-overrides", Input).value = "model.dim=64 model.n_layers=2 train.max_iters=40"
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: "formq" in queued(runs_dir), timeout=60,
                           what=lambda: f"formq queued (screen {app.screen.__class__.__name__}, "
                                        f"{[n.message for n in app._notifications]})")
            store = QueueStore(runs_dir)
            item = store.find("formq")
            store.close()
            assert item.preset == "cpu-small"
            assert {"model.dim=64", "model.n_layers=2", "train.max_iters=40"} <= set(item.sets), item.sets
            assert not (runs_dir / "formq").exists()   # queued, not started
    run(go())


def test_the_queue_tabs_shift_down_moves_the_queued_run_later(runs_dir):
    store = QueueStore(runs_dir)
    for name in ("q1", "q2", "q3"):
        store.add(NewItem("cpu-small", ("model.dim=64",), name=name))
    store.close()

    async def go():
        app = make_app(runs_dir, initial_tab="queue")
        async with app.run_test(size=(140, 40)) as pilot:
            t = app.query_one("#queue-table", DataTable)
            await wait_for(pilot, lambda: t.row_count == 3, what="the queue")
            t.move_cursor(row=t.get_row_index("q1"))
            await pilot.press("shift+down")   # `workbench queue move q1 2`
            await wait_for(pilot, lambda: queued(runs_dir) == ["q2", "q1", "q3"], timeout=30,
                           what=lambda: f"q1 moved down: {queued(runs_dir)}")
    run(go())


def test_the_queue_tabs_r_starts_a_runner_that_trains_the_queued_run(runs_dir):
    sets = tuple(TINY) + ("train.max_iters=2", "train.warmup_iters=0", "train.eval_interval=2",
                          "train.ckpt_interval=2", "train.eval_iters=1")
    store = QueueStore(runs_dir)
    store.add(NewItem("cpu-small", sets, name="next"))
    store.close()

    def state() -> str:
        s = QueueStore(runs_dir)
        try:
            return s.find("next").state
        finally:
            s.close()

    def runner_gone() -> bool:
        return json.loads(wb("queue", "ls", "--json", "--runs-dir", str(runs_dir)).stdout)["runner_pid"] is None

    async def go():
        app = make_app(runs_dir, initial_tab="queue")
        async with app.run_test(size=(140, 40)) as pilot:
            t = app.query_one("#queue-table", DataTable)
            await wait_for(pilot, lambda: t.row_count == 1, what="the queue")
            await pilot.press("r")            # `workbench queue run --detach`
            await wait_for(pilot, lambda: state() in ("finished", "failed"), timeout=180,
                           what=lambda: f"the queued run trained (state {state()})")
            assert state() == "finished", (runs_dir / "queue.log").read_text() if (runs_dir / "queue.log").exists() \
                else ""
            await wait_for(pilot, runner_gone, timeout=60, what="the runner gone with the queue empty")
    run(go())
    # the run it started: the queue's settings, trained to its end
    recs = read_jsonl(runs_dir / "next" / "metrics.jsonl")
    assert [r["step"] for r in recs if r["kind"] == "train"] == [1, 2]
    assert (runs_dir / "next" / "checkpoints" / "step_0000002" / "model.pt").is_file()
