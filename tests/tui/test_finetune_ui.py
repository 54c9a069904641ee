"""Fine-tuning in the TUI: "Import model" in the command palette, a run's source model under the runs
table, and the new-run form starting from a checkpoint with full or LoRA. The launcher's CLI calls are
recorders (nothing imports or trains); the imported run is written by hand, as the importer lays it out."""

from __future__ import annotations

import json
from pathlib import Path

from textual.widgets import DataTable, Input, Select

from tests.support.tui import make_app, run, run_palette_command, text_of, wait_for
from workbench.tui import launcher
from workbench.tui.launcher import RunRequest

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


def add_imported_run(root: Path) -> None:
    """``smol``: an imported model (step-0 checkpoint, its tokenizer, status imported), and ``tuned``, a LoRA
    run from it."""
    d = root / "smol"
    (d / "checkpoints" / "step_0000000").mkdir(parents=True)
    (d / "preset.toml").write_text(SMOL_PRESET.format(root=root))
    (d / "tokenizer.json").write_text("{}")
    (d / "status.json").write_text(json.dumps({"state": "imported", "step": 0, "max_iters": 0}))
    (d / "checkpoints" / "step_0000000" / "meta.json").write_text(json.dumps({"step": 0, "reason": "import",
                                                                             "bytes": 1000}))
    t = root / "tuned"
    (t / "checkpoints").mkdir(parents=True)
    tuned = SMOL_PRESET.format(root=root).replace('name = "SmolTest"', 'name = "cpu-small"\n[init]\nrun = "smol"\n'
                                                                       'step = 0')
    (t / "preset.toml").write_text(tuned + '\n[train]\nfinetune = "lora"\n')
    (t / "status.json").write_text(json.dumps({"state": "finished", "step": 10, "max_iters": 10}))


def test_the_runs_detail_names_the_source_model(runs_dir):
    add_imported_run(runs_dir)

    async def go():
        app = make_app(runs_dir, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 5)
            detail = app.query_one("#runs-detail")
            for rid, want in (("smol", "source SmolTest-135M (LlamaForCausalLM)"),
                              ("tuned", "source SmolTest-135M (LlamaForCausalLM); LoRA from smol at step 0")):
                table.move_cursor(row=table.get_row_index(rid))
                await wait_for(pilot, lambda want=want: want in text_of(detail), what=f"{rid}'s source")
            assert str(table.get_row("smol")[1]) == "imported"
    run(go())


def test_the_runs_footer_offers_fine_tune(runs_dir):
    """t (fine-tune from the run) is in the Runs pane's footer, beside the pane's other keys, in 80 columns."""
    async def go():
        app = make_app(runs_dir, initial_tab="runs")
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 3)
            shown = {b.binding.key: b.binding.description for b in app.active_bindings.values()
                     if b.enabled and b.binding.show}
            assert shown.get("t") == "Tune", shown  # (that all of them fit 80 columns: the snapshot test)
    run(go())


def test_the_runs_table_is_newest_first_imported_runs_and_branches_too(runs_dir):
    """Newest first by when each run was made: an imported model (no start time: it never trained) and its LoRA run,
    made after the canned runs, come first, not last."""
    import os
    add_imported_run(runs_dir)
    now = 1_700_000_000.0 + 10_000   # after the canned runs' starts (T0 + 0..200)
    os.utime(runs_dir / "smol" / "preset.toml", (now, now))
    os.utime(runs_dir / "tuned" / "preset.toml", (now + 60, now + 60))

    async def go():
        app = make_app(runs_dir, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 5)
            order = [str(table.coordinate_to_cell_key((i, 0)).row_key.value) for i in range(table.row_count)]
            assert order == ["tuned", "smol", "gamma", "beta", "alpha"], order
    run(go())


