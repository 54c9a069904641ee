"""The "Evaluate" and "Export" dialogs of a run's checkpoint (the Runs pane's e and x, and the palette).

Each runs the CLI command itself in a subprocess, as a user would type it (``workbench eval ... --progress`` /
``workbench export ... --progress``; the TUI never imports torch), in a thread worker of the dialog's own: its
progress lines are shown as they come, its output at the end. What is wrong with the input (a task file that
does not exist, an output folder that is not empty) is said in the dialog, which stays open with what was typed;
the command refuses the same and more (one line, nothing written), and that line is shown too. The dialog stays
open after the job with the result (the scores, the path written) until it is closed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Input, Select, Static

from workbench.tui import launcher
from workbench.tui.screens.dialogs import StartDialog, form_field

EXPORT_FORMATS = (("Hugging Face directory (transformers)", "hf"), ("GGUF file (llama.cpp, Ollama)", "gguf"),
                  ("safetensors state dict (workbench)", "safetensors"))


def task_problem(text: str) -> str | None:
    """What is wrong with the tasks typed (built-in names or JSONL files, space-separated), or None."""
    from workbench.data.tasks.builtin_tasks import BUILTIN_TASKS  # lazily: it loads the corpus readers
    specs = text.split()
    if not specs:
        return "give a task: builtin (every built-in task), " + ", ".join(BUILTIN_TASKS) + ", or a JSONL file"
    for spec in specs:
        if spec == "builtin" or spec in BUILTIN_TASKS:
            continue
        path = Path(spec).expanduser()
        if not path.exists():
            return f"no task file {path} (a JSONL file, or builtin, {', '.join(BUILTIN_TASKS)})"
        if not path.is_file():
            return f"{path} is not a file: give a JSONL task file"
    return None


def out_dir_problem(text: str) -> str | None:
    """What is wrong with the output folder typed, or None: it must be new or empty (nothing is overwritten)."""
    if not text:
        return "give the folder to write the export into (a new or empty one)"
    out = Path(text).expanduser()
    if out.exists() and not out.is_dir():
        return f"{out} exists and is not a folder: give a new or empty folder (nothing is overwritten)"
    if out.is_dir() and any(out.iterdir()):
        return f"{out} exists and is not empty: give a new or empty folder (nothing is overwritten)"
    if not out.resolve().parent.is_dir():
        return f"the folder above it, {out.resolve().parent}, does not exist: create it first"
    return None


class CliJobScreen(StartDialog["bool | None"]):
    """A dialog that runs one CLI command for a run's checkpoint. Dismisses with True once the command
    succeeded (then closed), else None. Subclasses give the fields (``fields``), the command for what was typed
    (``argv``: None with the problem said) and what to show at the end (``result_text``)."""

    BINDINGS = [Binding("escape", "close", "Close"), Binding("ctrl+s", "start", "Start")]
    DEFAULT_CSS = "#job-log-box { height: auto; max-height: 14; }\n.job-dialog Select { width: 1fr; }"
    title_text = ""
    start_label = "Start"

    def __init__(self, runs_dir: Path, run_id: str, checkpoint: str, on_done: Callable[[], None] | None = None):
        super().__init__()
        self.runs_dir, self.run_id, self.checkpoint = runs_dir, run_id, checkpoint
        self.on_done = on_done
        self.job: launcher.CliJob | None = None
        self.succeeded = False
        self.started_at = 0.0
        self.progress_lines: list[str] = []  # what the job said on the way, in order

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide job-dialog"):
            yield Static(f"[b]{self.title_text}[/b] {self.run_id}, checkpoint {self.checkpoint}", id="job-title")
            yield from self.fields()
            yield Static("", id="job-note")
            with VerticalScroll(id="job-log-box"):
                yield Static("", id="job-log")
            with Horizontal(classes="dialog-buttons"):
                yield Button(f"{self.start_label} (ctrl+s)", id="start", variant="success")
                yield Button("Close (esc)", id="close")

    def fields(self) -> ComposeResult:
        raise NotImplementedError

    def argv(self) -> list[str] | None:
        raise NotImplementedError

    def result_text(self, stdout: str) -> Text:
        return Text(stdout.rstrip())

    def note(self, text: str | Text, error: bool = False) -> None:
        self.query_one("#job-note", Static).update(Text(text, style="red") if error and isinstance(text, str)
                                                    else text)

    @property
    def busy(self) -> bool:
        return self.job is not None

    def action_start(self) -> None:
        if self.busy:
            return
        argv = self.argv()
        if argv is None:
            return
        self.note("")
        self.query_one("#job-log", Static).update(Text("$ workbench " + " ".join(argv[3:]), style="dim"))
        self.started_at = time.monotonic()
        self.job = launcher.CliJob(argv)
        self.query_one("#start", Button).disabled = True
        self._run(self.job)

    @work(thread=True, exclusive=True, group="cli-job", exit_on_error=False)
    def _run(self, job: launcher.CliJob) -> None:
        for line in job.lines():
            if line.startswith("progress: ") or line.startswith("["):
                self.app.call_from_thread(self._progress, line.removeprefix("progress: "))
        rc, out, err = job.finish()
        self.app.call_from_thread(self._finished, rc, out, err)

    def _progress(self, line: str) -> None:
        self.progress_lines.append(line)
        if self.is_attached:
            self.note(Text(f"{line}  ({time.monotonic() - self.started_at:.0f} s)", style="cyan"))

    def _finished(self, rc: int, out: str, err: str) -> None:
        self.job = None
        if not self.is_attached:
            return
        self.query_one("#start", Button).disabled = False
        took = f"{time.monotonic() - self.started_at:.1f} s"
        if rc == 0:
            self.succeeded = True
            self.note(Text(f"done in {took}", style="green"))
            self.query_one("#job-log", Static).update(self.result_text(out))
            if self.on_done:
                self.on_done()
        elif rc < 0:
            self.note(f"stopped after {took}", error=True)
        else:
            self.note(err or f"failed (exit status {rc})", error=True)

    def action_close(self) -> None:
        """Close; a job still running is stopped first (the command writes nothing until it is done)."""
        if self.job is not None:
            self.job.kill()
            self.note("stopping…", error=True)
            return
        self.dismiss(True if self.succeeded else None)


class EvalScreen(CliJobScreen):
    """``workbench eval`` of one checkpoint: the scores go to the run's tasks.jsonl, so the Runs pane's report
    card shows them."""

    title_text = "Evaluate"
    start_label = "Evaluate"

    def fields(self) -> ComposeResult:
        yield form_field("tasks", Input("builtin", placeholder="builtin, a built-in task, or JSONL task files "
                                                               "(space-separated)", id="job-tasks"))
        yield form_field("items", Input("", placeholder="(the first 200 of each task) or a number", id="job-limit",
                                        type="integer"))

    def argv(self) -> list[str] | None:
        tasks = self.query_one("#job-tasks", Input).value.strip()
        if (err := task_problem(tasks)) is not None:
            self.note(err, error=True)
            return None
        limit_text = self.query_one("#job-limit", Input).value.strip()
        limit = int(limit_text) if limit_text else None
        if limit is not None and limit < 1:
            self.note("items: give at least 1 (or leave it empty)", error=True)
            return None
        files = [str(Path(t).expanduser().resolve()) if Path(t).expanduser().exists() else t for t in tasks.split()]
        return launcher.eval_argv(self.runs_dir, self.run_id, self.checkpoint, files, limit)


class ExportScreen(CliJobScreen):
    """``workbench export`` of one checkpoint into a new folder; the path written is shown at the end."""

    title_text = "Export"
    start_label = "Export"

    def __init__(self, runs_dir: Path, run_id: str, checkpoint: str, on_done: Callable[[], None] | None = None):
        super().__init__(runs_dir, run_id, checkpoint, on_done)
        self._default_out = self.default_out("hf")

    def default_out(self, fmt: str) -> str:
        """exports/RUN-stepN-FORMAT beside the runs directory (a new folder: nothing there is overwritten)."""
        return str(Path(self.runs_dir).resolve().parent / "exports" / f"{self.run_id}-step{self.checkpoint}-{fmt}")

    def fields(self) -> ComposeResult:
        yield form_field("format", Select(EXPORT_FORMATS, value="hf", allow_blank=False, id="job-format"))
        yield form_field("GGUF type", Select((("f16 (half the size)", "f16"), ("f32", "f32")), value="f16",
                                             allow_blank=False, id="job-gguf-type"))
        yield form_field("folder", Input(self._default_out, placeholder="a new or empty folder", id="job-out"))

    def on_mount(self) -> None:
        self.query_one("#job-gguf-type", Select).disabled = True
        self.query_one("#job-out", Input).focus()

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id != "job-format":
            return
        fmt = str(event.value)
        self.query_one("#job-gguf-type", Select).disabled = fmt != "gguf"
        out = self.query_one("#job-out", Input)
        if out.value == self._default_out:  # not edited: the default follows the format
            self._default_out = out.value = self.default_out(fmt)

    def argv(self) -> list[str] | None:
        out = self.query_one("#job-out", Input).value.strip()
        exports = Path(self.default_out("hf")).parent
        if out and Path(out).expanduser().resolve().parent == exports and not exports.exists():
            exports.mkdir(parents=True, exist_ok=True)  # the default place: made here, as the form suggests it
        if (err := out_dir_problem(out)) is not None:
            self.note(err, error=True)
            return None
        fmt = str(self.query_one("#job-format", Select).value)
        return launcher.export_argv(self.runs_dir, self.run_id, self.checkpoint, str(Path(out).expanduser()), fmt,
                                    str(self.query_one("#job-gguf-type", Select).value))

    def result_text(self, stdout: str) -> Text:
        lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else "exported"
        path = last.rsplit(" to ", 1)[-1] if " to " in last else ""
        return Text.assemble((last, "bold"), ("\n\nwritten to: ", "dim"), (path, "bold green"))
