"""Saving a preset under a new name: the name key is set in the user's own text."""

from __future__ import annotations

import time
import tomllib

import pytest

from workbench.config.editing import with_name

PRESET = '''# my small preset
# (tuned on the laptop)
description = """A preset.
name = "not this one"
"""
name = "cpu-small"   # the shipped one's name

[model]
dim = 64  # small

[data]
corpus = 'C:\\corpora'
'''


def test_the_name_line_is_replaced_and_everything_else_kept():
    out = with_name(PRESET, "my-small")
    assert out.splitlines()[5] == 'name = "my-small"'
    assert tomllib.loads(out) == dict(tomllib.loads(PRESET), name="my-small")
    # comments, the layout and the multi-line description stay as the user wrote them
    assert out.replace('name = "my-small"', 'name = "cpu-small"   # the shipped one\'s name') == PRESET


def test_a_preset_without_a_name_gets_one_before_its_tables():
    text = "[model]\ndim = 64\n"
    out = with_name(text, "x")
    assert out == 'name = "x"\n' + text
    assert tomllib.loads(out) == {"name": "x", "model": {"dim": 64}}


def test_a_name_in_a_table_is_not_the_preset_name():
    text = 'description = "d"\n[model]\nname = "inner"\n'
    out = with_name(text, "x")
    assert tomllib.loads(out) == {"name": "x", "description": "d", "model": {"name": "inner"}}


def test_names_that_need_escaping_are_written_as_toml_strings():
    out = with_name('name = "a"\n', 'we\\ird "one"')
    assert tomllib.loads(out)["name"] == 'we\\ird "one"'


def test_a_name_no_line_edit_can_set_is_written_from_the_data():
    text = 'name = """\nmulti"""\n[model]\ndim = 64\n'  # the name spans two lines
    out = with_name(text, "x")
    assert tomllib.loads(out) == {"name": "x", "model": {"dim": 64}}


# ----------------------------------------------------------------------------- the pane: save, train with it

TINY_EDITS = {"vocab_size = 8192": "vocab_size = 512", "dim = 256": "dim = 64", "n_layers = 4": "n_layers = 2",
              "n_heads = 8": "n_heads = 4", "n_kv_heads = 4": "n_kv_heads = 2", "seq_len = 256": "seq_len = 32",
              "batch_size = 8": "batch_size = 4", "max_iters = 2000": "max_iters = 6",
              "warmup_iters = 30 ": "warmup_iters = 2 ", "eval_interval = 200": "eval_interval = 3",
              "eval_iters = 0 ": "eval_iters = 2 ", "log_interval = 10": "log_interval = 1",
              "ckpt_interval = 500": "ckpt_interval = 3",
              'corpus = "builtin"': 'corpus = "builtin"\nbuiltin_mb = 0.3\ntokenizer_sample_mb = 0.3',
              'compile = "auto"': 'compile = "false"'}


def _tiny(text: str) -> str:
    for old, new in TINY_EDITS.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_presets_save_replaces_the_file_atomically_and_never_with_an_invalid_preset(runs_dir, tmp_path):
    """ctrl+s writes a new file and renames it over the old one (a reader sees the old or the new file,
    never half of one): the file's inode changes, no temporary is left, and an invalid edit leaves it
    as it was, byte for byte."""
    from textual.widgets import TextArea

    from tests.support.tui import make_app, notified, open_preset, run, text_of, wait_for
    user = tmp_path / "user-presets" / "cpu-small.toml"

    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(140, 44)) as pilot:
            pane = await open_preset(pilot, app, "cpu-small")
            editor = app.query_one("#preset-editor", TextArea)
            editor.text = editor.text.replace("max_iters = 2000", "max_iters = 1111")
            await pilot.press("ctrl+s")  # a shipped preset: saved as a user copy
            await wait_for(pilot, lambda: user.exists() and pane.current == "cpu-small", what="the first save")
            first = user.stat().st_ino
            editor = app.query_one("#preset-editor", TextArea)
            editor.text = editor.text.replace("max_iters = 1111", "max_iters = 2222")
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: "max_iters = 2222" in user.read_text(), what="the second save")
            assert user.stat().st_ino != first  # replaced by a rename, not written in place
            assert sorted(p.name for p in user.parent.iterdir()) == ["cpu-small.toml"]  # no temporary left
            before, inode = user.read_bytes(), user.stat().st_ino
            editor.text = editor.text.replace("dim = 256", "dim = 100")  # not divisible by n_heads = 8
            await wait_for(pilot, lambda: text_of(app.query_one("#preset-status")).startswith("✗"), what="invalid")
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: notified(app, "Not saved: the preset has an error (see below the editor). "
                                                        "A file on disk is never replaced by an invalid one."))
            assert user.read_bytes() == before and user.stat().st_ino == inode
            assert sorted(p.name for p in user.parent.iterdir()) == ["cpu-small.toml"]
    run(go())


