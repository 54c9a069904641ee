"""Queue / Sweeps pane: the run queue (each run's state, place, progress, what it reached and, for a failed
one, why), the sweeps (trials ended, the best trial and its settings) and the chosen sweep's results (its
trials sorted by its metric, the searched keys as columns), read from ``runs/queue.db`` read-only in a worker
every few seconds. With a shared study database (``workbench tui --storage URL`` or ``$WORKBENCH_STORAGE``) its
sweeps are listed too, marked "shared", each trial with the machine and device it trains on: read in a worker of
their own (``queue_shared``: a read-only connection, the URL shown masked; a database that cannot be read is one
line, and the next read, every few seconds, tries again). It changes nothing itself: adding, pausing, removing,
moving and starting the runner are ``workbench queue ...`` commands, saving the best trial as a preset
``workbench sweep save-best``, a new sweep (``s``: the sweep form) ``workbench sweep PRESET --set-grid ...``, all
run by the app (the runner lives on when the TUI quits); ``c`` asks the Loss curves pane for the best trials' curves
(the top 5, 10 or all of them: ``t`` chooses)."""

from __future__ import annotations

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

from workbench.queue.outcome import others_text
from workbench.queue.runner import runner_pid
from workbench.queue.store import QueueStore
from workbench.queue.sweep_results import Result, best, sweep_states
from workbench.queue.sweep_spec import SweepSpec, point_sets
from workbench.queue.view import Row, rows
from workbench.tui import display
from workbench.tui.screens.dialogs import ConfirmScreen
from workbench.tui.widgets.pane import Pane
from workbench.tui.widgets.queue_shared import SHARED, SharedStudy

QUEUE_STYLE = {"queued": "cyan", "interrupted": "bold yellow", "pruned": "yellow", "refused": "dim",
               "removed": "dim"}
# How many of a sweep's best trials `c` draws together in Loss curves: the first, then each `t` the next (None: all)
TOP_CHOICES: tuple[int | None, ...] = (5, 10, None)


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


def by_metric(results: list[Result], goal: str) -> list[Result]:
    """A sweep's trials sorted by its metric: the ranked (finished) ones best first, then those with a value so
    far (running, pruned, stopped) by it, then the rest in trial order."""
    sign = 1.0 if goal == "minimize" else -1.0
    return sorted(results, key=lambda r: (r.rank is None, r.metric is None, sign * (r.metric or 0.0), r.number))


def short_settings(params: dict) -> str:
    """A trial's searched values with each key's last part (``lr=0.003 warmup_iters=10``): legend-sized."""
    return " ".join(s.split(".", 1)[-1] for s in point_sets(params))


def top_trials(results: list[Result], goal: str, n: int | None = TOP_CHOICES[0]) -> list[tuple[str, str]]:
    """(run id, label) of the best ``n`` trials that trained (finished first, by the metric; None: every one),
    for Loss curves."""
    ran = [r for r in by_metric(results, goal) if r.state not in ("refused", "removed", "queued")]
    return [(r.name, f"{f'#{r.rank} ' if r.rank else ''}{r.name} {short_settings(r.params)}"
                     + ("" if r.state == "finished" else f" ({r.state})")) for r in ran[:n]]


def top_label(n: int | None) -> str:
    """"top 5", "top 10" or "all": how many trials `c` draws."""
    return "all" if n is None else f"top {n}"


def state_text(state: str) -> Text:
    if state in QUEUE_STYLE:
        return Text(state, style=QUEUE_STYLE[state])
    return Text.from_markup(display.state_markup(state))


