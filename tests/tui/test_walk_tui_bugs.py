"""The walk's TUI bugs (issue 53), each shown by a test that failed on the code before its fix:
1. the new-run form said "train.finetune=full recommended" while its method select showed LoRA (and the run
   trained LoRA) when the checkpoint was typed into the form opened with `n`: the select's own Changed at mount
   counted as the user's choice;
8. the Sample pane's checkpoint-B select in chat mode, the Loss curves side panel at 160 columns, the Train tab's
   marker that did not say what it counts;
13. the README's terminal-UI section against the app: the tab keys and the Runs pane's `s` / `l`."""

from __future__ import annotations

import json
import re
import shutil

from textual.widgets import Input, Select

from tests.support.cli import REPO
from tests.support.tui import make_app, run, text_of, wait_for

SMOL_PRESET = """name = "SmolTest"
[source]
model = "/models/SmolTest-135M"
architecture = "LlamaForCausalLM"
model_type = "llama"
max_position_embeddings = 2048

[model]
vocab_size = 512
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
seq_len = 64
tie_embeddings = true

[data]
tokenizer = "{root}/smol/tokenizer.json"
"""


def add_imported_run(root) -> None:
    """``smol``: an imported model (step-0 checkpoint, its tokenizer, status imported), laid out as the importer
    writes it (as tests/tui/test_finetune_ui.py makes it)."""
    d = root / "smol"
    (d / "checkpoints" / "step_0000000").mkdir(parents=True)
    (d / "preset.toml").write_text(SMOL_PRESET.format(root=root))
    (d / "tokenizer.json").write_text("{}")
    (d / "status.json").write_text(json.dumps({"state": "imported", "step": 0, "max_iters": 0}))
    (d / "checkpoints" / "step_0000000" / "meta.json").write_text(json.dumps({"step": 0, "reason": "import",
                                                                             "bytes": 1000}))


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
    """The terminal UI's reference page (the README's section, moved into the docs)."""
    return (REPO / "docs" / "reference" / "tui.md").read_text(encoding="utf-8")


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


# ---------------------------------------------------------------------------------------------------- bug 8

def _findings(n: int):
    from workbench.analysis.doctor.finding import Finding
    return [Finding(kind="unstable", code="unstable.nonfinite", severity="medium", title=f"finding {i}",
                    evidence=(), change="--set train.lr=1e-4") for i in range(n)]


def test_the_train_tabs_marker_says_what_it_counts(runs_dir):
    """Bug 8: the Train tab showed "3 Train ●2" — two of what? It says "findings" (the run doctor's, in the health
    box); under 100 columns, where seven tabs and the words would not fit, the count alone as before."""
    from workbench.tui.widgets.health import marker
    from workbench.tui.widgets.tabs import PaneTabs
    labels = {}

    async def go(width: int):
        app = make_app(runs_dir, initial_tab="hardware")
        async with app.run_test(size=(width, 48)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 3, what="the run list")
            tabs = app.query_one(PaneTabs)
            for n in (2, 1):
                tabs.mark("train", *marker(_findings(n)))  # as the app marks it for the health box's findings
                labels[(width, n)] = tabs.get_tab("train").label.plain
            await pilot.pause()
    run(go(160))
    run(go(80))
    assert labels[(160, 2)] == "3 Train ●2 findings" and labels[(160, 1)] == "3 Train ●1 finding", labels
    assert labels[(80, 2)] == "3 Train ●2", labels


def test_the_checkpoint_b_select_in_chat_mode_shows_every_option(tmp_path, monkeypatch):
    """Bug 8: the B select's list in chat mode was seen clipped to two options; every option is in its open list
    and inside the screen (a chat run with six checkpoints: none, latest, best and six steps)."""
    from textual.widgets._select import SelectOverlay

    from tests.support.canned_runs import make_runs
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    root = make_runs(tmp_path / "runs")
    d = root / "alpha"  # with a chat template (the pane opens it in chat mode) and six checkpoints
    for step in (100, 300, 350, 380):
        shutil.copytree(d / "checkpoints" / "step_0000200", d / "checkpoints" / f"step_{step:07d}")
        meta = d / "checkpoints" / f"step_{step:07d}" / "meta.json"
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "step": step}))
    (d / "chat_template.jinja").write_text("{{ messages }}")

    async def go():
        app = make_app(root)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 3, what="the run list")
            app.open_sample("alpha")
            pane = app.query_one("#sample-pane")
            await wait_for(pilot, lambda: pane.chat_mode, what="chat mode")
            b = app.query_one("#smp-ckpt-b", Select)
            b.focus()
            await pilot.press("enter")
            await pilot.pause(0.3)
            overlay = b.query_one(SelectOverlay)
            assert overlay.option_count == 9
            assert overlay.region.height >= overlay.option_count + 2, overlay.region  # each option a row, border
            assert overlay.region.bottom <= app.size.height
    run(go())


def test_the_loss_curves_side_panel_leaves_the_y_axis_labels_alone(tmp_path, monkeypatch):
    """Bug 8: at 160 columns the side panel (runs, settings) was seen over the plot's y-axis labels: the plot starts
    where the side panel ends, and every row of it starts with its own text (a label or the axis), not the panel's."""
    from tests.support.canned_runs import make_runs
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    root = make_runs(tmp_path / "runs")

    async def go():
        app = make_app(root)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 3, what="the run list")
            app.open_curves("alpha")
            plot = app.query_one("#curves-plot")
            await wait_for(pilot, lambda: plot.series, what="the loss drawn")
            side = app.query_one("#curves-side")
            settings = app.query_one("#curves-settings")
            assert side.region.right <= plot.region.x and settings.region.right <= plot.region.x
            rows = [line for line in str(plot.render()).splitlines() if "┤" in line]
            assert rows and all(re.match(r"\s*[-\d.e+]+┤", line) for line in rows), rows[:3]
    run(go())


def test_the_loss_curves_settings_fit_the_side_panel_at_160_columns(tmp_path, monkeypatch):
    """Bug 8, as a user saw it in tmux at 160 x 48 after `l`, `x`, `b` (log y, tokens, bits per byte): the side
    panel's first settings line, "x: tokens   y: log, bits/byte", is 29 characters in a panel of 28 inside its
    padding, so it ran to the plot's edge and into its y-axis labels ("bits/byte2.08┤"). Every settings line fits
    the panel, the padding before the plot kept."""
    from tests.support.canned_runs import make_runs
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    root = make_runs(tmp_path / "runs")

    async def go():
        app = make_app(root)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 3, what="the run list")
            app.open_curves("alpha")
            plot = app.query_one("#curves-plot")
            await wait_for(pilot, lambda: plot.series, what="the loss drawn")
            app.query_one("#curves-plot").focus()
            await pilot.press("l", "x", "b")
            settings = app.query_one("#curves-settings")
            await wait_for(pilot, lambda: "bits/byte" in text_of(settings), what=lambda: text_of(settings))
            lines = text_of(settings).splitlines()
            room = settings.content_region
            assert all(len(line.rstrip()) <= room.width for line in lines), (room.width, lines)
            assert room.right < plot.region.x, (room, plot.region)   # a column of padding between
    run(go())
