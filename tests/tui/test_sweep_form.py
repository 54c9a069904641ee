"""The sweep form (issue 53, "a sweep from the TUI"): from the Presets pane (ctrl+f) or the Queue tab (s), a form that
takes the searched keys, the method, the budget per trial, the pruner and a name, shows each trial's estimate and the
warnings `workbench sweep` gives as the user types, and queues the sweep through `workbench sweep` itself: the queue
then holds what `workbench sweep` with the same arguments queues. A budget too short to buy a complete run is refused
in one line and nothing is queued, unless forced; a bad value list is one line. In tmux: the form open, captured."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from textual.widgets import Checkbox, DataTable, Input, Static, TextArea

from tests.support.cli import TINY, wb
from tests.support.tmux import Tmux
from tests.support.tui import make_app, open_preset, paste, run, text_of, wait_for
from workbench.machine.detect import detect

pytestmark = pytest.mark.slow

# cpu-small's model on a small corpus, 32 sequences a step: a 1 s budget buys a step or two on any CPU
# (tests/queue/test_sweep_budget.py's)
SHORT = ["data.builtin_mb=0.3", "data.tokenizer_sample_mb=0.3", "model.vocab_size=512", "hardware.nproc=1",
         "hardware.compile=false", "train.batch_size=32", "train.log_interval=1"]
GRID = ["train.lr = 1e-3, 3e-3", "model.dropout = 0.0, 0.1"]


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """(the form's runs directory, the CLI's), user presets in tmp; this machine's speed measured first, as
    `workbench sweep` measures it before it plans the budgets (so the form, which never imports torch, and the CLI
    plan at the same rate)."""
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "presets"))
    wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3", "--time-budget", "20s", "--print-commands",
       "--runs-dir", str(tmp_path / "scratch"), check=True)
    return tmp_path / "runs", tmp_path / "cli-runs"


def queued(root: Path) -> list[dict]:
    """What `workbench queue ls --json` lists, without what differs between two queues made apart (ids, times)."""
    runs = json.loads(wb("queue", "ls", "--json", "--runs-dir", str(root), check=True).stdout)["runs"]
    return [{k: v for k, v in r.items() if k not in ("id", "added", "started", "ended")} for r in runs]


def sweep_spec(root: Path, name: str) -> dict:
    return json.loads(wb("sweep", "show", name, "--json", "--runs-dir", str(root), check=True).stdout)["sweep"]


def form(app):
    from workbench.tui.screens.sweep_form import SweepFormScreen
    return app.screen if isinstance(app.screen, SweepFormScreen) else None


async def fill(pilot, app, params: list[str], budget: str = "", name: str = "", sets: list[str] = ()):
    """Fill the open form as a user does: the searched keys (focused first) typed, the long line of --set overrides
    pasted (a terminal's paste: typed, its 315 characters took 25 s of the pilot's time), then the budget and the name
    typed. The name last: an estimate that lists the trials by the full name was made from every field."""
    scr = form(app)
    assert scr is not None and app.focused is scr.query_one("#sw-params", TextArea)
    for k, line in enumerate(params):
        if k:
            await pilot.press("enter")
        await pilot.press(*line)
    for field, text in (("#sw-sets", " ".join(sets)), ("#sw-budget", budget), ("#sw-name", name)):
        if text:
            box = scr.query_one(field, Input)
            box.focus()
            if field == "#sw-sets":
                await paste(pilot, text)
            else:
                await pilot.press(*text)
            await wait_for(pilot, lambda: box.value == text, what=lambda: f"{field} to read {text!r}: {box.value!r}")


def estimate_of(app) -> str:
    return text_of(form(app).query_one("#sw-estimate", Static))


def error_of(app) -> str:
    return text_of(form(app).query_one("#sw-error", Static))


def test_a_grid_typed_in_the_form_is_queued_as_workbench_sweep_queues_it(roots):
    root, cli_root = roots
    budget, name = "20s", "grid"
    # the same sweep by the CLI, as a user would type it
    wb("sweep", "cpu-small", "--set-grid", *(g.replace(" ", "") for g in GRID), "--time-budget", budget, "--name",
       name, "--set", *TINY, "--runs-dir", str(cli_root), check=True)

    async def go():
        app = make_app(root, initial_tab="presets", hardware_info=detect())
        async with app.run_test(size=(160, 48)) as pilot:
            await open_preset(pilot, app, "cpu-small")
            await pilot.press("ctrl+f")
            await wait_for(pilot, lambda: form(app) is not None, what="the sweep form")
            await fill(pilot, app, GRID, budget, name, TINY)
            # each trial's estimate (its budget's plan at this machine's measured rate) and what sweep does with it
            await wait_for(pilot, lambda: "4 of 4 trial(s) would be queued" in estimate_of(app)
                           and "grid-t0004" in estimate_of(app),
                           what=lambda: estimate_of(app) + error_of(app))
            shown = estimate_of(app)
            print(shown)
            assert shown.startswith("4 trial(s) (grid 2 x 2) of cpu-small, 20s each, ranked by val_loss (minimize)")
            assert re.search(r"each trial: time budget 20s: ~[\d,]+ steps by the estimate, warmup \d+; evals .* at "
                             r"[\d,]+ tokens/s \(", shown), shown
            for k in range(1, 5):
                assert f"grid-t000{k}  train.lr=" in shown
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: form(app) is None, timeout=120,
                           what=lambda: error_of(app) if form(app) else "")
            # the Queue tab shows it
            await wait_for(pilot, lambda: app.query_one("#tabs").active == "queue", what="the Queue tab")
            sweeps = app.query_one("#sweeps-table", DataTable)
            await wait_for(pilot, lambda: "grid" in sweeps.rows, what="the sweep listed")
            res = app.query_one("#sweep-results", DataTable)
            await wait_for(pilot, lambda: res.row_count == 4, what="its trials")
            # the toast says what `workbench sweep` said last
            await wait_for(pilot, lambda: any(str(n.message).startswith("Sweep grid: 4 trial(s) queued")
                                              for n in app._notifications), what="the toast")

    run(go())
    assert queued(root) == queued(cli_root) and len(queued(root)) == 4
    assert sweep_spec(root, name) == sweep_spec(cli_root, name)


def test_a_budget_too_short_is_refused_in_one_line_and_queued_only_when_forced(roots):
    root, _ = roots

    async def go():
        app = make_app(root, initial_tab="queue", hardware_info=detect())
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("s")   # the Queue tab's key: the preset chosen in Presets (the recommended one)
            await wait_for(pilot, lambda: form(app) is not None, what="the sweep form")
            form(app).query_one("#sw-preset").value = "cpu-small"
            await fill(pilot, app, ["train.lr = 1e-3, 3e-3"], "1s", "short", SHORT)
            await wait_for(pilot, lambda: "0 of 2 trial(s) would be queued" in estimate_of(app)
                           and "short-t0002" in estimate_of(app),
                           what=lambda: estimate_of(app) + error_of(app))
            shown = estimate_of(app)
            print(shown)
            assert "short-t0001  train.lr=0.001  refused: a 1s budget " in shown
            assert "(`sweep --force` queues it anyway)" in shown
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: error_of(app).startswith("no trial of sweep short can be queued"),
                           timeout=120, what=lambda: error_of(app))
            line = error_of(app)
            print(line)
            assert "\n" not in line.strip() and "nothing was queued" in line and form(app) is not None
            assert queued(root) == []

            box = form(app).query_one("#sw-force", Checkbox)
            box.focus()
            await pilot.press("space")
            assert box.value
            await wait_for(pilot, lambda: "2 of 2 trial(s) would be queued" in estimate_of(app),
                           what=lambda: estimate_of(app))
            assert "short-t0002  train.lr=0.003  queued (warning: a 1s budget " in estimate_of(app)
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: form(app) is None, timeout=120,
                           what=lambda: error_of(app) if form(app) else "")
            sweeps = app.query_one("#sweeps-table", DataTable)
            await wait_for(pilot, lambda: "short" in sweeps.rows, what="the sweep listed")

    run(go())
    runs = queued(root)
    assert [r["name"] for r in runs] == ["short-t0001", "short-t0002"] and all(r["force"] for r in runs), runs
    assert sweep_spec(root, "short")["force"] is True


def test_a_bad_value_and_an_unknown_key_are_one_line_and_nothing_is_queued(roots):
    root, _ = roots

    async def go():
        app = make_app(root, initial_tab="presets", hardware_info=detect())
        async with app.run_test(size=(160, 48)) as pilot:
            await open_preset(pilot, app, "cpu-small")
            await pilot.press("ctrl+f")
            await wait_for(pilot, lambda: form(app) is not None, what="the sweep form")
            await fill(pilot, app, ["train.lr = 1e-3, fast"])
            bad = 'trial train.lr="fast": '
            await wait_for(pilot, lambda: error_of(app).startswith(bad), what=lambda: error_of(app))
            print(error_of(app))
            assert error_of(app).endswith("train.lr = 'fast' must be a number") and "\n" not in error_of(app)
            await pilot.press("ctrl+s")   # refused in the form, before any process starts
            await wait_for(pilot, lambda: error_of(app).startswith(bad), what=lambda: error_of(app))
            await pilot.pause(0.5)
            assert form(app) is not None and error_of(app).startswith(bad)

            params = form(app).query_one("#sw-params", TextArea)
            params.text = ""
            await pilot.press(*"train.learning_rate = 1e-3, 3e-3")
            unknown = "--set-grid train.learning_rate: unknown key"
            await wait_for(pilot, lambda: error_of(app).startswith(unknown), what=lambda: error_of(app))
            print(error_of(app))
            assert "\n" not in error_of(app)
            await pilot.press("ctrl+s")
            await pilot.pause(0.5)
            assert form(app) is not None and error_of(app).startswith(unknown)
            await pilot.press("escape")
            await wait_for(pilot, lambda: form(app) is None, what="the form closed")

    run(go())
    assert not (root / "queue.db").exists()


def warned_eval_iters(root: Path, sets: list[str]) -> int:
    """A train.eval_iters whose evals take more than their share of a 20 s budget on this machine but leave it
    enough steps: `sweep` queues the trials with the plan's warning (found by the form's own estimate)."""
    from workbench.tui.screens.sweep_form import SweepFields, build, estimate
    for k in (2 ** n for n in range(1, 17)):
        fields = SweepFields("cpu-small", "train.lr = 1e-3, 3e-3", budget="20s",
                             sets=" ".join([*sets, f"train.eval_iters={k}"]))
        text, ok = estimate(build(fields, root), root, detect())
        if "refused" in text.plain:
            break
        if ok == 2 and "warning: evals of train.eval_iters" in text.plain:
            return k
    raise AssertionError(f"no train.eval_iters draws the budget's warning here: {text.plain}")


def test_the_sweep_form_in_tmux_shows_the_estimate_and_the_warning(roots, tmp_path):
    """As a user sees it: Presets (2), the preset chosen, ctrl+f, a search and a budget typed; the form's estimate
    and warning lines captured (printed: the issue's evidence), then ctrl+s and the Queue tab with the sweep."""
    from workbench.config import preset_to_toml, resolve_preset, with_name, write_user_preset
    root, _ = roots
    sets = [s for s in TINY if not s.startswith("train.eval_iters")]
    k = warned_eval_iters(root, sets)
    # the preset first in the list (Home chooses it): cpu-small made tiny, with evals dearer than a 20 s budget's share
    write_user_preset("a-tiny", with_name(preset_to_toml(resolve_preset("cpu-small", [*sets, f"train.eval_iters={k}"])),
                                          "a-tiny"))
    env = dict(os.environ, TERM="xterm-256color")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TMUX", None)
    tm = Tmux(f"wbsweepform-{os.getpid()}", tmp_path, env)
    shots = {}
    try:
        tm.open_tui(root)
        tm.wait_screen(r"New run", 30)
        tm.keys("2")
        tm.wait_screen(r"Sweep", 30)   # the Presets pane's footer: ctrl+f Sweep
        tm.keys("Home")
        tm.wait_screen(r"a-tiny\s+\S*/a-tiny\.toml", 30)   # the editor's title: the preset shown
        tm.keys("C-f")
        tm.wait_screen(r"New sweep", 30)
        tm.type("train.lr = 1e-3, 3e-3")
        tm.wait_screen(r"2 trial\(s\) \(grid 2\) of a-tiny, max_iters each", 30)
        for _ in range(4):   # method, trials, pruner, budget: one Tab at a time (two together move it once)
            tm.keys("Tab")
            time.sleep(0.5)
        tm.type("20s")
        tm.wait_screen(r"2 of 2 trial\(s\) would be queued", 60)
        tm.wait_screen(r"of a-tiny, 20s each[\s\S]*each trial: time budget 20s: ~[\d,]+ steps by the estimate"
                       r"[\s\S]*warning: evals of train\.eval_iters", 30)
        shots["the sweep form"] = tm.screen()
        tm.keys("C-s")
        tm.wait_screen(r"Sweep a-tiny-sweep: 2 trial\(s\) queued", 120)
        tm.wait_screen(r"a-tiny-sweep-t0002[\s\S]*a-tiny-sweep\s+grid\s+0/2", 30)
        shots["the Queue tab after ctrl+s"] = tm.screen()
    finally:
        shots.setdefault("last screen", tm.screen())
        tm.kill_server()
        for name, text in shots.items():
            print(f"----- {name}\n{text}")
    form_text = shots["the sweep form"]
    assert "queued (warning: evals of train.eval_iters" in form_text
    assert [r["name"] for r in queued(root)] == ["a-tiny-sweep-t0001", "a-tiny-sweep-t0002"]


def test_tpe_with_a_trial_count_and_a_pruner_is_queued_as_workbench_sweep_queues_it(roots):
    """The method and the pruner: tpe draws its first trial now (the runner draws the rest as trials end), as the
    CLI's `--method tpe --trials 3 --pruner median` does; the estimate shows each point a draw may take."""
    from textual.widgets import Select
    root, cli_root = roots
    wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,3e-3", "--time-budget", "20s", "--method", "tpe",
       "--trials", "3", "--pruner", "median", "--name", "tpe", "--set", *TINY, "--runs-dir", str(cli_root),
       check=True)

    async def go():
        app = make_app(root, initial_tab="presets", hardware_info=detect())
        async with app.run_test(size=(160, 48)) as pilot:
            await open_preset(pilot, app, "cpu-small")
            await pilot.press("ctrl+f")
            await wait_for(pilot, lambda: form(app) is not None, what="the sweep form")
            scr = form(app)
            scr.query_one("#sw-method", Select).value = "tpe"
            scr.query_one("#sw-pruner", Select).value = "median"
            await fill(pilot, app, ["train.lr = 1e-3, 3e-3"], "20s", "tpe", TINY)
            scr.query_one("#sw-trials", Input).focus()
            await pilot.press("3")
            await wait_for(pilot, lambda: "2 of 2 point(s) can be queued" in estimate_of(app)
                           and estimate_of(app).startswith("3 trial(s)"),
                           what=lambda: estimate_of(app) + error_of(app))
            shown = estimate_of(app)
            print(shown)
            assert shown.startswith("3 trial(s) drawn by tpe from 2 point(s) of cpu-small, 20s each, ranked by "
                                    "val_loss (minimize), median pruner")
            assert "point 1  train.lr=0.001  queued" in shown
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: form(app) is None, timeout=120,
                           what=lambda: error_of(app) if form(app) else "")

    run(go())
    assert sweep_spec(root, "tpe") == sweep_spec(cli_root, "tpe")
    mine, theirs = queued(root), queued(cli_root)
    assert len(mine) == len(theirs) == 1 and mine == theirs   # the same seed draws the same first point
