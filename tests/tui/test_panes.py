"""Pilot tests: each pane on canned run directories, asserting what it shows after key presses."""

from __future__ import annotations

import json
import sys

from textual.widgets import DataTable, Input, RichLog, Select, SelectionList, Static, TextArea

from tests.support.tui import make_app, notified, run, run_palette_command, text_of, wait_for

VALID = "✓ valid"  # the whole status line of a valid preset (an error reads "✗ ...", e.g. "not valid TOML")


def preset_status(app) -> str:
    return text_of(app.query_one("#preset-status")).strip()


def _log_text(log) -> str:
    if isinstance(log, RichLog):
        return "\n".join(strip.text for strip in log.lines)
    return "\n".join(log.lines)


# ----------------------------------------------------------------------------- hardware

def test_hardware_pane_shows_injected_machine_and_starts_recommended(runs_dir):
    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("1")
            await pilot.pause()
            body = text_of(app.query_one("#hw-body", Static))
            assert "Fixture CPU 9000" in body and "8 physical, 16 threads" in body
            assert "NVIDIA GeForce RTX 4060" in body and "8.9" in body and "45°C" in body
            assert "bf16, fp16, fp32" in body and "flash (SDPA)" in body
            assert "Recommended preset: gpu-8gb" in body
            await pilot.press("t")
            await pilot.pause()
            assert app.screen.__class__.__name__ == "NewRunScreen", app.focused
            assert app.screen.query_one("#nr-preset", Select).value == "gpu-8gb"
            await pilot.press("escape")
            assert app.screen.__class__.__name__ != "NewRunScreen"
    run(go())


# ----------------------------------------------------------------------------- train / monitor

def test_monitor_follows_a_live_run_and_new_records(live_runs_dir):
    async def go():
        app = make_app(live_runs_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "delta", what="the live run to be picked")
            await wait_for(pilot, lambda: "step 120 / 400" in text_of(app.query_one("#mon-progress-text")),
                           what="progress")
            assert "ETA" in text_of(app.query_one("#mon-progress-text"))
            stats = text_of(app.query_one("#mon-stats"))
            assert "25.6k" in stats and "1.2%" in stats and "310 MiB" in stats and "1.00e-03" in stats
            assert "running" in text_of(app.query_one("#mon-state"))
            assert "checkpoint" in _log_text(app.query_one("#mon-events", RichLog))
            assert "step   120 | loss" in _log_text(app.query_one("#mon-log", RichLog))
            # the trainer writes more: the pane follows
            with open(live_runs_dir / "delta" / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"kind": "train", "step": 130, "loss": 3.25, "tokens_per_s": 30000.0,
                                    "elapsed_s": 13.0, "tokens_seen": 33280, "lr": 9e-4, "grad_norm": 0.5,
                                    "mem_mb": 320, "mfu": None, "skipped": 2}) + "\n")
                f.write(json.dumps({"kind": "event", "event": "nonfinite_skip", "step": 130,
                                    "message": "loss was inf"}) + "\n")
            with open(live_runs_dir / "delta" / "train.log", "a") as f:
                f.write("step   130 | loss 3.2500\n")
            await wait_for(pilot, lambda: "3.2500" in text_of(app.query_one("#mon-stats")), what="new record")
            stats = text_of(app.query_one("#mon-stats"))
            assert "30k" in stats and "skipped   2" in stats.replace("skipped  ", "skipped   ")
            assert "step 130 / 400" in text_of(app.query_one("#mon-progress-text"))
            await wait_for(pilot, lambda: "loss was inf" in _log_text(app.query_one("#mon-events", RichLog)))
            assert "step   130 | loss 3.2500" in _log_text(app.query_one("#mon-log", RichLog))
            # stop asks first; "n" leaves the run alone (never say yes: delta's pid is this test)
            await pilot.press("x")
            await pilot.pause()
            assert app.screen.__class__.__name__ == "ConfirmScreen"
            assert "Stop run delta" in text_of(app.screen.query_one("#confirm-question"))
            await pilot.press("n")
            await pilot.pause()
            assert app.screen.__class__.__name__ != "ConfirmScreen"
    run(go())


