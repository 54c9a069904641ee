"""The Queue tab on a shared study database (a real PostgreSQL server, started here by tests/support/postgres.py):
its sweep listed beside the runs directory's own, each trial with its machine and device, read through a read-only
connection; the URL from $WORKBENCH_STORAGE without its password (PGPASSWORD gives it, as libpq reads it), shown as
it is; the database lost, or the password wrong: one line in the tab, the password never shown, and the tab shows
the study again once the database is back."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from tests.support.canned_runs import HARDWARE
from tests.support.postgres import PASSWORD
from tests.support.tui import make_app, run, text_of, wait_for
from workbench.machine.detect import Machine
from workbench.queue import distributed
from workbench.queue.sweep_spec import SweepSpec

SPEC = {"name": "sh", "preset": "cpu-small", "method": "grid", "trials": 3, "metric": "val_loss",
        "goal": "minimize", "params": [{"key": "train.lr", "values": [0.001, 0.003, 0.01]}],
        "sets": ["model.dim=64", "model.n_layers=2"]}


def _trial(study, spec, host: str, device: str):
    """The next trial taken as a worker takes it (RUNNING, a heartbeat), with what a worker records of it."""
    trial = distributed.take(study, spec, spec.trials)
    for p in spec.params:
        distributed._suggest(trial, p)
    run = f"sh-t{trial.number + 1:04d}"
    for k, v in {"run": run, "host": host, "device": device, "runs_dir": "/elsewhere/runs", "resumed_from": ""}.items():
        trial.set_user_attr(k, v)
    return trial


def cells(app, table: str) -> dict[str, list[str]]:
    t = app.query_one(table, DataTable)
    return {str(t.get_row_at(i)[1]): [str(c) for c in t.get_row_at(i)] for i in range(t.row_count)}


def test_the_queue_tab_shows_a_shared_study_with_each_trials_machine_and_device(postgres, runs_dir, tmp_path,
                                                                                 monkeypatch):
    import optuna
    url = postgres["url"]
    spec = SweepSpec.from_dict(SPEC)
    storage = distributed.open_storage(url)
    distributed.create(url, spec, tmp_path / "maker", Machine.from_info(HARDWARE), HARDWARE, storage)
    study = optuna.load_study(study_name="sh", storage=storage)
    done = _trial(study, spec, "box-a", "cpu slot 1/2 (1 thread)")
    study.tell(done, 3.25)
    running = _trial(study, spec, "box-b", "gpu 1")          # trial 3 waits

    bare = url.replace(f":{PASSWORD}@", "@")                  # the password from PGPASSWORD, as libpq reads it
    monkeypatch.setenv("WORKBENCH_STORAGE", bare)
    monkeypatch.setenv("PGPASSWORD", PASSWORD)

    async def go():
        app = make_app(runs_dir, initial_tab="queue")
        async with app.run_test(size=(160, 44)) as pilot:
            pane = app.query_one("#queue-pane")
            line = app.query_one("#queue-shared")
            sweeps = app.query_one("#sweeps-table", DataTable)
            await wait_for(pilot, lambda: "shared:sh" in sweeps.rows, what=lambda: text_of(line))
            assert f"shared study {bare}: 1 sweep(s), 3 trial(s)" in text_of(line)
            row = [str(c) for c in sweeps.get_row_at(sweeps.get_row_index("shared:sh"))]
            assert row[:5] == ["sh (shared)", "grid", "1/3", "sh-t0001", "val_loss 3.2500"], row
            sweeps.move_cursor(row=sweeps.get_row_index("shared:sh"))
            results = app.query_one("#sweep-results", DataTable)
            await wait_for(pilot, lambda: results.row_count == 3, what="the shared sweep's trials")
            got = cells(app, "#sweep-results")
            # rank, trial, train.lr, val_loss, state, seconds, where, others, note
            assert got["sh-t0001"][:5] == ["1", "sh-t0001", "0.001", "3.2500", "finished"]
            assert got["sh-t0001"][6] == "box-a: cpu slot 1/2 (1 thread)"
            assert got["sh-t0002"][2:5] == ["0.003", "", "running"] and got["sh-t0002"][6] == "box-b: gpu 1"
            assert got["sh-t0003"][2:5] == ["0.01", "", "queued"] and got["sh-t0003"][6] == ""
            assert "(shared: " in str(results.border_title) and PASSWORD not in str(results.border_title)
            # read-only: the tab's connection cannot write to the study
            import sqlalchemy
            with pytest.raises(sqlalchemy.exc.DBAPIError, match="read-only transaction"):
                with pane.study.reader.storage.engine.connect() as c:
                    c.execute(sqlalchemy.text("UPDATE studies SET study_name = 'x'"))

            # the database is lost: one line, the last read kept; then the wrong password comes back with it
            postgres["stop"]()
            await wait_for(pilot, lambda: "cannot reach the database at" in text_of(line), timeout=30,
                           what=lambda: text_of(line))
            assert f"shared study: cannot reach the database at {bare} (" in text_of(line)
            assert "is the server running" in text_of(line) and "shared:sh" in sweeps.rows
            monkeypatch.setenv("PGPASSWORD", "wrong-Secret-42")
            postgres["start"]()
            await wait_for(pilot, lambda: "the user or the password is wrong" in text_of(line), timeout=30,
                           what=lambda: text_of(line))
            assert "wrong-Secret-42" not in text_of(line) and PASSWORD not in text_of(line)
            assert "\n" not in text_of(line).strip()

            # the right password again, and a trial ended meanwhile by its worker: the tab shows it
            monkeypatch.setenv("PGPASSWORD", PASSWORD)
            s2 = distributed.open_storage(url)
            optuna.load_study(study_name="sh", storage=s2).tell(running.number, 3.0)
            await wait_for(pilot, lambda: cells(app, "#sweep-results").get("sh-t0002", [""])[0] == "1", timeout=30,
                           what=lambda: f"{text_of(line)} {cells(app, '#sweep-results')}")
            assert "1 sweep(s), 3 trial(s)" in text_of(line)
            assert cells(app, "#sweep-results")["sh-t0002"][3:5] == ["3.0000", "finished"]
            await pilot.press("b")   # a shared sweep's best is on its machine: said, nothing run
            await pilot.pause()
            assert any("shared sweep's runs are on the machines" in n.message for n in app._notifications)
    run(go())
