"""The Presets pane's "this preset on other GPUs" view (ctrl+g): `workbench estimate --compare` in the TUI."""

from __future__ import annotations

from textual.widgets import TextArea

from tests.support.tui import make_app, open_preset, run, text_of, wait_for
from workbench.config import resolve_preset
from workbench.fmt import duration
from workbench.plan.compare import compare
from workbench.tui.display import si


def _table(app) -> str:
    return text_of(app.query_one("#preset-gpus-table"))


def test_ctrl_g_shows_the_preset_on_other_gpus_and_back(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(160, 48)) as pilot:
            pane = await open_preset(pilot, app, "gpu-8gb")
            await pilot.pause()
            assert "ctrl+g" in text_of(app.query_one("#preset-estimate"))
            app.query_one("#preset-editor", TextArea).focus()  # typing in the editor: the key still works
            await pilot.pause()
            await pilot.press("ctrl+g")
            await wait_for(pilot, lambda: "gpu-8gb on other GPUs" in _table(app), what="the GPU table")
            shown = _table(app)
            expected = compare(resolve_preset("gpu-8gb"))["rows"]
            for r in expected:  # every GPU of the compare set, in the order `--compare` sorts them
                assert r["gpu"].removeprefix("Apple ") in shown
            lines = [ln for ln in shown.splitlines() if ln.strip()]
            first = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("GPU"))
            # every row, in `--compare`'s order, with each of its cells (memory, fits, batch, tok/s, time, energy)
            for line, r in zip(lines[first + 1:first + 1 + len(expected)], expected):
                name = r["gpu"].removeprefix("Apple ")
                assert line.lstrip().startswith(name), (line, name)
                cells = line.lstrip()[len(name):].split()
                want = [f"{r['estimate'] / 2**30:.1f}/{r['available'] / 2**30:.0f}G", "yes" if r["fits"] else "no",
                        f"{r['batch_size']}x{r['grad_accum']}" if r["fit_batch"] else "—", si(r["tokens_per_s"]),
                        *duration(r["time_s"]).split(), *(["—"] if r["kwh"] is None else [f"{r['kwh']:.2g}", "kWh"])]
                assert cells == want, (name, cells, want)
            assert not app.query_one("#preset-editor", TextArea).display
            assert app.query_one("#preset-side").display  # wide: the list stays beside the table
            # another preset: the table follows it
            pane.load("datacenter-80gb")
            await wait_for(pilot, lambda: "datacenter-80gb on other GPUs" in _table(app), what="the new preset")
            row = next(ln for ln in _table(app).splitlines() if ln.lstrip().startswith("RTX 4060 8GB"))
            assert " no " in row and "—" in row  # it does not fit an 8 GB card, even at batch 1
            # the key again: the editor is back
            await pilot.press("ctrl+g")
            await pilot.pause()
            assert app.query_one("#preset-editor", TextArea).display
            assert not app.query_one("#preset-gpus").display
    run(go())


def test_at_80_columns_the_table_takes_the_whole_pane(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(80, 24)) as pilot:
            await open_preset(pilot, app, "gpu-8gb")
            await pilot.pause()
            await pilot.press("ctrl+g")
            await wait_for(pilot, lambda: "H100 SXM 80GB" in _table(app), what="the GPU table")
            assert not app.query_one("#preset-side").display
            assert app.focused is app.query_one("#preset-gpus")  # its keys (ctrl+g, scrolling) stay live
            await pilot.press("ctrl+g")
            await pilot.pause()
            assert app.query_one("#preset-side").display and app.query_one("#preset-editor").display
    run(go())


def test_an_invalid_preset_says_to_fix_it_first(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(160, 48)) as pilot:
            pane = await open_preset(pilot, app, "cpu-small")
            editor = app.query_one("#preset-editor", TextArea)
            editor.text = editor.text.replace("[model]", "[model]\nbogus = 1")
            await wait_for(pilot, lambda: pane.valid is None, what="the error")
            await pilot.press("ctrl+g")
            await wait_for(pilot, lambda: "fix it to see it on other GPUs" in _table(app), what="the message")
    run(go())