def test_monitor_switches_run_and_shows_failure(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="train")
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "gamma")  # newest run
            await wait_for(pilot, lambda: "CUDA out of memory" in text_of(app.query_one("#mon-stats")))
            app.query_one("#mon-run", Select).value = "alpha"
            await wait_for(pilot, lambda: "step 400 / 400" in text_of(app.query_one("#mon-progress-text")))
            assert "finished" in text_of(app.query_one("#mon-progress-text"))
            assert "2.4286" in text_of(app.query_one("#mon-stats"))  # best val loss
            await pilot.press("x")  # not running: no confirmation, a warning instead
            await wait_for(pilot, lambda: notified(app, "The run shown is not running."), what="the warning")
            assert app.screen.__class__.__name__ != "ConfirmScreen"
    run(go())


# ----------------------------------------------------------------------------- loss curves

def test_curves_toggle_log_axis_smoothing_and_overlay(runs_dir):
    async def go():
        app = make_app(runs_dir, initial_tab="train")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "gamma")
            app.monitor("alpha", switch=False)
            await pilot.press("4")
            await pilot.pause()
            pane = app.query_one("#curves-pane")
            sl = app.query_one("#curves-runs", SelectionList)
            sl.deselect_all()
            sl.select("alpha")
            await wait_for(pilot, lambda: len(app.run_data["alpha"].steps) == 40, what="alpha's metrics")
            pane.redraw()
            await pilot.pause()
            plot = text_of(app.query_one("#curves-plot"))
            assert "train" in plot and "val" in plot and "step" in plot
            await pilot.press("l", "x", "s")
            await pilot.pause()
            settings = text_of(app.query_one("#curves-settings"))
            assert "y: log" in settings and "x: tokens" in settings and "smoothing: 0.6" in settings
            assert "tokens seen" in text_of(app.query_one("#curves-plot"))
            await pilot.press("v")
            assert pane.show == "train"
            # overlay a second run: both appear in the legend by name
            sl.select("beta")
            await wait_for(pilot, lambda: len(app.run_data["beta"].steps) == 15, what="beta's metrics")
            pane.redraw()
            await pilot.pause()
            plot = text_of(app.query_one("#curves-plot"))
            assert "alpha" in plot and "beta" in plot
    run(go())


# ----------------------------------------------------------------------------- runs browser

def test_runs_browser_lists_runs_checkpoints_and_deletes_with_confirmation(runs_dir):
    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("6")
            await pilot.pause()
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 3)
            rows = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(3)}
            assert rows["alpha"][1] == "finished" and rows["alpha"][2] == "400/400"
            assert rows["beta"][1] == "stopped" and rows["beta"][4] == "5.2192"
            assert rows["gamma"][1] == "failed"
            # highlight alpha: its two checkpoints from the sidecars, best marked
            table.move_cursor(row=table.get_row_index("alpha"))
            await pilot.pause()
            ck = app.query_one("#ckpt-table", DataTable)
            assert ck.row_count == 2
            assert [str(ck.get_row_at(i)[0]) for i in range(2)] == ["step_0000400", "step_0000200"]
            assert str(ck.get_row_at(0)[6]) == "best"
            # delete a checkpoint: focus the checkpoint table, d, then confirm
            ck.focus()
            ck.move_cursor(row=1)
            await pilot.press("d")
            await pilot.pause()
            assert "step_0000200" in text_of(app.screen.query_one("#confirm-question"))
            await pilot.press("y")
            await wait_for(pilot, lambda: not (runs_dir / "alpha/checkpoints/step_0000200").exists())
            await wait_for(pilot, lambda: ck.row_count == 1)
            # delete a run; "n" first keeps it
            table.focus()
            table.move_cursor(row=table.get_row_index("beta"))
            await pilot.press("d")
            await pilot.pause()
            await pilot.press("n")
            await pilot.pause()
            assert (runs_dir / "beta").exists()
            await pilot.press("d")
            await pilot.pause()
            await pilot.press("y")
            await wait_for(pilot, lambda: not (runs_dir / "beta").exists())
            await wait_for(pilot, lambda: table.row_count == 2)
            # open in loss curves, then sample, from the browser
            table.move_cursor(row=table.get_row_index("alpha"))
            await pilot.press("l")
            await pilot.pause()
            assert app.query_one("#tabs").active == "curves"
            assert "alpha" in app.query_one("#curves-runs", SelectionList).selected
            await pilot.press("6")
            await pilot.pause()
            await pilot.press("s")
            await pilot.pause()
            assert app.query_one("#tabs").active == "sample"
            assert app.query_one("#smp-run", Select).value == "alpha"
    run(go())


