"""The "Import model" dialog: a local Hugging Face model directory becomes a run to fine-tune from.

The import itself is ``workbench import`` in a subprocess (the TUI never imports torch), run by this
dialog in a thread worker of its own; the dialog stays open with the error line if it fails, and asks
the app to list the runs again when it succeeds."""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Static

from workbench.cli_client import CliError
from workbench.rundir import RunError, sanitize_run_name
from workbench.tui import launcher
from workbench.tui.screens.dialogs import StartDialog, form_field
from workbench.tui.widgets.runs import RunsPane


def check_model_dir(text: str) -> str | None:
    """What is wrong with the directory typed (checked again, fully, by the import), or None."""
    if not text:
        return "give the model's directory (config.json, *.safetensors, tokenizer.json)"
    d = Path(text).expanduser()
    if not d.is_dir():
        return f"{d} is not a directory"
    if not (d / "config.json").is_file():
        return f"{d} has no config.json: not a Hugging Face model directory"
    return None


class ImportModelScreen(StartDialog["str | None"]):
    """Dismisses with the new run's id, or None when cancelled."""
    BINDINGS = [Binding("escape", "close", "Cancel"), Binding("ctrl+s", "start", "Import")]

    def __init__(self, runs_dir: Path):
        super().__init__()
        self.runs_dir = runs_dir
        self.busy = False

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="import-model"):
            # a Static wraps where the dialog is narrower than the line (a Label was cut at 90 columns)
            yield Static("[b]Import a Hugging Face model[/b] (Llama, Qwen2, Qwen3; a local directory, nothing "
                         "downloaded, no code run)", id="im-title")
            yield form_field("model", Input("", placeholder="~/models/SmolLM2-135M", id="im-dir"))
            yield form_field("name", Input("", placeholder="(the directory's name and the time)", id="im-name"))
            yield Static("", id="im-note")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Import (ctrl+s)", id="start", variant="success")
                yield Button("Cancel (esc)", id="cancel")

    def _note(self, text: str, error: bool = False) -> None:
        self.query_one("#im-note", Static).update(f"[red]{text}[/]" if error else text)

    def action_start(self) -> None:
        if self.busy:
            return
        model_dir = self.query_one("#im-dir", Input).value.strip()
        name = self.query_one("#im-name", Input).value.strip()
        err = check_model_dir(model_dir)
        if err is None and name:
            try:
                sanitize_run_name(name)
            except RunError as e:
                err = str(e)
        if err:
            self._note(err, error=True)
            return
        self.busy = True
        self._note(f"importing {model_dir} … (reading the weights; a large model takes a while)")
        self._import(str(Path(model_dir).expanduser()), name)

    @work(thread=True, exclusive=True, group="import", exit_on_error=False)
    def _import(self, model_dir: str, name: str) -> None:
        try:
            rid = launcher.import_model(self.runs_dir, model_dir, name)
        except CliError as e:
            self.app.call_from_thread(self._failed, str(e))
            return
        self.app.call_from_thread(self._done, rid)

    def _failed(self, error: str) -> None:
        self.busy = False
        self._note(error, error=True)

    def _done(self, run_id: str) -> None:
        self.busy = False
        self.app.post_message(RunsPane.RefreshRequested())  # the app lists the runs again
        self.notify(f"Imported {run_id}: fine-tune it from the Runs pane (t) or the palette.")
        self.dismiss(run_id)

    def action_close(self) -> None:
        if not self.busy:
            self.dismiss(None)
