"""Runs / checkpoint browser: every run with its state, its checkpoints from the sidecars, and the report
card of the checkpoint under the cursor (its task scores, with the change from the previous scored
checkpoint and from the weights the run started from).

The pane acts on the run (and checkpoint) under the cursor: it asks the app to follow, plot, sample,
resume or delete it by messages; deleting is confirmed here first."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from workbench.analysis.report_card import card_lines, report_card
from workbench.analysis.summary import RunSummary, descendants
from workbench.config import load_preset_file
from workbench.errors import WorkbenchError
from workbench.fmt import human_bytes
from workbench.rundir import (
    LIVE_STATES,
    METRICS_FILE,
    PRESET_FILE,
    TASKS_FILE,
    RunError,
    best_checkpoint,
    branch_name,
    check_deletable,
)
from workbench.tui import display
from workbench.tui.messages import ResumeRun
from workbench.tui.screens.dialogs import ConfirmScreen
from workbench.tui.screens.more_steps import MoreStepsScreen
from workbench.tui.screens.run_jobs import EvalScreen, ExportScreen
from workbench.tui.widgets.pane import Pane


def source_text(run: RunSummary) -> str:
    """Where a run's weights came from: '  source SmolLM2-135M (LlamaForCausalLM); LoRA from smol at step 0'."""
    parts = []
    if run.source:
        name = run.source if run.source.startswith("run ") else Path(run.source).name
        parts.append(f"source {name}" + (f" ({run.architecture})" if run.architecture else ""))
    if run.init:
        how = "LoRA" if run.finetune == "lora" else "full fine-tune"
        parts.append(f"{how} from {run.init.replace('@', ' at step ')}")
    return ("  " + "; ".join(parts)) if parts else ""


def descendants_text(summaries: dict[str, RunSummary], run_id: str) -> str:
    """What deleting ``run_id`` means for the runs that come from it (branches, fine-tunes, theirs)."""
    found = descendants(list(summaries.values()), run_id)
    if not found:
        return "No other run descends from it."
    names = ", ".join(f"[b]{r.id}[/b] ({how})" for r, how in found)
    if len(found) == 1:
        return (f"1 run descends from it: {names}. It keeps its own copies of the files it needs (hard links) and "
                "goes on working, but loses the history it is drawn and compared with.")
    return (f"{len(found)} runs descend from it: {names}. They keep their own copies of the files they need (hard "
            "links) and go on working, but lose the history they are drawn and compared with.")


def card_inputs(run: RunSummary) -> tuple[tuple[int, int] | None, ...]:
    """What a run's report card is read from, as (size, mtime) of each file: the card is read again
    only when one of them changed (its own scores, or those of the run its weights came from)."""
    dirs = [Path(run.path)]
    for origin in (run.parent, run.init):
        if origin:
            dirs.append(Path(run.path).parent / origin.rsplit("@", 1)[0])
    sig: list[tuple[int, int] | None] = []
    for d in dirs:
        for name in (METRICS_FILE, TASKS_FILE):
            try:
                st = os.stat(d / name)
                sig.append((st.st_size, st.st_mtime_ns))
            except OSError:
                sig.append(None)
    return tuple(sig)


