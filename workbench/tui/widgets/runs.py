"""Runs / checkpoint browser: every run with its state, and its checkpoints from the sidecars."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from workbench.fmt import human_bytes
from workbench.plan.summary import RunSummary
from workbench.rundir import best_checkpoint
from workbench.tui import fmt


class RunsPane(Vertical):
    BINDINGS = [
        Binding("enter", "app.monitor_selected", "Monitor", show=False),
        Binding("m", "app.monitor_selected", "Monitor"),
        # short labels: all of them fit the footer of an 80-column terminal
        Binding("r", "app.resume_selected('latest')", "Resume"),
        Binding("c", "app.resume_selected('chosen')", "Resume ckpt"),
        Binding("s", "app.sample_selected", "Sample"),
        Binding("l", "app.curves_selected", "Curves"),
        Binding("d", "app.delete_selected", "Delete"),
        Binding("f", "app.refresh_runs", "Refresh", show=False),
    ]

    def __init__(self, **kw):
        super().__init__(**kw)
        self.summaries: dict[str, RunSummary] = {}

    def compose(self) -> ComposeResult:
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="runs-detail")
        yield DataTable(id="ckpt-table", cursor_type="row")

    def on_mount(self) -> None:
        t = self.query_one("#runs-table", DataTable)
        # No preset column: run ids start with the preset's name, and the line under the table
        # names it; without it the disk column fits an 80-column terminal.
        t.add_columns("run", "state", "step", "train", "best val", "tok/s", "disk")
        t.border_title = "runs"
        c = self.query_one("#ckpt-table", DataTable)
        c.add_columns("checkpoint", "step", "train loss", "val loss", "tokens", "size", "")
        c.border_title = "checkpoints (tab here, then c to resume from one)"

    def set_runs(self, runs: list[RunSummary]) -> None:
        t = self.query_one("#runs-table", DataTable)
        current = self.selected_run_id()
        self.summaries = {r.id: r for r in runs}
        t.clear()
        for r in runs:
            steps = f"{r.step:,}/{r.max_iters:,}" if r.max_iters else f"{r.step:,}"
            t.add_row(r.id, Text.from_markup(fmt.state_markup(r.state)), steps,
                      fmt.loss(r.train_loss), fmt.loss(r.best_val_loss), fmt.si(r.tokens_per_s),
                      human_bytes(r.disk_bytes), key=r.id)
        if current in self.summaries:
            t.move_cursor(row=t.get_row_index(current), animate=False)
        self.show_checkpoints()

    def selected_run_id(self) -> str | None:
        t = self.query_one("#runs-table", DataTable)
        if not t.row_count:
            return None
        try:
            return str(t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value)
        except Exception:
            return None

    def selected_checkpoint(self) -> dict | None:
        c = self.query_one("#ckpt-table", DataTable)
        run = self.summaries.get(self.selected_run_id() or "")
        if not run or not c.row_count:
            return None
        key = str(c.coordinate_to_cell_key(c.cursor_coordinate).row_key.value)
        return next((k for k in run.checkpoints if k.get("name") == key), None)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "runs-table":
            self.show_checkpoints()

    def show_checkpoints(self) -> None:
        c = self.query_one("#ckpt-table", DataTable)
        c.clear()
        run = self.summaries.get(self.selected_run_id() or "")
        detail = self.query_one("#runs-detail", Static)
        if run is None:
            detail.update("No runs here yet. Press [b]n[/b] to start one.")
            return
        msg = Text.assemble((run.id, "bold"), "  ", Text.from_markup(fmt.state_markup(run.state)),
                            f"  preset {run.preset}  {len(run.checkpoints)} checkpoint(s)")
        if run.error and run.state in ("failed", "crashed"):
            msg.append(f"\n{run.error}", style="red")
        detail.update(msg)
        best = best_checkpoint(run.checkpoints)
        for k in reversed(run.checkpoints):
            c.add_row(k.get("name", "?"), str(k.get("step", "?")), fmt.loss(k.get("train_loss")),
                      fmt.loss(k.get("val_loss")), fmt.si(k.get("tokens_seen")),
                      human_bytes(k["bytes"]) if isinstance(k.get("bytes"), int) else "—",
                      "best" if best is k else "", key=k.get("name"))

    def focused_table(self) -> str:
        f = self.app.focused
        return f.id if isinstance(f, DataTable) else "runs-table"