def test_ctrl_t_trains_the_preset_being_edited(runs_dir, tmp_path):
    """Edit a preset, save it as a new one, ctrl+t: the new-run form opens on it and starts a real run
    whose frozen preset is that one."""
    from textual.widgets import Input, Select, TextArea

    from tests.support.runs import wait_running
    from tests.support.tui import make_app, open_preset, run, text_of, wait_for
    from workbench.rundir import LIVE_STATES, read_status
    run_dir = runs_dir / "ct"

    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(140, 44)) as pilot:
            pane = await open_preset(pilot, app, "cpu-small")
            editor = app.query_one("#preset-editor", TextArea)
            editor.text = _tiny(editor.text)
            await wait_for(pilot, lambda: text_of(app.query_one("#preset-status")).strip() == "✓ valid")
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: app.screen.query("#name-input"), what="the name dialog")
            app.screen.query_one("#name-input", Input).value = "tiny-ct"
            await pilot.press("enter")
            await wait_for(pilot, lambda: pane.current == "tiny-ct", what="the new preset saved and shown")
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen", what="the form")
            assert app.screen.query_one("#nr-preset", Select).value == "tiny-ct"
            app.screen.query_one("#nr-name", Input).value = "ct"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: (run_dir / "status.json").exists(), timeout=60, what="the run to start")
            await wait_for(pilot, lambda: app.monitored == "ct", what="the run followed in the Train pane")
        # the app is closed; the run goes on by itself
        wait_running(run_dir, 0, timeout=60)
        end = time.time() + 120
        while time.time() < end and read_status(run_dir).state in LIVE_STATES:
            time.sleep(0.2)
        st = read_status(run_dir)
        assert (st.state, st.step) == ("finished", 6), st
        frozen = tomllib.loads((run_dir / "preset.toml").read_text())
        saved = tomllib.loads((tmp_path / "user-presets" / "tiny-ct.toml").read_text())
        assert frozen["name"] == "tiny-ct"
        for section in ("model", "train"):  # every value the saved preset sets (the frozen one adds defaults)
            assert saved[section].items() <= frozen[section].items(), section
        assert (frozen["train"]["max_iters"], frozen["model"]["dim"]) == (6, 64)
    run(go())


