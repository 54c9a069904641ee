"""Queue / Sweeps pane: the run queue (each run's state, place, progress, what it reached and, for a failed
one, why) and the sweeps (trials ended, the best trial and its settings), read from ``runs/queue.db`` read-only
in a worker every few seconds. It changes nothing itself: adding, pausing, removing, moving and starting the
runner are ``workbench queue ...`` commands the app runs (the runner lives on when the TUI quits)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from workbench.queue.listing import Row, rows
from workbench.queue.runner import runner_pid
from workbench.queue.spec import point_sets
from workbench.queue.store import QueueStore
from workbench.queue.sweep import Result, SweepSpec, best, sweep_states
from workbench.tui import display
from workbench.tui.screens.dialogs import ConfirmScreen
from workbench.tui.widgets.pane import Pane

QUEUE_STYLE = {"queued": "cyan", "interrupted": "bold yellow", "pruned": "yellow", "refused": "dim"}


@dataclass(frozen=True)
class QueueView:
    """What the pane shows, read in one go."""
    rows: list[Row]
    sweeps: list[tuple[str, SweepSpec, list[Result]]]
    paused: bool
    runner: int | None     # the runner's pid; None: no runner


def read_queue(root: Path) -> QueueView:
    """The queue of the runs directory ``root`` (read-only; an empty view when nothing was ever queued)."""
    alive = runner_pid(root)
    store = QueueStore.open_existing(root, readonly=True)
    if store is None:
        return QueueView([], [], False, alive)
    try:
        return QueueView(rows(store, alive is not None), sweep_states(store), store.paused(), alive)
    finally:
        store.close()


def state_text(state: str) -> Text:
    if state in QUEUE_STYLE:
        return Text(state, style=QUEUE_STYLE[state])
    return Text.from_markup(display.state_markup(state))


class QueuePane(Vertical, Pane):
    MAIN_WIDGET = "#queue-table"
    BINDINGS = [
        Binding("a", "add", "Add preset"),
        Binding("p", "pause", "Pause/resume"),
        Binding("r", "run", "Run queue"),
        Binding("shift+up", "move(-1)", "Up", show=False),
        Binding("shift+down", "move(1)", "Down", show=False),
        Binding("d", "remove", "Remove"),
        Binding("f", "refresh", "Refresh", show=False),
    ]

    @dataclass
    class AddRequested(Message):
        """Queue a run of the preset chosen in the Presets pane (``workbench queue add``)."""

    @dataclass
    class CommandRequested(Message):
        """Run ``workbench queue ARGS...`` (pause, resume, rm, move, run --detach); ``done`` is said after."""
        args: tuple[str, ...]
        done: str

    @dataclass
    class Read(Message):
        view: QueueView

    def __init__(self, runs_dir: Path, interval: float = 2.0, **kw):
        super().__init__(**kw)
        self.runs_dir = Path(runs_dir)
        self.interval = interval
        self.view = QueueView([], [], False, None)

    def compose(self) -> ComposeResult:
        yield Static("", id="queue-status")
        yield DataTable(id="queue-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="queue-detail")
        yield DataTable(id="sweeps-table", cursor_type="row")

    def on_mount(self) -> None:
        t = self.query_one("#queue-table", DataTable)
        t.add_columns("#", "run", "state", "progress", "val", "settings")
        t.border_title = "queue"
        s = self.query_one("#sweeps-table", DataTable)
        s.add_columns("sweep", "method", "trials", "best", "metric", "best settings")
        s.border_title = "sweeps"
        self.refresh_queue()
        self.set_interval(self.interval, self.refresh_queue)

    def tab_shown(self) -> None:
        self.refresh_queue()

    @work(thread=True, exclusive=True, group="queue-read", exit_on_error=False)
    def refresh_queue(self) -> None:
        self.post_message(self.Read(read_queue(self.runs_dir)))

    @on(Read)
    def _read(self, msg: Read) -> None:
        msg.stop()
        self.show(msg.view)

    def show(self, view: QueueView) -> None:
        self.view = view
        t = self.query_one("#queue-table", DataTable)
        current = self.selected()
        t.clear()
        for r in view.rows:
            val = f"{r.item.metric:.4f}" if r.item.metric is not None else ""
            t.add_row(str(r.position or ""), r.name, state_text(r.state), r.progress(), val, r.settings(), key=r.name)
        if current and current in t.rows:
            t.move_cursor(row=t.get_row_index(current), animate=False)
        queued = sum(r.state == "queued" for r in view.rows)
        runner = f"runner pid {view.runner}" if view.runner else "no runner: r starts one"
        status = Text.assemble((f"{queued} queued", "bold"), "  ", ("paused  " if view.paused else "", "bold yellow"),
                               (runner, "green" if view.runner else "yellow"))
        if not view.rows:
            status.append("   a: queue the preset chosen in Presets")
        self.query_one("#queue-status", Static).update(status)
        s = self.query_one("#sweeps-table", DataTable)
        s.clear()
        for name, spec, results in view.sweeps:
            top = best(results)
            ended = sum(r.state not in ("queued", "running") for r in results)
            s.add_row(name, spec.method, f"{ended}/{len(results)}", top.name if top else "—",
                      f"{spec.metric.name} {top.metric:.4f}" if top else "",
                      " ".join(point_sets(top.params)) if top else "", key=name)
        self.show_detail()

    def selected(self) -> str | None:
        t = self.query_one("#queue-table", DataTable)
        if not t.row_count:
            return None
        try:
            return str(t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value)
        except Exception:
            return None

    def _row(self, name: str | None) -> Row | None:
        return next((r for r in self.view.rows if r.name == name), None)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "queue-table":
            self.show_detail()

    def show_detail(self) -> None:
        r = self._row(self.selected())
        detail = self.query_one("#queue-detail", Static)
        if r is None:
            detail.update(Text("The queue is empty." if not self.view.rows else ""))
            return
        when = time.strftime("%H:%M", time.localtime(r.item.started)) if r.item.started else ""
        text = Text.assemble((r.name, "bold"), "  ", state_text(r.state),
                             f"  started {when}" if when else "", f"  sweep {r.item.sweep}" if r.item.sweep else "")
        if r.note:
            text.append(f"\n{r.note}", style="red" if r.state == "failed" else "")
        detail.update(text)

    # ------------------------------------------------------------------ actions

    def action_refresh(self) -> None:
        self.refresh_queue()

    def action_add(self) -> None:
        self.post_message(self.AddRequested())

    def action_pause(self) -> None:
        if self.view.paused:
            self.post_message(self.CommandRequested(("resume",), "Queue resumed."))
        else:
            self.post_message(self.CommandRequested(("pause",), "Queue paused: nothing more starts."))

    def action_run(self) -> None:
        if self.view.runner:
            self.notify(f"The queue runner (pid {self.view.runner}) is already running.", severity="warning")
            return
        self.post_message(self.CommandRequested(("run", "--detach"), "Queue runner started; it goes on if you quit."))

    def action_move(self, by: int) -> None:
        r = self._row(self.selected())
        if r is None or r.position is None:
            self.notify("Only a queued run can be moved.", severity="warning")
            return
        to = max(1, r.position + by)
        self.post_message(self.CommandRequested(("move", r.name, str(to)), f"{r.name} moved to {to}."))

    def action_remove(self) -> None:
        r = self._row(self.selected())
        if r is None:
            self.notify("No run selected.", severity="warning")
            return
        if r.item.state == "running":
            self.notify(f"{r.name} is running; stop it first (Runs pane), then remove it.", severity="error")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.post_message(self.CommandRequested(("rm", r.name), f"Removed {r.name} from the queue."))

        self.app.push_screen(ConfirmScreen(f"Remove [b]{r.name}[/b] ({r.state}) from the queue?\n\nIts run directory, "
                                           "if it has one, is kept.", "Remove"), answer)
