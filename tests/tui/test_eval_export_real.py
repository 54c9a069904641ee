"""Evaluate and export from the Runs pane on a REAL tiny run: the dialogs run `workbench eval` / `workbench export`
(real subprocesses, torch in them) as the CLI runs them, show their progress and result, and refuse bad input in
one line with nothing written (issue 43: eval and export were CLI-only). The real run is trained once for the
session and copied for each test (``real_runs``, tests/tui/conftest.py)."""

from __future__ import annotations

import json

import pytest
from textual.widgets import Input, Select

from tests.support.cli import wb
from tests.support.runs import read_jsonl, tree
from tests.support.tui import make_app, run, text_of, wait_for

pytestmark = pytest.mark.slow


def _note(app) -> str:
    return text_of(app.screen.query_one("#job-note"))


def _log(app) -> str:
    return text_of(app.screen.query_one("#job-log"))


def test_evaluate_a_checkpoint_from_the_runs_pane(real_runs, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    run_dir = real_runs / "t"

    async def go():
        app = make_app(real_runs, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.summaries, what="the run list")
            await pilot.press("e")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "EvalScreen", what="the eval dialog")
            assert "Evaluate t, checkpoint 20" in text_of(app.screen.query_one("#job-title"))
            # a task file that does not exist: one line, the dialog stays, nothing is run or written
            before = tree(run_dir)
            app.screen.query_one("#job-tasks", Input).value = str(tmp_path / "nope.jsonl")
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: "no task file" in _note(app), what=lambda: _note(app))
            assert _note(app).count("\n") == 0 and app.screen.job is None and tree(run_dir) == before
            app.screen.query_one("#job-tasks", Input).value = "builtin"
            app.screen.query_one("#job-limit", Input).value = "4"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: "done in" in _note(app) or "failed" in _note(app), timeout=120,
                           what=lambda: _note(app) + _log(app))
            assert "done in" in _note(app), _note(app)
            assert "stdlib-next-line" in _log(app) and "docs-cloze" in _log(app), _log(app)
            said = app.screen.progress_lines  # each task's items as they were scored
            assert "stdlib-next-line 4/4 (step_0000020)" in said and "docs-cloze 0/4 (step_0000020)" in said, said
            saved = {(r["task"], r["metric"]): r["value"] for r in read_jsonl(run_dir / "tasks.jsonl")}
            await pilot.press("escape")
            await wait_for(pilot, lambda: type(app.screen).__name__ != "EvalScreen", what="the dialog closed")
            card = app.query_one("#runs-card")
            await wait_for(pilot, lambda: "stdlib-next-line" in text_of(card), what=lambda: text_of(card))
            return saved

    saved = run(go())
    # the scores are the CLI's own for the same checkpoint and items
    cli = json.loads(wb("eval", "t", "--runs-dir", str(real_runs), "--checkpoint", "20", "--task", "builtin",
                        "--limit", "4", "--no-save", "--json", check=True).stdout)
    for t in cli["checkpoints"][0]["tasks"]:
        assert saved[(t["task"], t["metric"])] == pytest.approx(t["score"]), (t, saved)


def test_export_a_checkpoint_from_the_runs_pane(real_runs, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("the user's own file")
    out = tmp_path / "out-gguf"

    async def go():
        app = make_app(real_runs, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.summaries, what="the run list")
            await pilot.press("x")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "ExportScreen", what="the export dialog")
            folder = app.screen.query_one("#job-out", Input)
            assert folder.value == str((real_runs.parent / "exports" / "t-step20-hf").resolve())
            app.screen.query_one("#job-format", Select).value = "gguf"
            await wait_for(pilot, lambda: folder.value.endswith("t-step20-gguf"), what="the default folder")
            # a folder that exists with the user's file in it: one line, nothing touched
            folder.value = str(taken)
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: "is not empty" in _note(app), what=lambda: _note(app))
            assert sorted(p.name for p in taken.iterdir()) == ["mine.txt"] and app.screen.job is None
            folder.value = str(out)
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: "done in" in _note(app) or "failed" in _note(app), timeout=120,
                           what=lambda: _note(app) + _log(app))
            assert "done in" in _note(app), _note(app)
            assert f"written to: {out}" in _log(app), _log(app)
            assert "GGUF file (f16)" in _log(app)
            said = app.screen.progress_lines
            assert said[0] == "reading the weights of t checkpoint 20" and said[-1] == f"renaming it to {out}", said
            await pilot.press("escape")

    run(go())
    assert (out / "model.gguf").stat().st_size > 10_000
    assert (taken / "mine.txt").read_text() == "the user's own file"