def test_the_estimate_box_gives_the_time_workbench_estimate_gives(tmp_path, monkeypatch):
    """A preset with a run of it: the box's tokens/s is that run's (by `estimate`'s rule: same name, model,
    batch and device) and its time is `workbench estimate`'s (evaluations included), to the second."""
    import json

    from tests.support.cli import TINY, wb
    from tests.support.tui import make_app, open_preset, run, text_of, wait_for
    from workbench.fmt import duration
    presets = tmp_path / "user-presets"
    presets.mkdir()
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(presets))
    model = "\n".join(f"{k.split('.')[1]} = {v}" for k, v in (s.split("=") for s in TINY) if k.startswith("model."))
    (presets / "tiny.toml").write_text(
        f'name = "tiny"\n[model]\n{model}\n[train]\nbatch_size = 4\nmax_iters = 500\nwarmup_iters = 2\n'
        'eval_interval = 50\neval_iters = 20\n[data]\nbuiltin_mb = 0.3\ntokenizer_sample_mb = 0.3\n'
        '[hardware]\ndevice = "cpu"\ncompile = "false"\nnproc = 1\n')
    runs = tmp_path / "runs"
    env = {"WORKBENCH_PRESETS_DIR": str(presets)}
    wb("train", "tiny", "--runs-dir", str(runs), "--name", "t1", "--set", "train.max_iters=6", "train.log_interval=1",
       env=env, check=True)
    # the same preset as the run except max_iters (which the history does not match on): 500 steps, 11 evals
    est = json.loads(wb("estimate", "tiny", "--runs-dir", str(runs), "--json", env=env, check=True).stdout)
    assert est["previous_run"]["run"] == "t1" and est["time"]["eval_s"] > 0

    async def go():
        app = make_app(runs, initial_tab="presets")
        async with app.run_test(size=(160, 48)) as pilot:
            await open_preset(pilot, app, "tiny")
            box = app.query_one("#preset-estimate")
            await wait_for(pilot, lambda: "time" in text_of(box), what=lambda: f"the time ({text_of(box)!r})")
            rows = {ln.split(None, 1)[0]: ln.split(None, 1)[1].strip()
                    for ln in text_of(box).splitlines() if ln.strip()}
            tps = est["tokens_per_s"]
            assert rows["tokens/s"].endswith("(measured, t1)"), rows
            assert rows["time"] == f"{duration(est['time']['total_s'])} (evals included)", (rows, est["time"])
            # evals make a difference (in seconds: at this tiny run's pace both can round to the same "3s")
            assert est["time"]["total_s"] > est["time"]["train_s"] + 0.1, est["time"]
            assert tps > 0
    run(go())


def _make_invalid(app):
    from textual.widgets import TextArea
    editor = app.query_one("#preset-editor", TextArea)
    editor.text = editor.text.replace("dim = 256", "dim = 100")  # not divisible by n_heads = 8


def test_an_invalid_draft_shows_no_other_presets_estimate(runs_dir):
    """cpu-small's draft has an error; apple-m4pro shown, then cpu-small again: the estimate box says the draft
    has no estimate, never apple-m4pro's 74.4 M parameters beside cpu-small's editor."""
    from tests.support.tui import make_app, open_preset, run, text_of, wait_for
    from workbench.config import resolve_preset
    from workbench.plan.fit.flops import count_params
    from workbench.tui import display
    apple = display.si(count_params(resolve_preset("apple-m4pro").model))

    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(140, 44)) as pilot:
            pane = await open_preset(pilot, app, "cpu-small")
            _make_invalid(app)
            await wait_for(pilot, lambda: text_of(app.query_one("#preset-status")).startswith("✗"), what="invalid")
            box = app.query_one("#preset-estimate")
            pane.load("apple-m4pro")
            await wait_for(pilot, lambda: apple in text_of(box), what="apple-m4pro's estimate")
            pane.load("cpu-small")
            await pilot.pause()
            assert text_of(app.query_one("#preset-status")).startswith("✗")
            assert apple not in text_of(box), text_of(box)
            assert "no estimate" in text_of(box), text_of(box)
    run(go())


def test_ctrl_t_with_an_unsaved_draft_says_so_and_opens_no_form(runs_dir):
    """ctrl+t trains a saved preset: with an invalid draft it asks for a fix (or ctrl+r), with a valid unsaved one
    for ctrl+s, and opens the form only once the editor is what is on disk."""
    from textual.widgets import TextArea

    from tests.support.tui import make_app, notified, open_preset, run, text_of, wait_for

    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(140, 44)) as pilot:
            await open_preset(pilot, app, "cpu-small")
            _make_invalid(app)
            await wait_for(pilot, lambda: text_of(app.query_one("#preset-status")).startswith("✗"), what="invalid")
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: notified(
                app, "cpu-small has an error (see below the editor): fix it, or revert it with ctrl+r, to train "
                     "with it."), what="the refusal")
            assert app.screen.__class__.__name__ != "NewRunScreen"
            editor = app.query_one("#preset-editor", TextArea)
            editor.text = editor.text.replace("dim = 100", "dim = 256").replace("max_iters = 2000", "max_iters = 1000")
            await wait_for(pilot, lambda: text_of(app.query_one("#preset-status")).strip() == "✓ valid",
                           what=lambda: text_of(app.query_one("#preset-status")))
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: notified(
                app, "cpu-small has unsaved changes: save them with ctrl+s to train with them, or revert them "
                     "with ctrl+r."), what="the unsaved note")
            assert app.screen.__class__.__name__ != "NewRunScreen"
            await pilot.press("ctrl+r")
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen", what="the form")
    run(go())


