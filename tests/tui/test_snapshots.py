"""Snapshots of the main screens at 80x24 and 160x48 on fixed fixture data.

Hardware is injected, the runs are canned (no live pid, no clock on screen), so the
pictures only change when the UI does. Update with `pytest --snapshot-update`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tui import make_app, text_of, wait_for

SIZES = [(80, 24), (160, 48)]
REPO = Path(__file__).resolve().parents[2]


def _app(runs_dir, tab):
    return make_app(runs_dir, initial_tab=tab)


async def _settle(pilot, app, tab):
    await wait_for(pilot, lambda: len(app.summaries) == 3, what="run list")
    if tab in ("train", "curves"):
        app.monitor("alpha", switch=False)
        await wait_for(pilot, lambda: len(app.run_data["alpha"].steps) == 40, what="alpha metrics")
        await wait_for(pilot, lambda: app.run_data["alpha"].state == "finished", what="alpha status")
    if tab == "curves":
        sl = app.query_one("#curves-runs")
        sl.deselect_all()
        sl.select("alpha")
        await wait_for(pilot, lambda: len(app.run_data["alpha"].eval_steps) == 4)
        app.query_one("#curves-pane").redraw()
    if tab == "runs":
        t = app.query_one("#runs-table")
        t.move_cursor(row=t.get_row_index("alpha"))
        await wait_for(pilot, lambda: "no task scores" in text_of(app.query_one("#runs-card")),
                       what="alpha's report card (read in a worker)")
    if tab == "presets":
        pane = app.query_one("#presets-pane")
        await wait_for(pilot, lambda: pane.current is not None, what="a preset loaded")
        pane.load("cpu-small")
        await wait_for(pilot, lambda: text_of(app.query_one("#preset-status")).strip() == "✓ valid", what="checked")
        # the editor's title names the file: where this checkout lives is no part of the picture
        editor = app.query_one("#preset-editor")
        editor.border_title = str(editor.border_title).replace(str(REPO), "<repo>")
    if tab == "sample":
        app.open_sample("alpha")
        await wait_for(pilot, lambda: "400" in [str(v) for _p, v in app.query_one("#smp-ckpt-a")._options],
                       what="alpha's checkpoints")
    await pilot.pause(0.2)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("tab", ["hardware", "presets", "train", "curves", "sample", "runs"])
def test_main_screens(snap_compare, runs_dir, tab, size):
    app = _app(runs_dir, tab)

    async def before(pilot):
        await _settle(pilot, app, tab)

    assert snap_compare(app, terminal_size=size, run_before=before)
