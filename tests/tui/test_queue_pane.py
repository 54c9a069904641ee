"""The Queue pane on a real queue database: runs in their states (finished, failed with its reason, queued in
order, interrupted), a sweep with its best trial; its keys run the real `workbench queue` commands (pause, move,
remove, add the preset chosen in Presets) and the pane shows the result."""

from __future__ import annotations

import time

from textual.widgets import DataTable

from tests.support.tui import make_app, notified, open_preset, run, text_of, wait_for
from workbench.config.duration import TimeBudget
from workbench.queue.store import NewItem, QueueStore

TINY = ("model.dim=64", "model.n_layers=2")


def make_queue(root):
    store = QueueStore(root)
    now = time.time()
    done = store.add(NewItem("cpu-small", TINY, name="early"))
    store.update(done.id, state="finished", metric=3.9876, started=now - 60, ended=now - 30)
    bad = store.add(NewItem("cpu-small", TINY, name="broken"))
    store.update(bad.id, state="failed", started=now - 30, ended=now - 20,
                 note="out of memory at step 3; doctor: the run ran out of memory (--set train.batch_size=2)")
    gone = store.add(NewItem("cpu-small", TINY, name="delta"))   # running, but no runner and no trainer
    store.update(gone.id, state="running", started=now - 10)
    store.add(NewItem("cpu-small", TINY, time_budget=TimeBudget.parse("60s"), name="q1"))
    store.add(NewItem("cpu-small", TINY, name="q2"))
    store.add_sweep("sw", {"name": "sw", "preset": "cpu-small", "method": "grid",
                           "params": [{"key": "train.lr", "values": [0.001, 0.01]}], "trials": 2,
                           "metric": "val_loss", "goal": "minimize"},
                    [({"train.lr": 0.001}, NewItem("cpu-small", TINY + ("train.lr=0.001",)), None, None),
                     ({"train.lr": 0.01}, None, None, "does not fit this machine's memory by the estimate")])
    t1 = store.find("sw-t0001")
    store.update(t1.id, state="finished", metric=3.5, started=now - 5, ended=now - 1)
    store.close()


def cells(app, table: str) -> list[list[str]]:
    t = app.query_one(table, DataTable)
    return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]


def test_queue_pane_shows_the_queue_and_its_keys_change_it(runs_dir):
    make_queue(runs_dir)

    async def go():
        app = make_app(runs_dir, initial_tab="queue")
        async with app.run_test(size=(140, 40)) as pilot:
            await wait_for(pilot, lambda: app.query_one("#queue-table", DataTable).row_count == 6, what="the queue")
            rows = {r[1]: r for r in cells(app, "#queue-table")}
            assert rows["early"][2] == "finished" and rows["early"][4] == "3.9876"
            assert rows["broken"][2] == "failed"
            assert rows["delta"][2] == "interrupted"
            assert (rows["q1"][0], rows["q1"][2], rows["q2"][0]) == ("1", "queued", "2")
            assert "budget 60s" in rows["q1"][5]
            assert "2 queued" in text_of(app.query_one("#queue-status")) and "no runner" in \
                text_of(app.query_one("#queue-status"))
            sweeps = cells(app, "#sweeps-table")
            assert sweeps == [["sw", "grid", "2/2", "sw-t0001", "val_loss 3.5000", "train.lr=0.001"]]

            t = app.query_one("#queue-table", DataTable)
            t.move_cursor(row=t.get_row_index("broken"))
            detail = app.query_one("#queue-detail")
            await wait_for(pilot, lambda: "doctor: the run ran out of memory" in text_of(detail),
                           what="the failed run's reason")

            await pilot.press("p")   # `workbench queue pause`
            await wait_for(pilot, lambda: "paused" in text_of(app.query_one("#queue-status")), timeout=30,
                           what="the queue paused")
            store = QueueStore(runs_dir)
            assert store.paused()

            t.move_cursor(row=t.get_row_index("q2"))
            await pilot.press("shift+up")   # `workbench queue move q2 1`
            await wait_for(pilot, lambda: {r[1]: r[0] for r in cells(app, "#queue-table")}.get("q2") == "1",
                           timeout=30, what="q2 moved up")
            assert [i.name for i in store.items(("queued",))] == ["q2", "q1"]

            t.move_cursor(row=t.get_row_index("q1"))
            await pilot.press("d")
            await pilot.pause()
            await pilot.press("y")          # `workbench queue rm q1`
            await wait_for(pilot, lambda: "q1" not in {r[1] for r in cells(app, "#queue-table")}, timeout=30,
                           what="q1 removed")
            assert store.find("q1") is None

            app.query_one("#presets-pane").load("cpu-small")
            await pilot.press("a")          # `workbench queue add cpu-small`
            await wait_for(pilot, lambda: any(r[1].startswith("cpu-small-") for r in cells(app, "#queue-table")),
                           timeout=60, what="a cpu-small run queued")
            assert [i.preset for i in store.items(("queued",))] == ["cpu-small", "cpu-small"]
            store.close()

    run(go())


def test_queue_pane_without_a_queue_says_how_to_start_one(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="queue")
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: "a: queue the preset chosen in Presets" in
                           text_of(app.query_one("#queue-status")), what="the empty queue's line")
            assert not (runs_dir / "queue.db").exists()   # reading never creates the database
            await pilot.press("7")
    run(go())


def _queued(root) -> list[str]:
    store = QueueStore.open_existing(root)
    try:
        return [i.name for i in store.items(("queued",))] if store else []
    finally:
        if store:
            store.close()