def test_runs_browser_refuses_to_delete_a_live_run(live_runs_dir):
    async def go():
        app = make_app(live_runs_dir, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 4)
            table.move_cursor(row=table.get_row_index("delta"))
            table.focus()
            await pilot.press("d")
            await wait_for(pilot, lambda: notified(app, "delta is running; stop it first."), what="the refusal")
            assert app.screen.__class__.__name__ != "ConfirmScreen"
            assert (live_runs_dir / "delta").exists()
            # its checkpoints too: the trainer prunes its own
            app.query_one("#ckpt-table", DataTable).focus()
            await pilot.press("d")
            await wait_for(pilot, lambda: notified(app, "delta is running (it prunes its own checkpoints); stop it "
                                                        "first."), what="the refusal for a checkpoint")
            assert app.screen.__class__.__name__ != "ConfirmScreen"
            assert (live_runs_dir / "delta" / "checkpoints").exists()
    run(go())


# ----------------------------------------------------------------------------- sample

def test_sample_pane_streams_two_checkpoints_side_by_side(runs_dir, monkeypatch):
    from workbench.tui import launcher

    calls = []

    def fake_argv(runs, run_id, ckpt, prompt, *rest):
        calls.append((run_id, ckpt, prompt, rest))
        # a real subprocess that streams like the sampler: the prompt, then one flushed piece at a time
        code = ("import sys, time\n"
                f"for w in [{prompt!r}, '<{ckpt}>', ' hello', ' world']:\n"
                "    sys.stdout.write(w); sys.stdout.flush(); time.sleep(0.05)\n")
        return [sys.executable, "-c", code]

    monkeypatch.setattr(launcher, "sample_argv", fake_argv)

    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.summaries)
            app.open_sample("alpha")
            await pilot.pause()
            a = app.query_one("#smp-ckpt-a", Select)
            b = app.query_one("#smp-ckpt-b", Select)
            labels = [str(p) for p, _v in a._options]
            assert "step 400 (val 2.429)" in labels and "step 200 (val 3.377)" in labels
            b.value = "200"
            prompt = app.query_one("#smp-prompt", Input)
            prompt.value = "import "
            app.query_one("#smp-temperature", Input).value = "0.5"
            await pilot.pause()
            prompt.focus()
            await pilot.press("enter")
            out_a, out_b = app.query_one("#smp-out-a"), app.query_one("#smp-out-b")
            await wait_for(pilot, lambda: "world" in out_a.text.plain and "world" in out_b.text.plain,
                           what=f"streamed text {getattr(out_a, 'text', None)!r} {getattr(out_b, 'text', None)!r}")
            # "latest" is pinned to the step it means now: the title and the sampler agree on it
            assert out_a.text.plain.startswith("import <400> hello world")
            assert out_b.text.plain.startswith("import <200> hello world")
            assert {c[1] for c in calls} == {"400", "200"}
            assert "alpha @ latest (step 400)" in str(out_a.border_title)
            sampling = calls[0][3][0]  # the settings the sampler is given: the boxes' (the CLI's defaults but one)
            assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p) == (200, 0.5, 0.95)
            # bad settings are refused with a message, not sent to the sampler
            app.query_one("#smp-top_k", Input).value = "many"
            app.action_generate()
            assert len(calls) == 2
            # a checkpoint pruned since the list was read: refused with a message, nothing started
            app.query_one("#smp-top_k", Input).value = "50"
            import shutil
            shutil.rmtree(runs_dir / "alpha" / "checkpoints" / "step_0000200")
            app.action_generate()
            assert len(calls) == 2
            await wait_for(pilot, lambda: any("step 200 of alpha is gone" in str(n.message)
                                              for n in app._notifications), what="the message")
            # the trainer's own samples
            app.query_one("#smp-trainer").collapsed = False
            await pilot.pause()
            assert "foo_400" in text_of(app.query_one("#smp-trainer-text"))
    run(go())


# ----------------------------------------------------------------------------- presets