class QueuePane(Vertical, Pane):
    MAIN_WIDGET = "#queue-table"
    BINDINGS = [
        Binding("a", "add", "Add preset"),
        Binding("s", "sweep", "New sweep"),
        Binding("p", "pause", "Pause/resume"),
        Binding("r", "run", "Run queue"),
        Binding("shift+up", "move(-1)", "Up", show=False),
        Binding("shift+down", "move(1)", "Down", show=False),
        Binding("d", "remove", "Remove"),
        Binding("c", "curves", "Sweep curves"),
        Binding("t", "cycle_top", "Top 5/10/all"),
        Binding("b", "save_best", "Best→preset"),
        Binding("f", "refresh", "Refresh", show=False),
    ]

    @dataclass
    class AddRequested(Message):
        """Queue a run of the preset chosen in the Presets pane (``workbench queue add``)."""

    @dataclass
    class SweepRequested(Message):
        """Open the sweep form on the preset chosen in the Presets pane (``workbench sweep PRESET ...``)."""

    @dataclass
    class CommandRequested(Message):
        """Run ``workbench queue ARGS...`` (pause, resume, rm, move, run --detach); ``done`` is said after."""
        args: tuple[str, ...]
        done: str

    @dataclass
    class SweepCurvesRequested(Message):
        """Draw ``runs`` (run id, label) together in Loss curves, by the sweep's ``metric``."""
        title: str
        runs: list[tuple[str, str]]
        metric: str

    @dataclass
    class SaveBestRequested(Message):
        """Keep the best trial of ``sweep`` as a user preset (``workbench sweep save-best SWEEP``)."""
        sweep: str

    @dataclass
    class Read(Message):
        view: QueueView

    @dataclass
    class SharedRead(Message):
        """The shared study database's sweeps, or why they could not be read (one line)."""
        sweeps: list[tuple[str, SweepSpec, list[Result]]]
        error: str

    def __init__(self, runs_dir: Path, interval: float = 2.0, storage: str | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.runs_dir = Path(runs_dir)
        self.interval = interval
        self.study = SharedStudy(storage)   # the shared study database: given, else $WORKBENCH_STORAGE
        self.view = QueueView([], [], False, None)
        self.top_n: int | None = TOP_CHOICES[0]   # how many of the best trials `c` draws (None: all)
        self._choose: str | None = None   # a sweep to move the sweeps table's cursor to once it is listed

    def compose(self) -> ComposeResult:
        yield Static("", id="queue-status")
        yield Static("", id="queue-shared")
        yield DataTable(id="queue-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="queue-detail")
        yield DataTable(id="sweeps-table", cursor_type="row")
        yield DataTable(id="sweep-results", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        t = self.query_one("#queue-table", DataTable)
        t.add_columns("#", "run", "state", "progress", "val", "settings", "where")
        self.query_one("#queue-shared", Static).display = self.study.url is not None
        t.border_title = "queue"
        s = self.query_one("#sweeps-table", DataTable)
        s.add_columns("sweep", "method", "trials", "best", "metric", "best settings")
        s.border_title = "sweeps"
        self.query_one("#sweep-results", DataTable).border_title = "sweep results"
        self.refresh_queue()
        self.set_interval(self.interval, self.refresh_queue)
        if self.study.url is not None:
            self._shared_line(f"reading {self.study.masked()} ...")
            self.refresh_shared()
            self.set_interval(max(self.interval, 2.0), self.refresh_shared)

    def tab_shown(self) -> None:
        self.refresh_queue()
        self.refresh_shared()

    @work(thread=True, exclusive=True, group="queue-read", exit_on_error=False)
    def refresh_queue(self) -> None:
        self.post_message(self.Read(read_queue(self.runs_dir)))

    def refresh_shared(self) -> None:
        """Read the shared study database in a worker; none is started while one still waits on the database."""
        if self.study.url is None or self.study.busy:
            return
        self.study.busy = True
        self._read_shared()

    @work(thread=True, group="queue-shared", exit_on_error=False)
    def _read_shared(self) -> None:
        self.post_message(self.SharedRead(*self.study.read()))

    def _shared_line(self, text: str, style: str = "") -> None:
        self.query_one("#queue-shared", Static).update(Text(text, style=style))

    @on(Read)
    def _read(self, msg: Read) -> None:
        msg.stop()
        self.show(msg.view)

    @on(SharedRead)
    def _read_shared_done(self, msg: SharedRead) -> None:
        msg.stop()
        self._shared_line(*self.study.took(msg.sweeps, msg.error, max(self.interval, 2.0)))
        self.show_sweeps()

    def show(self, view: QueueView) -> None:
        self.view = view
        t = self.query_one("#queue-table", DataTable)
        current = self.selected()
        t.clear()
        for r in view.rows:
            val = f"{r.item.metric:.4f}" if r.item.metric is not None else ""
            t.add_row(str(r.position or ""), r.name, state_text(r.state), r.progress(), val, r.settings(),
                      r.item.place or "", key=r.name)
        if current and current in t.rows:
            t.move_cursor(row=t.get_row_index(current), animate=False)
        queued = sum(r.state == "queued" for r in view.rows)
        runner = f"runner pid {view.runner}" if view.runner else "no runner: r starts one"
        status = Text.assemble((f"{queued} queued", "bold"), "  ", ("paused  " if view.paused else "", "bold yellow"),
                               (runner, "green" if view.runner else "yellow"))
        if not view.rows:
            status.append("   a: queue the preset chosen in Presets; s: a sweep of it")
        self.query_one("#queue-status", Static).update(status)
        self.show_sweeps()

    def all_sweeps(self) -> list[tuple[str, str, SweepSpec, list[Result]]]:
        """(key, shown name, spec, results): this runs directory's sweeps, then the shared database's."""
        return ([(n, n, sp, r) for n, sp, r in self.view.sweeps]
                + [(SHARED + n, f"{n} (shared)", sp, r) for n, sp, r in self.study.sweeps])

    def show_sweeps(self) -> None:
        s = self.query_one("#sweeps-table", DataTable)
        chosen = self.sweep_chosen()
        if self._choose and any(sw[0] == self._choose for sw in self.view.sweeps):
            chosen, self._choose = self._choose, None
        s.clear()
        for key, name, spec, results in self.all_sweeps():
            top = best(results)
            ended = sum(r.state not in ("queued", "running") for r in results)
            # a best that trained too little, or beside other processes, is named as such (sweep show's caveats)
            flag = " (too short)" if top and top.short else " (beside others)" if top and top.beside else ""
            s.add_row(name, spec.method, f"{ended}/{len(results)}", Text(top.name + flag, style="yellow" if flag
                                                                          else "") if top else "—",
                      f"{spec.metric.name} {top.metric:.4f}" if top else "",
                      " ".join(point_sets(top.params)) if top else "", key=key)
        if chosen and chosen in s.rows:
            s.move_cursor(row=s.get_row_index(chosen), animate=False)
        self.show_detail()
        self.show_results()

    def sweep_chosen(self) -> str | None:
        """The sweep under the sweeps table's cursor: the one the results table shows and c and b act on."""
        return self.cursor_key("#sweeps-table")

    def _sweep(self, key: str | None) -> tuple[str, SweepSpec, list[Result]] | None:
        """The sweep of a sweeps-table key: a local one by its name, a shared one by ``shared:NAME``."""
        if key and key.startswith(SHARED):
            return next((sw for sw in self.study.sweeps if sw[0] == key[len(SHARED):]), None)
        return next((sw for sw in self.view.sweeps if sw[0] == key), None)

    def show_results(self) -> None:
        """The chosen sweep's trials sorted by its metric, a column per searched key."""
        t = self.query_one("#sweep-results", DataTable)
        row = t.cursor_row
        t.clear(columns=True)
        sw = self._sweep(self.sweep_chosen())
        if sw is None:
            t.border_title = "sweep results"
            return
        name, spec, results = sw
        keys = [p.key for p in spec.params]
        t.add_columns("rank", "trial", *keys, spec.metric.name, "state", "seconds", "where", "others", "note")
        for r in by_metric(results, spec.metric.goal):
            t.add_row(str(r.rank or ""), r.name, *(_value(r.params.get(k)) for k in keys),
                      "" if r.metric is None else f"{r.metric:.4f}", state_text(r.state),
                      "" if r.seconds is None else f"{r.seconds:.0f}", r.where, others_text(r.others_cpu),
                      Text("; ".join(n for n in (r.short, r.beside, r.note) if n),
                           style="yellow" if r.beside or r.short else ""),
                      key=r.name)
        if 0 < row < t.row_count:
            t.move_cursor(row=row, animate=False)
        if self.shared_chosen():
            t.border_title = (f"sweep {name} (shared: {self.study.masked()}): {len(results)} trials by "
                              f"{spec.metric.name} ({spec.metric.goal}); where: the machine and device each trains on")
            return
        t.border_title = (f"sweep {name}: {len(results)} trials by {spec.metric.name} ({spec.metric.goal}); "
                          f"c: {top_label(self.top_n)} in Loss curves (t: {top_label(self.next_top())}), "
                          "b: save the best as a preset")

    def shared_chosen(self) -> bool:
        return (self.sweep_chosen() or "").startswith(SHARED)

    def next_top(self) -> int | None:
        return TOP_CHOICES[(TOP_CHOICES.index(self.top_n) + 1) % len(TOP_CHOICES)]

    def selected(self) -> str | None:
        return self.cursor_key("#queue-table")

    def _row(self, name: str | None) -> Row | None:
        return next((r for r in self.view.rows if r.name == name), None)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "queue-table":
            self.show_detail()
            r = self._row(self.selected())
            s = self.query_one("#sweeps-table", DataTable)
            if r is not None and r.item.sweep is not None and r.item.sweep in s.rows \
                    and r.item.sweep != self.sweep_chosen():
                s.move_cursor(row=s.get_row_index(r.item.sweep), animate=False)  # a trial: its sweep's results
        elif event.data_table.id == "sweeps-table":
            self.show_results()

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

    def action_sweep(self) -> None:
        self.post_message(self.SweepRequested())

    def choose_sweep(self, name: str) -> None:
        """Show sweep ``name`` (just queued) in the results table once it is read."""
        self._choose = name
        self.refresh_queue()

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

    def _chosen_or_say(self) -> tuple[str, SweepSpec, list[Result]] | None:
        sw = self._sweep(self.sweep_chosen())
        if sw is None:
            self.notify("No sweep yet: `workbench sweep PRESET --set-grid KEY=V1,V2` makes one.", severity="warning")
        return sw

    def _shared_says(self, what: str) -> bool:
        """A shared sweep's runs are on the machines that trained them: ``what`` is said not to work on it."""
        if not self.shared_chosen():
            return False
        self.notify(f"{what} works on this runs directory's sweeps; a shared sweep's runs are on the machines that "
                    "trained them (`workbench sweep show NAME --storage URL` ranks its trials)", severity="warning")
        return True

    def action_curves(self) -> None:
        if (sw := self._chosen_or_say()) is None or self._shared_says("c (the best trials' curves)"):
            return
        name, spec, results = sw
        runs = top_trials(results, spec.metric.goal, self.top_n)
        if not runs:
            self.notify(f"No trial of sweep {name} has trained yet.", severity="warning")
            return
        title = f"sweep {name}: top {len(runs)} of {len(results)} trials by {spec.metric.name}"
        self.post_message(self.SweepCurvesRequested(title, runs, spec.metric.name))

    def action_cycle_top(self) -> None:
        """How many of the best trials `c` draws: 5, 10, all, then 5 again."""
        self.top_n = self.next_top()
        self.show_results()
        which = f"the {top_label(self.top_n)} trials" if self.top_n else "all the trials"
        self.notify(f"c now draws {which} of the sweep in Loss curves (t: {top_label(self.next_top())}).")

    def action_save_best(self) -> None:
        if (sw := self._chosen_or_say()) is None or self._shared_says("b (save the best as a preset)"):
            return
        if best(sw[2]) is None:
            self.notify(f"Sweep {sw[0]} has no best trial yet: none has finished with {sw[1].metric.name}.",
                        severity="warning")
            return
        self.post_message(self.SaveBestRequested(sw[0]))

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


def _value(v: object) -> str:
    if v is None:
        return ""
    return f"{v:.6g}" if isinstance(v, float) else str(v)