class RunsPane(Vertical, Pane):
    MAIN_WIDGET = "#runs-table"
    BINDINGS = [
        Binding("enter", "monitor", "Monitor", show=False),
        Binding("m", "monitor", "Monitor", show=False),  # (enter too) hidden: the footer fits 80 columns
        # short labels: what acts on the run itself fits the footer of an 80-column terminal; s and l, which open
        # the run in another pane (as 5 and 4 do), are hidden there (the README's table and the palette list them)
        Binding("r", "resume('latest')", "Resume"),
        Binding("c", "resume('chosen')", "From ckpt"),
        Binding("plus", "more", "More"),
        Binding("t", "fine_tune", "Tune"),  # fine-tune from the run (a new-run form): short, to fit 80 columns
        Binding("e", "evaluate", "Eval"),   # the checkpoint (its table focused) or the run's latest, on tasks
        Binding("x", "export", "Export"),   # the same checkpoint to a Hugging Face directory, GGUF or safetensors
        Binding("d", "delete", "Delete"),
        Binding("s", "sample", "Sample", show=False),
        Binding("l", "curves", "Curves", show=False),
        Binding("f", "refresh", "Refresh", show=False),
    ]

    @dataclass
    class MonitorRequested(Message):
        """Follow the run in the Train pane."""
        run_id: str

    @dataclass
    class CurvesRequested(Message):
        """Plot the run's loss in the Loss curves pane."""
        run_id: str

    @dataclass
    class SampleRequested(Message):
        """Sample from the run in the Sample pane: from ``checkpoint`` (a step), or its latest."""
        run_id: str
        checkpoint: str | None = None

    @dataclass
    class FineTuneRequested(Message):
        """Open the new-run form to train from ``init_from`` (RUN:STEP), fully or with LoRA."""
        init_from: str

    @dataclass
    class DeleteRequested(Message):
        """Delete the run ``run_id`` (directory ``run_dir``), or only its ``checkpoint`` (the user said yes)."""
        run_id: str
        run_dir: Path
        checkpoint: dict | None
        what: str  # "run X" / "checkpoint step_N of X", for the message that says it is done

    class RefreshRequested(Message):
        """Read the runs directory again now."""

    @dataclass
    class CardRead(Message):
        """The report card of ``run_id`` at ``step`` was read (in a worker): ``card_lines``'s text."""
        run_id: str
        step: int
        lines: list[str]

    # A live run's metrics.jsonl grows all the time: its card is read again at most this often (s).
    CARD_REFRESH_S = 10.0

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.summaries: dict[str, RunSummary] = {}
        self._ckpt_run: str | None = None      # the run whose checkpoints the checkpoint table lists
        self._card: tuple[str, int] | None = None   # (run, step) the report card is for
        self._card_inputs: tuple | None = None      # ... and the files it was last read from
        self._card_read_at = 0.0

    def compose(self) -> ComposeResult:
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="runs-detail")
        yield DataTable(id="ckpt-table", cursor_type="row")
        yield Static("", id="runs-card")

    def on_mount(self) -> None:
        t = self.query_one("#runs-table", DataTable)
        # No preset column: run ids start with the preset's name, and the line under the table
        # names it; without it the disk column fits an 80-column terminal.
        t.add_columns("run", "state", "step", "train", "best val", "tok/s", "disk")
        t.border_title = "runs"
        c = self.query_one("#ckpt-table", DataTable)
        c.add_columns("checkpoint", "step", "train loss", "val loss", "tokens", "size", "")
        c.border_title = "checkpoints (tab here, then c to resume from one)"
        self.query_one("#runs-card", Static).border_title = "report card"

    def set_runs(self, runs: list[RunSummary]) -> None:
        t = self.query_one("#runs-table", DataTable)
        current = self.selected_run_id()
        self.summaries = {r.id: r for r in runs}
        t.clear()
        for r in runs:
            steps = f"{r.step:,}/{r.max_iters:,}" if r.max_iters else f"{r.step:,}"
            t.add_row(r.id, Text.from_markup(display.state_markup(r.state)), steps,
                      display.loss(r.train_loss), display.loss(r.best_val_loss), display.si(r.tokens_per_s),
                      human_bytes(r.disk_bytes), key=r.id)
        if current in self.summaries:
            t.move_cursor(row=t.get_row_index(current), animate=False)
        self.show_checkpoints()

    def selected_run_id(self) -> str | None:
        return self.cursor_key("#runs-table")

    def select_run(self, run_id: str) -> None:
        """Put the cursor on ``run_id`` (if listed)."""
        t = self.query_one("#runs-table", DataTable)
        if run_id in self.summaries and run_id != self.selected_run_id():
            t.move_cursor(row=t.get_row_index(run_id), animate=False)

    def selected_checkpoint(self) -> dict | None:
        run = self.summaries.get(self.selected_run_id() or "")
        key = self.cursor_key("#ckpt-table")
        if not run or key is None:
            return None
        return next((k for k in run.checkpoints if k.get("name") == key), None)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """enter on a table: the tables take the key themselves (select_cursor), so the pane's enter binding
        never fires; a selected row is the run to monitor, as m does."""
        event.stop()
        self.action_monitor()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "runs-table":
            self.show_checkpoints()
        elif event.data_table.id == "ckpt-table":
            self.show_card()

    def show_checkpoints(self) -> None:
        c = self.query_one("#ckpt-table", DataTable)
        run = self.summaries.get(self.selected_run_id() or "")
        # the same run listed again (every few seconds): the checkpoint under the cursor stays there
        keep = self.selected_checkpoint() if run and run.id == self._ckpt_run else None
        self._ckpt_run = run.id if run else None
        c.clear()
        detail = self.query_one("#runs-detail", Static)
        if run is None:
            detail.update("No runs here yet. Press [b]n[/b] to start one.")
            self.show_card()
            return
        msg = Text.assemble((run.id, "bold"), "  ", Text.from_markup(display.state_markup(run.state)),
                            f"  preset {run.preset}  {len(run.checkpoints)} checkpoint(s)",
                            (f"  branched from {run.parent.replace('@', ' at step ')}" if run.parent else "", "cyan"),
                            (source_text(run), "magenta"))
        if run.error and run.state in ("failed", "crashed"):
            msg.append(f"\n{run.error}", style="red")
        detail.update(msg)
        best = best_checkpoint(run.checkpoints)
        for k in reversed(run.checkpoints):
            c.add_row(k.get("name", "?"), str(k.get("step", "?")), display.loss(k.get("train_loss")),
                      display.loss(k.get("val_loss")), display.si(k.get("tokens_seen")),
                      human_bytes(k["bytes"]) if isinstance(k.get("bytes"), int) else "—",
                      "best" if best is k else "", key=k.get("name"))
        if keep and keep.get("name") in c.rows:
            c.move_cursor(row=c.get_row_index(keep["name"]), animate=False)
        self.show_card()

    # ------------------------------------------------------------------ report card

    def show_card(self) -> None:
        """The report card of the checkpoint under the cursor: read in a worker when the checkpoint is
        another one, or when its files changed (a live run's at most every CARD_REFRESH_S)."""
        card = self.query_one("#runs-card", Static)
        run = self.summaries.get(self.selected_run_id() or "")
        ck = self.selected_checkpoint()
        if run is None or ck is None or not isinstance(ck.get("step"), int):
            self._card = self._card_inputs = None
            card.display = False
            return
        card.display = True
        key, inputs = (run.id, int(ck["step"])), card_inputs(run)
        if key == self._card:
            if inputs == self._card_inputs or time.monotonic() - self._card_read_at < self.CARD_REFRESH_S:
                return
        else:
            self._card = key
            card.border_title = f"report card: {run.id} step {key[1]:,}"
            card.update(Text("reading task scores…", style="dim"))
        self._card_inputs, self._card_read_at = inputs, time.monotonic()
        self._read_card(Path(run.path).parent, run.id, key[1])

    @work(thread=True, exclusive=True, group="report-card", exit_on_error=False)
    def _read_card(self, root: Path, run_id: str, step: int) -> None:
        self.post_message(self.CardRead(run_id, step, card_lines(report_card(root, run_id, step))))

    @on(CardRead)
    def _card_read(self, msg: CardRead) -> None:
        msg.stop()
        if (msg.run_id, msg.step) != self._card:
            return  # the cursor moved on
        lines = msg.lines
        text = Text("\n".join(lines), no_wrap=len(lines) > 1, overflow="ellipsis")
        if len(lines) > 1:
            text.stylize("bold", 0, len(lines[0]))
        self.query_one("#runs-card", Static).update(text)

    def focused_table(self) -> str | None:
        f = self.app.focused
        return f.id if isinstance(f, DataTable) else "runs-table"

    # ------------------------------------------------------------------ actions on the selection

    def _selected_run(self) -> str | None:
        rid = self.selected_run_id()
        if rid is None:
            self.notify("No run selected.", severity="warning")
        return rid

    def _checkpoint_focused(self) -> dict | None:
        """The checkpoint under the cursor when the checkpoint table has the focus."""
        return self.selected_checkpoint() if self.focused_table() == "ckpt-table" else None

    def action_monitor(self) -> None:
        if (rid := self._selected_run()):
            self.post_message(self.MonitorRequested(rid))

    def action_resume(self, which: str) -> None:
        """``latest``, or ``chosen``: the checkpoint under the cursor in the checkpoint table."""
        if not (rid := self._selected_run()):
            return
        if which == "latest":
            self.post_message(ResumeRun(rid, "latest"))
            return
        ck = self.selected_checkpoint()
        if ck is None:
            self.notify(f"{rid} has no checkpoint to resume from.", severity="warning")
            return
        latest = self.summaries[rid].checkpoints[-1]
        if ck["step"] == latest["step"]:
            self.post_message(ResumeRun(rid, str(ck["step"])))
            return
        child = branch_name(Path(self.summaries[rid].path), ck["step"])

        def answer(yes: bool | None) -> None:
            if yes:
                self.post_message(ResumeRun(rid, str(ck["step"])))

        # History is never rewritten: an older checkpoint goes on in a new run; this one stays as it is.
        self.app.push_screen(ConfirmScreen(
            f"Checkpoint step {ck['step']:,} is not the latest of [b]{rid}[/b] (step {latest['step']:,}).\n\n"
            f"Resume from it as a new run, [b]{child}[/b]? {rid} is left as it is.", "Branch", danger=False), answer)

    def action_more(self) -> None:
        """Continue a run that has ended (finished, stopped, early-stopped) for N more steps."""
        if not (rid := self._selected_run()):
            return
        s = self.summaries[rid]
        if s.state in LIVE_STATES:
            self.notify(f"{rid} is still running.", severity="warning")
            return
        if not s.checkpoints:
            self.notify(f"{rid} has no checkpoint to continue from.", severity="warning")
            return
        try:
            preset = load_preset_file(Path(s.path) / PRESET_FILE)
        except WorkbenchError as e:
            self.notify(str(e), severity="error")
            return

        def answer(n: int | None) -> None:
            if n:
                self.post_message(ResumeRun(rid, "latest", more=n))

        self.app.push_screen(MoreStepsScreen(rid, preset, s.checkpoints[-1]), answer)

    def action_sample(self) -> None:
        if (rid := self._selected_run()):
            ck = self._checkpoint_focused()
            self.post_message(self.SampleRequested(rid, str(ck["step"]) if ck else None))

    def action_fine_tune(self) -> None:
        """Start a new run from the checkpoint under the cursor (its table focused), else the run's latest."""
        if not (rid := self._selected_run()):
            return
        if not self.summaries[rid].checkpoints:
            self.notify(f"{rid} has no checkpoint to start from.", severity="warning")
            return
        ck = self._checkpoint_focused() or self.summaries[rid].checkpoints[-1]
        self.post_message(self.FineTuneRequested(f"{rid}:{ck['step']}"))

    def _job_checkpoint(self, what: str) -> tuple[str, str] | None:
        """(run, step) to evaluate or export: the checkpoint under the cursor (its table focused), else the latest."""
        if not (rid := self._selected_run()):
            return None
        if not self.summaries[rid].checkpoints:
            self.notify(f"{rid} has no checkpoint to {what}.", severity="warning")
            return None
        ck = self._checkpoint_focused() or self.summaries[rid].checkpoints[-1]
        return rid, str(ck["step"])

    def action_evaluate(self) -> None:
        """Score a checkpoint on tasks (`workbench eval`, in the dialog); its report card shows the scores."""
        if (job := self._job_checkpoint("evaluate")) is not None:
            self.open_job("eval", *job)

    def action_export(self) -> None:
        """Export a checkpoint (`workbench export`, in the dialog): format and folder asked."""
        if (job := self._job_checkpoint("export")) is not None:
            self.open_job("export", *job)

    def open_job(self, kind: str, run_id: str, step: str) -> None:
        """The eval or export dialog for ``run_id``'s checkpoint ``step`` (also the palette's)."""
        root = Path(self.summaries[run_id].path).parent if run_id in self.summaries else Path(".")
        if kind == "eval":
            self.app.push_screen(EvalScreen(root, run_id, step, on_done=self.card_stale))
        else:
            self.app.push_screen(ExportScreen(root, run_id, step))

    def card_stale(self) -> None:
        """New scores were written (an eval from the dialog): read the report card again now."""
        self._card_inputs, self._card_read_at = None, 0.0
        self.show_card()

    def action_curves(self) -> None:
        if (rid := self._selected_run()):
            self.post_message(self.CurvesRequested(rid))

    def action_delete(self) -> None:
        """The checkpoint under the cursor when its table has the focus, else the whole run."""
        if not (rid := self._selected_run()):
            return
        if self.focused_table() == "ckpt-table":
            if (ck := self.selected_checkpoint()):
                self.confirm_delete(rid, ck)
        else:
            self.confirm_delete(rid)

    def action_refresh(self) -> None:
        self.post_message(self.RefreshRequested())

    def confirm_delete(self, run_id: str, checkpoint: dict | None = None) -> None:
        """Ask, then post DeleteRequested for the run, or for one of its ``checkpoint``s; a running
        run is refused (and it prunes its own checkpoints)."""
        s = self.summaries.get(run_id)
        if s is None:
            self.notify(f"There is no run {run_id} here.", severity="warning")
            return
        run_dir = Path(s.path)
        try:
            check_deletable(run_dir, checkpoint=checkpoint is not None)
        except RunError as e:
            self.notify(str(e), severity="error")
            return
        if checkpoint is None:
            what = f"run {run_id}"
            question = (f"Delete run [b]{run_id}[/b] and all its checkpoints?\n\n"
                        f"{descendants_text(self.summaries, run_id)}\n\n{run_dir}\n\nThis cannot be undone.")
        else:
            name = checkpoint.get("name")
            what = f"checkpoint {name} of {run_id}"
            question = f"Delete checkpoint [b]{name}[/b] of {run_id}?\n\nThis cannot be undone."

        def answer(yes: bool | None) -> None:
            if yes:
                self.post_message(self.DeleteRequested(run_id, run_dir, checkpoint, what))

        self.app.push_screen(ConfirmScreen(question, "Delete"), answer)