def test_presets_validate_as_you_type_and_save_atomically(runs_dir, tmp_path):
    user_dir = tmp_path / "user-presets"

    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(140, 44)) as pilot:
            pane = app.query_one("#presets-pane")
            await wait_for(pilot, lambda: pane.current is not None)
            await pilot.pause()
            pane.load("cpu-small")
            editor = app.query_one("#preset-editor", TextArea)
            assert 'name = "cpu-small"' in editor.text
            await wait_for(pilot, lambda: preset_status(app) == VALID, what="the valid marker")
            assert "params" in text_of(app.query_one("#preset-estimate"))
            # a misspelt key, typed: the engine's message with the line it is on
            editor.focus()
            line = next(i for i, ln in enumerate(editor.text.splitlines()) if ln.startswith("lr = "))
            editor.move_cursor((line, 2))
            await pilot.press("r")
            await wait_for(pilot, lambda: "lrr" in text_of(app.query_one("#preset-status")))
            status = preset_status(app)
            assert status.startswith("✗ ") and f"line {line + 1}:" in status and "did you mean 'lr'" in status
            # saving an invalid preset writes nothing
            await pilot.press("ctrl+s")
            refusal = ("Not saved: the preset has an error (see below the editor). "
                       "A file on disk is never replaced by an invalid one.")
            await wait_for(pilot, lambda: notified(app, refusal), what="the refusal")
            assert not (user_dir / "cpu-small.toml").exists()
            # broken TOML: tomllib's line and column
            editor.focus()
            await pilot.press("backspace", "=")
            await wait_for(pilot, lambda: "not valid TOML" in text_of(app.query_one("#preset-status")),
                           what=f"TOML error; editor line is {editor.document.get_line(line)!r}, focus {app.focused}")
            await pilot.press("backspace")
            await wait_for(pilot, lambda: preset_status(app) == VALID, what="valid again")
            # change a value and save: a shipped preset becomes a user copy
            editor.text = editor.text.replace("max_iters = 2000", "max_iters = 1234")
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: (user_dir / "cpu-small.toml").exists())
            assert "max_iters = 1234" in (user_dir / "cpu-small.toml").read_text()
            assert pane.paths["cpu-small"][1] == "user"
            # save as: a new name, written with that name inside
            await pilot.press("ctrl+o")
            await pilot.pause()
            name_input = app.screen.query_one("#name-input", Input)
            name_input.value = "my-small"
            await pilot.press("enter")
            await wait_for(pilot, lambda: (user_dir / "my-small.toml").exists())
            assert 'name = "my-small"' in (user_dir / "my-small.toml").read_text()
            assert pane.current == "my-small"
    run(go())


# ----------------------------------------------------------------------------- new run form and palette

def test_new_run_form_validates_overrides_before_starting(runs_dir):
    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("n")
            await pilot.pause()
            screen = app.screen
            screen.query_one("#nr-preset", Select).value = "cpu-small"
            screen.query_one("#nr-overrides", Input).value = "train.lrr=1 model.dim=64"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.screen is screen  # not started
            assert "unknown key train.lrr" in text_of(screen.query_one("#nr-error"))
            screen.query_one("#nr-overrides", Input).value = "model.dim=60"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert "n_heads" in text_of(screen.query_one("#nr-error"))
            await pilot.press("escape")
    run(go())


def test_command_palette_runs_workbench_actions(runs_dir):
    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.summaries)
            await run_palette_command(pilot, app, "toggle log scale", "Loss curves: toggle log scale")
            await wait_for(pilot, lambda: app.query_one("#curves-pane").log_y)
            assert app.query_one("#tabs").active == "curves"
            await run_palette_command(pilot, app, "go to runs", "Go to Runs")
            await wait_for(pilot, lambda: app.query_one("#tabs").active == "runs")
    run(go())


