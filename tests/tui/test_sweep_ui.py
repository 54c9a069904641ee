"""A sweep in the TUI, on a real sweep of three tiny budgeted trials (and a run that fails) run by the real
queue runner: the Queue tab's results table sorted by the sweep's metric with the searched key as a column;
`c` draws the trials' val-loss curves together in Loss curves, each labelled with its trial and setting; `b`
keeps the best trial as a user preset (`workbench sweep save-best`), which has the best trial's values and trains,
and a second `b` is refused without touching it. In tmux: the Queue pane with runs in three states (one queued
from the new-run form's "Add to queue"), the results table and the overlaid curves, captured."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from textual.widgets import DataTable

from tests.support.cli import TINY, wb
from tests.support.runs import evals, wait_until
from tests.support.tmux import Tmux
from tests.support.tui import make_app, run, text_of, wait_for
from workbench.rundir import read_status

pytestmark = pytest.mark.slow

SWEEP_SETS = [s for s in TINY if not s.startswith("train.warmup_iters")] + [
    "train.warmup_iters=2", "train.eval_interval=10", "train.min_lr=1e-7"]
LRS = (3e-4, 3e-3, 3e-2)


@pytest.fixture(scope="module")
def sweep_template(tmp_path_factory):
    """runs/ with sweep `sw` (train.lr over LRS, 2 s a trial) and a run `broken` (its corpus's third record is
    not JSON: its trainer fails), all run by `workbench queue run`; each test works on a copy."""
    base = tmp_path_factory.mktemp("sweep")
    root = base / "runs"
    corpus = base / "notes.jsonl"
    corpus.write_text(json.dumps({"text": "def f():\n    return 1\n" * 50}) + "\n"
                      + json.dumps({"text": "x = 2\n" * 50}) + "\n{not json\n")
    wb("sweep", "cpu-small", "--set-grid", "train.lr=" + ",".join(map(str, LRS)), "--time-budget", "2s",
       "--name", "sw", "--runs-dir", str(root), "--set", *SWEEP_SETS, check=True)
    wb("queue", "add", "cpu-small", "--name", "broken", "--corpus", str(corpus), "--runs-dir", str(root),
       "--set", *TINY, "train.max_iters=6", check=True)
    wb("queue", "run", "--runs-dir", str(root), timeout=300, check=True)
    result = json.loads(wb("sweep", "show", "sw", "--json", "--runs-dir", str(root), check=True).stdout)
    assert [t["state"] for t in result["trials"]] == ["finished"] * 3, result
    return root, result


@pytest.fixture
def sweep_runs(sweep_template, tmp_path, monkeypatch):
    root, result = sweep_template
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "presets"))
    shutil.copytree(root, tmp_path / "runs")
    return tmp_path / "runs", result


def cells(app, table: str) -> list[list[str]]:
    t = app.query_one(table, DataTable)
    return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]


def test_results_overlaid_curves_and_the_best_saved_as_a_preset(sweep_runs, tmp_path):
    root, result = sweep_runs
    trials = sorted(result["trials"], key=lambda t: t["metric"])   # best first
    best = result["best"]
    assert trials[0]["run"] == best["run"]
    preset_file = tmp_path / "presets" / "sw-best.toml"

    async def go():
        app = make_app(root, initial_tab="queue")
        async with app.run_test(size=(160, 48)) as pilot:
            res = app.query_one("#sweep-results", DataTable)
            await wait_for(pilot, lambda: res.row_count == 3, what="the sweep's results")
            assert [str(c.label) for c in res.columns.values()][:4] == ["rank", "trial", "train.lr", "val_loss"]
            rows = cells(app, "#sweep-results")
            # sorted by the metric, best first, each with its searched value and what it reached
            assert [r[:4] for r in rows] == [[str(k), t["run"], f"{t['params']['train.lr']:.6g}", f"{t['metric']:.4f}"]
                                             for k, t in enumerate(trials, 1)]
            assert "sweep sw: 3 trials by val_loss" in str(res.border_title)

            # c: the trials' val-loss curves together in Loss curves, each labelled with its trial and setting
            await pilot.press("c")
            await wait_for(pilot, lambda: app.query_one("#tabs").active == "curves", what="the curves tab")
            plot = app.query_one("#curves-plot")
            want = {f"#{k} {t['run']} lr={t['params']['train.lr']!r} val": t for k, t in enumerate(trials, 1)}
            await wait_for(pilot, lambda: {s.label for s in plot.series} == set(want) and
                           all(len(s.ys) == len(evals(root / want[s.label]["run"])) for s in plot.series),
                           timeout=30, what=lambda: repr([(s.label, len(s.ys)) for s in plot.series]))
            for s in plot.series:   # each line is that trial's evals, and the last is what it was ranked by
                ev = evals(root / want[s.label]["run"])
                assert s.xs == [float(k) for k in sorted(ev)] and s.ys == [ev[k] for k in sorted(ev)]
                assert s.ys[-1] == pytest.approx(want[s.label]["metric"])
            assert len({s.color for s in plot.series}) == 3 and len({s.marker for s in plot.series}) == 3
            # the plot is drawn at its laid-out size, which a loaded machine may reach a frame later
            await wait_for(pilot, lambda: "sweep sw: top 3 of 3 trials by val_loss" in text_of(plot), timeout=30,
                           what=lambda: text_of(plot))
            drawn = text_of(plot)
            for label in want:
                assert label in drawn, drawn   # the legend names each trial
            assert sorted(app.query_one("#curves-pane").selected_ids()) == sorted(t["run"] for t in trials)

            # b: the best trial kept as a user preset, through `workbench sweep save-best`
            await pilot.press("7")
            await pilot.press("b")
            await wait_for(pilot, lambda: preset_file.is_file(), timeout=60, what="the preset written")
            await wait_for(pilot, lambda: any("saved as preset sw-best" in str(n.message)
                                              for n in app._notifications), what="the saved note")
            saved = preset_file.read_bytes()
            mtime = preset_file.stat().st_mtime_ns
            await wait_for(pilot, lambda: "sw-best" in app.query_one("#presets-pane").paths,
                           what="the preset listed in Presets")
            await pilot.press("b")   # the name is taken: refused, the file untouched
            await wait_for(pilot, lambda: any("already exists; it is never overwritten" in str(n.message)
                                              for n in app._notifications), timeout=60, what="the refusal")
            assert preset_file.read_bytes() == saved and preset_file.stat().st_mtime_ns == mtime

    run(go())
    from workbench.config import resolve_preset
    p = resolve_preset("sw-best")
    assert p.train.lr == best["params"]["train.lr"] and p.train.warmup_iters == 2 and p.model.dim == 64
    assert p.train.time_budget == ""   # the trials' 2 s budget is said in a comment, not kept
    assert "# each trial trained 2s" in preset_file.read_text()
    # and it trains
    wb("train", "sw-best", "--name", "again", "--runs-dir", str(root), "--set", "train.max_iters=3",
       env={"WORKBENCH_PRESETS_DIR": str(tmp_path / "presets")}, check=True)
    st = read_status(root / "again")
    assert st.state == "finished" and st.step == 3
    assert "lr = " + repr(best["params"]["train.lr"]) in (root / "again" / "preset.toml").read_text()


def test_queue_pane_sweep_results_and_overlaid_curves_in_tmux(sweep_runs, tmp_path):
    """As a user sees it: a run queued from the new-run form (Add to queue, ctrl+l), the Queue pane with runs
    finished, failed and queued, the sweep's results table, and its trials' curves overlaid (printed: the
    closing note's captures)."""
    root, result = sweep_runs
    env = dict(os.environ, WORKBENCH_PRESETS_DIR=str(tmp_path / "presets"), TERM="xterm-256color")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TMUX", None)
    tm = Tmux(f"wbsweep-{os.getpid()}", tmp_path, env)
    shots = {}
    try:
        tm.open_tui(root)
        tm.wait_screen(r"broken[\s\S]*failed[\s\S]*New run", 30)   # the Train pane, on the newest run
        tm.keys("1")   # the preset recommended for this machine: t opens the new-run form with it
        tm.wait_screen(r"Recommended preset: \S+ [\s\S]*?press\s+t\s+to\s+start", 30)
        tm.keys("t")
        tm.wait_screen(r"Start a new run")
        tm.tab_to("name")
        tm.type("later")
        tm.wait_screen(r"name\s+▊\s+later\s", 10)
        tm.tab_to("--set")
        tm.type(" ".join([*TINY, "train.max_iters=6"]))
        tm.wait_screen(r"train\.max_iters=6\s", 10)
        # the whole form, its buttons included (a capture mid-redraw on a loaded machine may hold half of it)
        tm.wait_screen(r"train\.max_iters=6\s[\s\S]*Add to queue \(ctrl\+l\)", 30)
        shots["form"] = tm.screen()
        tm.keys("C-l")
        tm.wait_screen(r"Queued later: the queue's runner starts it", 60)
        assert not (root / "later").exists()    # queued, not started
        tm.keys("7")
        tm.wait_screen(r"later\s+queued[\s\S]*sweep sw: 3 trials by val_loss[\s\S]*c Sweep curves", 30)
        shots["queue"] = screen = tm.screen()
        for name, state in [("broken", "failed"), ("later", "queued"),
                            *((t["run"], "finished") for t in result["trials"])]:
            assert re.search(rf"{name}\s+{state}", screen), (name, state)
        best = result["best"]
        assert re.search(rf"1\s+{best['run']}\s+{best['params']['train.lr']:.6g}\s+{best['metric']:.4f}", screen)
        tm.keys("c")
        tm.wait_screen(r"sweep sw: top 3 of 3 trials by val_loss", 30)
        wait_until(lambda: all(f"{t['run']} lr=" in tm.screen() for t in result["trials"]), 30, "every legend line")
        # every trial's curve drawn to its last eval (the pilot test checks the lines themselves)
        wait_until(lambda: len(re.findall(r"\d\.\d+┤", tm.screen())) >= 3, 30, "the y axis")
        shots["curves"] = tm.screen()
    finally:
        tm.kill_server()
        for name, text in shots.items():
            print(f"----- {name}\n{text}")
    from workbench.queue.store import QueueStore
    store = QueueStore(root)
    assert store.find("later").state == "queued" and store.find("later").sets[-1] == "train.max_iters=6"
    store.close()
