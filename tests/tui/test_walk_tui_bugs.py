"""The walk's TUI bugs (issue 53), each shown by a test that failed on the code before its fix:
1. the new-run form said "train.finetune=full recommended" while its method select showed LoRA (and the run
   trained LoRA) when the checkpoint was typed into the form opened with `n`: the select's own Changed at mount
   counted as the user's choice;
8. the Sample pane's checkpoint-B select in chat mode, the Loss curves side panel at 160 columns, the Train tab's
   marker that did not say what it counts;
13. the README's terminal-UI section against the app: the tab keys and the Runs pane's `s` / `l`."""

from __future__ import annotations

import re

from textual.widgets import Input, Select

from tests.support.cli import REPO
from tests.support.tui import make_app, run, text_of, wait_for
from tests.tui.test_finetune_ui import add_imported_run


def test_the_method_select_follows_the_recommendation_in_the_form_opened_with_n(runs_dir):
    """Bug 1: `n`, then a checkpoint typed into "from": the form recommends full and its select shows full, and the
    request trains full (it showed LoRA and the run trained LoRA); a choice the user makes still stands."""
    add_imported_run(runs_dir)

    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen", what="the form")
            form = app.screen
            await pilot.pause(0.3)
            form.query_one("#nr-init", Input).focus()
            await pilot.press(*"smol:0")
            await wait_for(pilot, lambda: "recommended" in text_of(form.query_one("#nr-estimate")),
                           what="the method recommended")
            await pilot.pause(0.5)
            said = text_of(form.query_one("#nr-estimate"))
            assert "method: train.finetune=full recommended" in said, said
            assert form.query_one("#nr-finetune", Select).value == "full"
            assert form.request().finetune == "full"
            # the user's choice is theirs: the next estimate does not undo it
            form.query_one("#nr-finetune", Select).value = "lora"
            form.query_one("#nr-overrides", Input).value = "train.max_iters=50"
            await pilot.pause(1.0)
            assert form.query_one("#nr-finetune", Select).value == "lora" and form.request().finetune == "lora"
    run(go())


# ---------------------------------------------------------------------------------------------------- bug 13

def readme_tui_section() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("## The terminal UI")
    return text[start:text.index("\n## ", start + 1)]


def test_the_readme_names_every_tab_key_the_app_has():
    """Bug 13: the section said in one place that `1`-`6` switch tabs; the app has seven."""
    from workbench.tui.app import WorkbenchApp
    tab_keys = sorted(b.key for b in WorkbenchApp.BINDINGS if b.action.startswith("show_tab("))
    n = len(tab_keys)
    assert tab_keys == [str(i) for i in range(1, n + 1)] and n == len(WorkbenchApp.TAB_LABELS) == 7
    section = readme_tui_section()
    ranges = re.findall(r"`1`[–-]`(\d)`", section)
    assert ranges and all(int(last) == n for last in ranges), ranges


def test_the_readme_says_where_the_runs_panes_s_and_l_are_shown(runs_dir):
    """Bug 13: the section said `s` and `l` are hidden from an 80-column footer, as if a wider one showed them; the
    footer does not show them at any width (160 columns here), so the README says that."""
    shown_at = {}

    async def go(width: int):
        app = make_app(runs_dir, initial_tab="runs")
        async with app.run_test(size=(width, 48)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 3, what="the run list")
            await pilot.pause()
            keys = {b.binding.key for b in app.active_bindings.values() if b.binding.show}
            shown_at[width] = {"s", "l"} & keys
    for width in (80, 160):
        run(go(width))
    section = readme_tui_section()
    if not shown_at[160]:  # the footer never shows them: the README must not say they hide only when narrow
        assert "(hidden from an 80-column footer)" not in section
        assert "`s` and `l` are not in the footer" in section