def test_curves_runs_are_chosen_with_keyboard_and_mouse(runs_dir):
    """The first run is highlighted when the pane opens; down/space tick runs at once and after the
    list refreshes; a click ticks too; the box says ✓ in text, not only in colour."""
    from workbench.tui.messages import RunsListed

    async def go():
        app = make_app(runs_dir, initial_tab="train")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.monitored == "gamma" and app.summaries)
            sl = app.query_one("#curves-runs", SelectionList)
            plot = app.query_one("#curves-plot")
            assert sl.selected == ["gamma"]  # the run the Train pane shows
            await pilot.press("4", "down", "space")  # as fast as a user types them
            assert app.focused is sl
            assert sl.selected == ["gamma", "beta"], sl.selected
            await wait_for(pilot, lambda: "beta" in text_of(plot) and "gamma" in text_of(plot), what="overlay")
            # the list refreshes every few seconds (here: at once); the highlight stays on beta
            app.post_message(RunsListed(list(app.summaries)))
            await pilot.pause()
            await pilot.press("space")
            assert sl.selected == ["gamma"]
            # text (capture-pane, monochrome) shows which are ticked
            lines = [strip.text for strip in (sl.render_line(y) for y in range(3))]
            assert lines[0].lstrip().startswith("▐✓▌ gamma") and lines[1].lstrip().startswith("▐ ▌ beta"), lines
            # the mouse: click alpha's row (border, then gamma, beta, alpha)
            await pilot.click(sl, offset=(6, 3))
            await pilot.pause()
            assert "alpha" in sl.selected
            await wait_for(pilot, lambda: "alpha" in text_of(plot), what="alpha plotted")
    run(go())


def test_tab_keys_move_focus_at_once(runs_dir):
    """A key typed right after a tab key acts in the new pane (t on Hardware starts the form)."""
    async def go():
        app = make_app(runs_dir, initial_tab="train")
        async with app.run_test(size=(120, 36)) as pilot:
            from textual import events
            await wait_for(pilot, lambda: app.summaries)
            for key in ("1", "t"):  # queued together, as keys typed ahead of a busy app arrive
                app.post_message(events.Key(key, key))
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen",
                           timeout=5, what=f"the new-run form (focus: {app.focused})")
            await wait_for(pilot, lambda: app.screen.query_one("#nr-preset").has_focus, what="the form mounted")
            await pilot.press("escape")
    run(go())


def test_presets_editor_highlights_toml_when_available(runs_dir):
    import pytest
    pytest.importorskip("tree_sitter_toml", reason="TOML highlighting needs textual[syntax]")

    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(120, 36)) as pilot:
            pane = app.query_one("#presets-pane")
            await wait_for(pilot, lambda: pane.current is not None)
            editor = app.query_one("#preset-editor", TextArea)
            assert editor.is_syntax_aware and editor.language == "toml"
    run(go())


def test_presets_editor_works_without_a_toml_grammar(runs_dir, monkeypatch):
    """tree-sitter installed without its TOML grammar (Textual raises then): plain text, still valid."""
    import textual.widgets._text_area as text_area
    monkeypatch.setattr(text_area, "get_language", lambda name: None)

    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(120, 36)) as pilot:
            pane = app.query_one("#presets-pane")
            await wait_for(pilot, lambda: pane.current is not None)
            editor = app.query_one("#preset-editor", TextArea)
            assert not editor.is_syntax_aware and "[model]" in editor.text
            await wait_for(pilot, lambda: preset_status(app) == VALID, what="the valid marker")
    run(go())


async def _train_log_shown(pilot, app) -> RichLog:
    """The Train pane following the live run delta, its train.log read: the log widget."""
    await wait_for(pilot, lambda: app.monitored == "delta")
    log = app.query_one("#mon-log", RichLog)
    await wait_for(pilot, lambda: len(log.lines) >= 12, what="the first lines")
    return log