def test_fine_tune_a_checkpoint_from_the_runs_pane(runs_dir, monkeypatch):
    """t on a run opens the new-run form starting from its latest checkpoint, with the method `estimate
    --init-from` recommends (full, where it fits: it adapts every weight); the form checks the request as
    `train --init-from` would (the model is the source's) and starts it with LoRA once the user chooses LoRA (the
    recommendation does not undo a choice)."""
    add_imported_run(runs_dir)
    requests: list[RunRequest] = []
    monkeypatch.setattr(launcher, "start_run", lambda root, req, timeout=120: requests.append(req) or "tuned")

    async def go():
        app = make_app(runs_dir, initial_tab="runs")
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#runs-table", DataTable)
            await wait_for(pilot, lambda: table.row_count == 5)
            table.move_cursor(row=table.get_row_index("smol"))
            await pilot.press("t")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen", what="the form")
            screen = app.screen
            assert screen.query_one("#nr-init", Input).value == "smol:0"
            await wait_for(pilot, lambda: "recommended" in text_of(screen.query_one("#nr-estimate")),
                           what="the method recommended")
            assert screen.query_one("#nr-finetune", Select).value == "full"
            assert "method: train.finetune=full recommended: full fine-tuning fits: it adapts every weight" \
                in text_of(screen.query_one("#nr-estimate"))
            screen.query_one("#nr-finetune", Select).value = "lora"
            screen.query_one("#nr-preset", Select).value = "cpu-small"
            screen.query_one("#nr-overrides", Input).value = "model.n_layers=3"  # disagrees with the source
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: "disagrees with the source run's model.n_layers = 2"
                           in text_of(screen.query_one("#nr-error")), what="the refusal")
            screen.query_one("#nr-overrides", Input).value = "train.max_iters=500"
            await wait_for(pilot, lambda: "fits" in text_of(screen.query_one("#nr-estimate")), what="the estimate")
            await pilot.pause(0.5)  # (the estimate again after the last edit: the choice stands)
            assert screen.query_one("#nr-finetune", Select).value == "lora"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: requests, what="the start")
            req = requests[0]
            assert (req.init_from, req.finetune, req.preset) == ("smol:0", "lora", "cpu-small")
            assert list(req.new_run().preset_sets()) == ["train.max_iters=500", "train.finetune=lora"]
    run(go())


def test_start_run_passes_init_from_and_the_method(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(launcher, "run_cli", lambda argv, timeout: calls.append(argv) or "tuned\n")
    launcher.start_run(tmp_path, RunRequest("cpu-small", init_from="smol:0", finetune="full"))
    argv = calls[0]
    assert argv[argv.index("--init-from") + 1] == "smol:0"
    assert argv[argv.index("--set") + 1] == "train.finetune=full"


def test_palette_imports_a_model(runs_dir, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(launcher, "import_model", lambda root, model_dir, name="", timeout=1800:
                        calls.append((model_dir, name)) or "smol")
    model = tmp_path / "SmolTest-135M"
    model.mkdir()

    async def go():
        app = make_app(runs_dir)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.summaries)
            await run_palette_command(pilot, app, "import model", "Import model…")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ImportModelScreen", what="the dialog")
            screen = app.screen
            # the title is whole: wrapped onto as many lines as it needs (it was cut at one line)
            title = screen.query_one("#im-title")
            plain = ("Import a Hugging Face model (Llama, Qwen2, Qwen3; a local directory, nothing downloaded, "
                     "no code run)")
            assert title.region.width * title.region.height >= len(plain) and title.region.height >= 2, title.region
            screen.query_one("#im-dir", Input).value = str(model)
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: "has no config.json" in text_of(screen.query_one("#im-note")),
                           what="the check")
            assert calls == []
            (model / "config.json").write_text("{}")
            screen.query_one("#im-name", Input).value = "smol"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: calls == [(str(model), "smol")], what="the import")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ != "ImportModelScreen", what="dismissed")
            assert any("Imported smol" in str(n.message) for n in app._notifications)
    run(go())
