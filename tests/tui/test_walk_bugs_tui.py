"""The walk's bugs (issue 53) that the TUI shows, on real tiny runs: the Runs pane lists runs in `workbench runs`'
order with the same disk use (a linked checkpoint counted once); deleting a run says which runs descend from it;
the export folder the TUI suggests in the checkout is ignored by git."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from textual.widgets import DataTable

from tests.support.cli import REPO, tiny, wb
from tests.support.tui import make_app, run, text_of, wait_for
from workbench.fmt import human_bytes


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> Path:
    """``w`` (10 steps), its branch ``w-from-5`` (to 8), a fine-tune ``ft`` from w's step 10 (3 steps) and a branch
    of that fine-tune, ``ft-from-2``; and ``other``, which comes from none of them."""
    root = tmp_path_factory.mktemp("family")
    sets = tiny("train.max_iters=10", "train.eval_interval=5", "train.ckpt_interval=5")
    wb("train", "cpu-small", "--name", "w", "--runs-dir", str(root), *sets, check=True)
    wb("resume", "w", "--checkpoint", "5", "--runs-dir", str(root), "--set", "train.max_iters=8", check=True)
    wb("train", "cpu-small", "--name", "ft", "--init-from", "w", "--runs-dir", str(root),
       *tiny("train.max_iters=4", "train.eval_interval=2", "train.ckpt_interval=2"), check=True)
    wb("resume", "ft", "--checkpoint", "2", "--runs-dir", str(root), "--set", "train.max_iters=3", check=True)
    wb("train", "cpu-small", "--name", "other", "--runs-dir", str(root), *tiny("train.max_iters=3"), check=True)
    return root


def _rows(table: DataTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def test_the_runs_pane_shows_the_order_and_disk_use_of_workbench_runs(family):
    cli = json.loads(wb("runs", "--json", "--runs-dir", str(family), check=True).stdout)
    assert [r["id"] for r in cli] == ["other", "ft-from-2", "ft", "w-from-5", "w"]   # newest first

    async def go():
        app = make_app(family, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 5)
            rows = _rows(table)
            assert [r[0] for r in rows] == [r["id"] for r in cli]
            assert [r[-1] for r in rows] == [human_bytes(r["disk_bytes"]) for r in cli]
    run(go())


def test_deleting_a_run_names_the_runs_that_descend_from_it(family):
    async def go():
        app = make_app(family, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 5)
            table.focus()
            table.move_cursor(row=table.get_row_index("w"))
            await pilot.press("d")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen", what="the question")
            question = " ".join(text_of(app.screen.query_one("#confirm-question")).split())
            assert ("3 runs descend from it: w-from-5 (branched from w at step 5), ft (full fine-tune from w at "
                    "step 10), ft-from-2 (branched from ft at step 2)") in question, question
            assert "other" not in question
            assert "keep their own copies of the files they need" in question, question
            await pilot.press("n")
            await pilot.pause()
            # a run nothing comes from: the question says so, no list
            table.move_cursor(row=table.get_row_index("other"))
            await pilot.press("d")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen", what="the question")
            question = " ".join(text_of(app.screen.query_one("#confirm-question")).split())
            assert "No other run descends from it." in question, question
            await pilot.press("n")
    run(go())
    assert all((family / r).is_dir() for r in ("w", "w-from-5", "ft", "ft-from-2", "other"))


def test_the_export_folder_the_tui_suggests_in_the_checkout_is_ignored_by_git(tmp_path):
    """Asked of git with the checkout's .gitignore, in a repository of its own (the checkout may be a tarball)."""
    from workbench.tui.screens.run_jobs import ExportScreen
    out = Path(ExportScreen(REPO / "runs", "w", "10").default_out("gguf"))
    assert out.parent == REPO / "exports"
    (tmp_path / ".gitignore").write_bytes((REPO / ".gitignore").read_bytes())
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    rel = out.relative_to(REPO)
    cp = subprocess.run(["git", "check-ignore", "-v", str(rel)], cwd=tmp_path, capture_output=True, text=True)
    assert cp.returncode == 0, f"git does not ignore {rel}: {cp.stdout}{cp.stderr}"
    assert "exports" in cp.stdout