def test_train_log_shows_its_newest_lines_after_the_pane_was_hidden_and_resized(live_runs_dir):
    async def go():
        app = make_app(live_runs_dir, initial_tab="train")
        async with app.run_test(size=(100, 30)) as pilot:
            log = await _train_log_shown(pilot, app)
            await pilot.press("4")
            with open(live_runs_dir / "delta" / "train.log", "a") as f:
                f.write("".join(f"later line {i}\n" for i in range(60)))
            # read while hidden (the log renders them, wrapped, once it has a size again)
            await wait_for(pilot, lambda: app.query_one("#tabs").active == "curves", what="the curves tab")
            await pilot.resize_terminal(80, 24)  # the tmux window shrinks meanwhile
            await wait_for(pilot, lambda: tuple(app.size) == (80, 24), what="the resize")
            await pilot.press("3")
            await wait_for(pilot, lambda: "later line 59" in _log_text(log), what="the lines read while hidden")
            await wait_for(pilot, lambda: app.query_one("#tabs").active == "train" and log.size.height > 0
                           and log.scroll_y == log.max_scroll_y > 0,
                           what=lambda: f"the log at its end (scroll {log.scroll_y} of {log.max_scroll_y})")
            # the log itself shrinks (the stats above it grow, as with a narrow terminal): still at its end
            before = log.max_scroll_y
            app.query_one("#mon-stats").styles.height = app.query_one("#mon-stats").size.height + 4
            await wait_for(pilot, lambda: log.max_scroll_y > before and log.scroll_y == log.max_scroll_y,
                           what=lambda: f"the log at its end after it shrank (scroll {log.scroll_y} of "
                                        f"{log.max_scroll_y})")
    run(go())


def test_a_long_train_log_line_wraps_at_the_panes_width(live_runs_dir):
    """A traceback or a warning with a path is read whole: wrapped, never cut or scrolled sideways."""
    async def go():
        app = make_app(live_runs_dir, initial_tab="train")
        async with app.run_test(size=(80, 24)) as pilot:
            log = await _train_log_shown(pilot, app)
            words = " ".join(f"/very/long/path/part{i}" for i in range(12)) + " END-OF-THE-LONG-LINE"
            with open(live_runs_dir / "delta" / "train.log", "a") as f:
                f.write(f"UserWarning: {words}\n")
            await wait_for(pilot, lambda: "END-OF-THE-LONG-LINE" in _log_text(log), what="the line's end")
            width = log.scrollable_content_region.width
            assert 10 < width < len(words)  # the line is longer than the pane ...
            assert log.max_scroll_x == 0  # ... and nothing needs a sideways scroll
            tail = [strip.text for strip in log.lines if "part" in strip.text or "END-OF" in strip.text]
            assert len(tail) >= 3 and all(len(t.rstrip()) <= width for t in tail), tail
    run(go())


def test_a_run_started_here_is_shown_in_train_curves_and_sample(runs_dir):
    from workbench.tui.messages import RunStarted

    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.query_one("#smp-run", Select).value == "gamma", what="first run")
            app.post_message(RunStarted("beta", "resumed"))  # as the launcher reports it
            await wait_for(pilot, lambda: app.query_one("#smp-run", Select).value == "beta", what="Sample on beta")
            assert app.monitored == "beta" and app.query_one("#tabs").active == "train"
            assert "beta" in app.query_one("#curves-runs", SelectionList).selected
            labels = [str(p) for p, _v in app.query_one("#smp-ckpt-a", Select)._options]
            assert "step 100 (val 5.219)" in labels, labels
    run(go())


def test_checkpoint_events_say_why_not_the_step_twice():
    from workbench.tui.widgets.monitor import event_line
    e = {"kind": "event", "event": "checkpoint", "step": 4600, "name": "step_0004600", "reason": "best",
         "removed": ["step_0003800", "step_0004000"]}
    assert event_line(e).plain == "   4600 checkpoint best, pruned 2"
    assert event_line(dict(e, removed=[], reason="interval")).plain == "   4600 checkpoint interval"


def test_the_palette_offers_stop_only_for_a_running_run(live_runs_dir):
    """Stop for the run followed while it trains (delta); never for a finished one (alpha), whose resume the
    palette offers instead."""
    from workbench.tui.palette import workbench_commands

    async def go():
        app = make_app(live_runs_dir, initial_tab="train")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: len(app.summaries) == 4, what="the run list")
            app.monitor("delta", switch=False)
            await wait_for(pilot, lambda: app.run_data["delta"].state == "running", what="delta read")
            names = [c[0] for c in workbench_commands(app)]
            assert "Stop run delta" in names and "Resume delta from latest" not in names
            app.monitor("alpha", switch=False)
            await wait_for(pilot, lambda: app.run_data["alpha"].state == "finished", what="alpha read")
            names = [c[0] for c in workbench_commands(app)]
            assert not [n for n in names if n.startswith("Stop run")], names
            assert names.count("Resume alpha from latest") == 1 and "Resume run alpha from latest" not in names
    run(go())