def test_presets_ctrl_l_queues_the_chosen_preset_as_saved(runs_dir):
    """ctrl+l in Presets is the Queue tab's `a` (one path: `workbench queue add PRESET`), the toast naming the run
    queued; a draft with an error or unsaved changes is refused in one line, by both keys, and nothing is queued."""
    from textual.widgets import TextArea

    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(140, 44)) as pilot:
            await open_preset(pilot, app, "cpu-small")
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: _queued(runs_dir), timeout=60, what="a run queued")
            [name] = _queued(runs_dir)
            assert name.startswith("cpu-small-")
            await wait_for(pilot, lambda: notified(app, f"Queued {name}: the queue's runner starts it in its turn (7: "
                                                        "the Queue tab; r there starts a runner if none is at work)."),
                           what="the toast naming the run")
            assert QueueStore(runs_dir).find(name).preset == "cpu-small" and not (runs_dir / name).exists()

            editor = app.query_one("#preset-editor", TextArea)
            editor.text = editor.text.replace("max_iters = 2000", "max_iters = 1000")   # valid, not saved
            await wait_for(pilot, lambda: text_of(app.query_one("#preset-status")).strip() == "✓ valid")
            unsaved = ("cpu-small has unsaved changes: save them with ctrl+s to queue them, or revert them with "
                       "ctrl+r.")
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: notified(app, unsaved), what="the unsaved note")
            app._notifications.clear()
            await pilot.press("7", "a")        # the Queue tab's `a` queues the same preset: refused the same way
            await wait_for(pilot, lambda: notified(app, unsaved), what="the unsaved note from the Queue tab")
            await pilot.press("2")
            editor.text = editor.text.replace("dim = 256", "dim = 100")   # not divisible by n_heads
            await wait_for(pilot, lambda: text_of(app.query_one("#preset-status")).startswith("✗"), what="invalid")
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: notified(app, "cpu-small has an error (see below the editor): fix it, or "
                                                        "revert it with ctrl+r, to queue it."), what="the refusal")
            await pilot.pause(1.0)
            assert _queued(runs_dir) == [name]    # nothing more queued
    run(go())


def make_big_sweep(root, n: int = 12) -> list[str]:
    """Sweep `big` of ``n`` finished trials, each with a run directory of three evals as the trainer writes them;
    its trials' names, best first."""
    from tests.support.rundirs import RunDir
    from workbench.config import preset_to_toml, resolve_preset

    toml = preset_to_toml(resolve_preset("cpu-small", list(TINY)))
    lrs = [round(1e-4 * 1.5 ** k, 8) for k in range(n)]
    store = QueueStore(root)
    store.add_sweep("big", {"name": "big", "preset": "cpu-small", "method": "grid", "trials": n,
                            "params": [{"key": "train.lr", "values": lrs}], "metric": "val_loss", "goal": "minimize"},
                    [({"train.lr": lr}, NewItem("cpu-small", TINY + (f"train.lr={lr}",)), None, None) for lr in lrs])
    finals = {}
    for k, lr in enumerate(lrs, 1):
        name, final = f"big-t{k:04d}", 4.0 + ((k * 7) % n) / 10    # a scrambled order: best is not trial 1
        with RunDir(root, name, toml) as r:
            for step, v in ((0, 6.5), (10, 5.0 + final / 4), (20, final)):
                r.eval(step, v + 0.1, v)
            r.status(state="finished", step=20, max_iters=20)
        store.update(store.find(name).id, state="finished", metric=final, started=time.time() - 30,
                     ended=time.time() - 20)
        finals[name] = final
    store.close()
    return sorted(finals, key=finals.get)


def test_t_chooses_how_many_of_the_best_trials_c_draws(runs_dir):
    """c draws the sweep's top 5 trials in Loss curves; t makes it 10, then all, then 5 again (said in the results'
    title and a toast), and c then draws exactly that many, the best ones."""
    best = make_big_sweep(runs_dir)

    async def go():
        app = make_app(runs_dir, initial_tab="queue")
        async with app.run_test(size=(160, 48)) as pilot:
            res = app.query_one("#sweep-results", DataTable)
            await wait_for(pilot, lambda: res.row_count == 12, what="the sweep's results")
            curves = app.query_one("#curves-pane")
            for n, title, after in ((5, "top 5", "top 10"), (10, "top 10", "all"), (12, "all", "top 5")):
                assert f"c: {title} in Loss curves (t: {after})" in str(res.border_title), res.border_title
                await pilot.press("c")
                await wait_for(pilot, lambda: sorted(curves.selected_ids()) == sorted(best[:n]),
                               what=lambda: f"the best {n}: {curves.selected_ids()}")
                assert curves.overlay[0] == f"sweep big: top {n} of 12 trials by val_loss"
                plot = app.query_one("#curves-plot")
                await wait_for(pilot, lambda: len(plot.series) == n and all(len(s.ys) == 3 for s in plot.series),
                               timeout=30, what=lambda: f"{n} curves drawn: {[s.label for s in plot.series]}")
                await pilot.press("7", "t")
                await wait_for(pilot, lambda: f"c: {after} in Loss curves" in str(res.border_title),
                               what=lambda: str(res.border_title))
            assert notified(app, "c now draws the top 10 trials of the sweep in Loss curves (t: all).")
            assert notified(app, "c now draws all the trials of the sweep in Loss curves (t: top 5).")
    run(go())