@pytest.mark.parametrize("answer, quits", [("n", False), ("y", True)])
def test_quitting_with_an_unsaved_draft_asks(runs_dir, answer, quits):
    """An invalid draft (or any unsaved one) would be lost on quit: the app asks first; n keeps it open."""
    from tests.support.tui import make_app, open_preset, run, text_of, wait_for

    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(140, 44)) as pilot:
            pane = await open_preset(pilot, app, "cpu-small")
            _make_invalid(app)
            await wait_for(pilot, lambda: text_of(app.query_one("#preset-status")).startswith("✗"), what="invalid")
            pane.load("medium")   # the draft is kept while another preset is shown
            app.query_one("#preset-list").focus()
            await pilot.press("q")
            await wait_for(pilot, lambda: app.screen.query("#confirm-question"), what="the question")
            question = text_of(app.screen.query_one("#confirm-question"))
            assert "cpu-small (it has an error)" in question and "unsaved" in question, question
            await pilot.press(answer)
            await pilot.pause()
            assert app.is_running != quits
    run(go())


def test_a_budgeted_presets_total_tokens_are_what_its_budget_fits():
    """The estimate box's "total tokens" line for a preset with train.time_budget is the budget's estimate (the
    steps `workbench estimate` fits in it, x tokens a step), not max_iters' (only a first guess there); without a
    budget, max_iters'."""
    from rich.console import Console

    from workbench.config import resolve_preset
    from workbench.machine.detect import Gpu, Machine
    from workbench.plan.cost import estimate_time
    from workbench.plan.report import build_report
    from workbench.tui.display import si
    from workbench.tui.widgets.presets import estimate_table, total_tokens
    h100 = Machine(gpus=(Gpu(0, "NVIDIA H100 80GB HBM3", 80 * 2**30, 79 * 2**30, (9, 0)),), physical_cores=16)
    p = resolve_preset("gpu-8gb", ["train.time_budget=10m"])
    r = build_report(p, h100)
    assert r.tokens_per_s
    steps = estimate_time(p, r.tokens_per_s).steps
    assert 0 < steps and int(steps) != p.train.max_iters
    want = f"{si(p.tokens_per_step() * int(steps))} (estimate: ~{int(steps):,} steps in 10m)"
    assert total_tokens(p, r) == want
    console = Console(width=200, record=True)
    console.print(estimate_table(p, {"nvidia": [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                                                 "vram_total": 80 * 2**30, "vram_free": 79 * 2**30,
                                                 "compute_capability": "9.0"}]}))
    assert f"total tokens {want}" in " ".join(console.export_text().split())
    plain = resolve_preset("gpu-8gb", [])
    assert total_tokens(plain, build_report(plain, h100)) == si(plain.tokens_per_step() * plain.train.max_iters)


def test_presets_opens_on_the_preset_the_hardware_pane_recommends(runs_dir):
    """A new user's first ctrl+l (queue) or ctrl+t (train) in Presets is for what fits this machine: the pane opens on
    the Hardware pane's recommendation, not on the first name of the list (apple-m4pro on a Linux laptop)."""
    from tests.support.tui import make_app, run, wait_for

    async def go():
        app = make_app(runs_dir, initial_tab="presets")
        async with app.run_test(size=(140, 44)) as pilot:
            pane = app.query_one("#presets-pane")
            await wait_for(pilot, lambda: pane.current is not None, what="a preset shown")
            recommended = app.recommended[0]
            assert recommended != sorted(pane.paths)[0]      # else the test would pass on the old rule too
            assert pane.current == recommended
            assert app.query_one("#preset-list").highlighted_option.id == recommended
    run(go())
