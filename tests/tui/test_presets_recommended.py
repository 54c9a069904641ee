"""The app opened on another tab than the Hardware pane (`workbench --tab queue`, or the Queue tab's `s` before the
Presets pane was visited): the Presets pane is made before the machine is read, and showed the first preset by name
(apple-m4pro on a Linux laptop), which the Queue tab's `a` and `s` then took. Once the machine is read, the
recommended preset is shown instead, unless the user chose one."""

from __future__ import annotations

from textual.widgets import OptionList

from tests.support.tui import make_app, run, wait_for


def test_the_queue_tabs_sweep_form_opens_on_the_recommended_preset_not_the_first_by_name(tmp_path):
    async def go():
        app = make_app(tmp_path / "runs", initial_tab="queue", hardware_info=None)   # the machine read for real
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.recommended is not None, what="the machine read")
            rec = app.recommended[0]
            await wait_for(pilot, lambda: app.presets_pane.current == rec, what=f"{rec} shown in the Presets pane")
            await pilot.press("s")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "SweepFormScreen", what="the sweep form")
            assert app.screen.preset == rec

    run(go())


def test_a_preset_the_user_chose_before_the_machine_was_read_is_kept(tmp_path):
    async def go():
        app = make_app(tmp_path / "runs", initial_tab="presets", hardware_info=None)
        async with app.run_test(size=(160, 48)) as pilot:
            presets = app.presets_pane
            ol = presets.query_one("#preset-list", OptionList)
            chosen = next(n for n in sorted(presets.paths) if n != presets.current)
            ol.highlighted = ol.get_option_index(chosen)
            await wait_for(pilot, lambda: presets.current == chosen, what="the preset chosen")
            await wait_for(pilot, lambda: app.recommended is not None, what="the machine read")
            await pilot.pause(0.3)
            assert presets.current == chosen

    run(go())
