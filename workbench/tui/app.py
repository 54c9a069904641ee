"""The workbench TUI: hardware, presets, live training, loss curves, sampling, run browser.

The app never imports torch. It starts, resumes and stops trainers as subprocesses of the CLI
(``workbench.tui.launcher``) and learns everything else from the run directories: a single tailer
thread (``workbench.tui.watcher``) reads new bytes of ``metrics.jsonl`` / ``train.log`` and posts
messages; slower reads (run summaries, hardware) run in thread workers. Closing the app stops
nothing.

Each pane acts on its own keys and tells the app what it wants by the messages nested in its class
(``RunsPane.SampleRequested``) or the app-wide requests in ``messages`` (``ResumeRun``); the app
routes them: it switches tabs, follows runs, and runs each operation in a worker of its own.
"""

from __future__ import annotations

import os
from typing import Callable

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, TabPane
from textual.worker import Worker, WorkerState, get_current_worker

from workbench.analysis.summary import RunSummary, summarize_run
from workbench.rundir import LIVE_STATES, RunError, delete_run, iter_run_dirs, runs_root
from workbench.tui import hwinfo, launcher
from workbench.tui.launcher import RunRequest
from workbench.tui.messages import ResumeRun, RunsListed, RunStarted, RunUpdated, StartRun, StopRun
from workbench.tui.palette import WorkbenchCommands
from workbench.tui.rundata import RunData
from workbench.tui.screens.dialogs import ConfirmScreen
from workbench.tui.screens.new_run import NewRunScreen
from workbench.tui.watcher import RunWatcher
from workbench.tui.widgets.curves import CurvesPane
from workbench.tui.widgets.hardware import HardwarePane
from workbench.tui.widgets.monitor import MonitorPane
from workbench.tui.widgets.presets import PresetsPane
from workbench.tui.widgets.queue import QueuePane
from workbench.tui.widgets.runs import RunsPane
from workbench.tui.widgets.sample import SamplePane
from workbench.tui.widgets.tabs import PaneTabs


class WorkbenchApp(App[int]):
    CSS_PATH = "workbench.tcss"
    TITLE = "workbench"
    COMMANDS = App.COMMANDS | {WorkbenchCommands}
    TAB_LABELS = {"hardware": "Hardware", "presets": "Presets", "train": "Train",
                  "curves": "Loss curves", "sample": "Sample", "runs": "Runs", "queue": "Queue"}
    BINDINGS = [
        Binding("1", "show_tab('hardware')", "Hardware", show=False),
        Binding("2", "show_tab('presets')", "Presets", show=False),
        Binding("3", "show_tab('train')", "Train", show=False),
        Binding("4", "show_tab('curves')", "Curves", show=False),
        Binding("5", "show_tab('sample')", "Sample", show=False),
        Binding("6", "show_tab('runs')", "Runs", show=False),
        Binding("7", "show_tab('queue')", "Queue", show=False),
        Binding("n", "new_run", "New run"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, runs_dir: str | os.PathLike | None = None, hardware_info: dict | None = None,
                 watch_interval: float = 2.0, list_interval: float = 5.0, hardware_interval: float = 3.0,
                 initial_tab: str | None = None):
        """``hardware_info`` replaces live detection (tests and snapshots); intervals in seconds."""
        super().__init__()
        self.runs_dir = runs_root(runs_dir)
        self.injected_hardware = hardware_info
        self.machine_info: dict | None = hardware_info  # the latest hardware read: what the new-run form estimates for
        self.recommended: tuple[str, str] | None = (
            hwinfo.recommend(hardware_info) if hardware_info else None)
        self.watch_interval = watch_interval
        self.list_interval = list_interval
        self.hardware_interval = hardware_interval
        self.initial_tab = initial_tab
        self.run_data: dict[str, RunData] = {}
        self.summaries: list[RunSummary] = []
        self.monitored: str | None = None
        self.watcher = RunWatcher(self.runs_dir, self.post_message, interval=watch_interval)
        self._listed_once = False
        self._pending_sample_run: str | None = None  # a run started here, for the Sample pane

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        initial = self.initial_tab or ("train" if self._has_runs() else "hardware")
        with PaneTabs(initial=initial, id="tabs"):
            with TabPane("1 Hardware", id="hardware"):
                yield HardwarePane(self.injected_hardware, self.hardware_interval, id="hardware-pane")
            with TabPane("2 Presets", id="presets"):
                yield PresetsPane(id="presets-pane")
            with TabPane("3 Train", id="train"):
                yield MonitorPane(self.runs_dir, id="monitor-pane")
            with TabPane("4 Loss curves", id="curves"):
                yield CurvesPane(self.run_data, max(0.5, self.watch_interval), runs_dir=self.runs_dir,
                                 id="curves-pane")
            with TabPane("5 Sample", id="sample"):
                yield SamplePane(self.runs_dir, id="sample-pane")
            with TabPane("6 Runs", id="runs"):
                yield RunsPane(id="runs-pane")
            with TabPane("7 Queue", id="queue"):
                yield QueuePane(self.runs_dir, max(0.5, self.watch_interval), id="queue-pane")
        yield Footer()

    def _has_runs(self) -> bool:
        return next(iter_run_dirs(self.runs_dir), None) is not None

    def _panes_gone(self) -> bool:
        """True while the app shuts down: a worker's message may still arrive after the panes are
        removed, and handling it must not raise (it would print a traceback on quit)."""
        return not self.is_running or not self.screen_stack or not self.query(PaneTabs)

    def on_mount(self) -> None:
        self.sub_title = str(self.runs_dir)
        self._watch_worker()
        self.action_refresh_runs()
        self.set_interval(self.list_interval, self.action_refresh_runs)
        tabs = self.query_one(PaneTabs)
        tabs.focus_pane(tabs.active)

    def action_show_tab(self, tab: str) -> None:
        self.query_one(PaneTabs).show(tab)

    # ------------------------------------------------------------------ the tailer

    @work(thread=True, exclusive=True, group="watch", exit_on_error=False)
    def _watch_worker(self) -> None:
        worker = get_current_worker()
        self.watcher.run(lambda: worker.is_cancelled)

    def on_unmount(self) -> None:
        self.watcher.stopped.set()
        self.watcher.wake.set()

    def on_run_updated(self, msg: RunUpdated) -> None:
        if self._panes_gone():
            return
        d = self.run_data.setdefault(msg.run_id, RunData(msg.run_id))
        prev_state = d.state
        d.status = msg.status
        d.feed(msg.records)
        if msg.task_file is not None:
            d.set_task_file(msg.task_file)
        if msg.run_id == self.monitored:
            mon = self.query_one(MonitorPane)
            mon.show_run(d)
            mon.append_log(msg.log_lines)
        if msg.records or msg.task_file is not None:
            self.query_one(CurvesPane).records_added(msg.run_id)
        if prev_state != d.state and prev_state != "?":
            self.action_refresh_runs()  # the browser should show the new state now

    @on(CurvesPane.RunsTicked)
    def _watch_for_curves(self, msg: CurvesPane.RunsTicked) -> None:
        for rid in msg.run_ids:  # (ticking a run in the pane, or select_run() below, posts this)
            self.run_data.setdefault(rid, RunData(rid))
            self.watcher.watch(rid)

    # ------------------------------------------------------------------ runs list

    @on(RunsPane.RefreshRequested)
    def action_refresh_runs(self) -> None:
        self._list_runs()

    @work(thread=True, exclusive=True, group="list", exit_on_error=False)
    def _list_runs(self) -> None:
        runs = []
        for p in iter_run_dirs(self.runs_dir):
            try:
                runs.append(summarize_run(p))
            except Exception:
                continue
        # newest first: when each was made (an imported model and a branch too, which have no start time)
        runs.sort(key=lambda s: (s.created, s.id), reverse=True)
        self.post_message(RunsListed(runs))

    def on_runs_listed(self, msg: RunsListed) -> None:
        if self._panes_gone():
            return
        self.summaries = msg.runs
        ids = [s.id for s in msg.runs]
        for rid in list(self.run_data):  # a deleted run is no longer followed
            if rid not in ids:
                self.watcher.unwatch(rid)
                self.run_data.pop(rid, None)
                if rid == self.monitored:
                    self.monitored = None
        if self.monitored is None and msg.runs:
            live = [s for s in msg.runs if s.state in LIVE_STATES]
            self.monitor((live or msg.runs)[0].id, switch=False)
        self.query_one(RunsPane).set_runs(msg.runs)
        self.query_one(MonitorPane).set_runs(ids, self.monitored, self._presets())
        self.query_one(CurvesPane).set_runs(ids)
        sample = self.query_one(SamplePane)
        sample.set_runs(ids)
        if not self._listed_once:
            self._listed_once = True
            if self.monitored:
                self.query_one(CurvesPane).select_run(self.monitored)
        pending = self._pending_sample_run
        if pending in ids:
            self._pending_sample_run = None
            sample.choose(pending)
        elif self.monitored and sample.run_id is None:
            sample.choose(self.monitored)  # e.g. the first run, started from this TUI
        self.query_one(PresetsPane).set_measured(msg.runs)

    def summary(self, run_id: str) -> RunSummary | None:
        return next((s for s in self.summaries if s.id == run_id), None)

    def _presets(self) -> dict[str, str]:
        return {s.id: s.preset for s in self.summaries}

    # ------------------------------------------------------------------ routing

    def monitor(self, run_id: str, switch: bool = True) -> None:
        """Follow ``run_id`` in the Train pane (with its train.log)."""
        changed = run_id != self.monitored
        self.monitored = run_id
        d = self.run_data.setdefault(run_id, RunData(run_id))
        if changed:  # the pane is cleared, so its train.log tail starts over
            self.watcher.watch(run_id, with_log=True, fresh_log=True)
        mon = self.query_one(MonitorPane)
        mon.set_runs([s.id for s in self.summaries] or [run_id], run_id, self._presets())
        mon.show_run(d, reset=changed)
        if switch:
            self.action_show_tab("train")

    @on(MonitorPane.RunChosen)
    def _run_chosen(self, msg: MonitorPane.RunChosen) -> None:
        if msg.run_id != self.monitored:
            self.monitor(msg.run_id, switch=False)

    @on(RunsPane.MonitorRequested)
    def _monitor_requested(self, msg: RunsPane.MonitorRequested) -> None:
        self.monitor(msg.run_id)

    @on(MonitorPane.HealthChecked)
    def _health_checked(self, msg: MonitorPane.HealthChecked) -> None:
        if not self._panes_gone():
            self.query_one(PaneTabs).mark("train", *msg.marker)  # the run shown has findings while it trains

    @on(MonitorPane.CurvesRequested)
    @on(RunsPane.CurvesRequested)
    def _curves_requested(self, msg: MonitorPane.CurvesRequested | RunsPane.CurvesRequested) -> None:
        self.open_curves(msg.run_id)

    def open_curves(self, run_id: str) -> None:
        curves = self.query_one(CurvesPane)
        curves.select_run(run_id)
        self.action_show_tab("curves")
        curves.redraw()

    @on(RunsPane.SampleRequested)
    def _sample_requested(self, msg: RunsPane.SampleRequested) -> None:
        self.open_sample(msg.run_id, msg.checkpoint)

    def open_sample(self, run_id: str, checkpoint: str | None = None) -> None:
        sample = self.query_one(SamplePane)
        sample.set_runs([s.id for s in self.summaries] or [run_id], run_id)
        sample.choose(run_id, checkpoint)
        self.action_show_tab("sample")

    def action_generate(self) -> None:
        """Sample from the Sample pane's checkpoints (the pane runs the samplers)."""
        self.query_one(SamplePane).action_generate()

    # ------------------------------------------------------------------ start, resume, stop, delete

    @on(HardwarePane.TrainRequested)
    @on(PresetsPane.TrainRequested)
    def _train_requested(self, msg: HardwarePane.TrainRequested | PresetsPane.TrainRequested) -> None:
        self.action_new_run(msg.preset)

    @on(RunsPane.FineTuneRequested)
    def _fine_tune_requested(self, msg: RunsPane.FineTuneRequested) -> None:
        self.action_new_run(init_from=msg.init_from)

    async def action_quit(self) -> None:
        """Quit; unsaved preset edits (valid or not) would be lost, so the user is asked first."""
        drafts = [] if self._panes_gone() else self.query_one(PresetsPane).unsaved()
        if not drafts:
            self.exit()
            return
        which = ", ".join(drafts)
        self.push_screen(ConfirmScreen(f"Quit and lose the unsaved changes to {which}? (n, then ctrl+s in Presets "
                                       "saves a valid one)", "Quit"),
                         lambda yes: self.exit() if yes else None)

    def action_new_run(self, preset: str | None = None, overrides: str = "", init_from: str = "") -> None:
        preset = preset or (self.recommended[0] if self.recommended else None)

        def done(req: RunRequest | None) -> None:
            if req is not None:
                self.post_message(StartRun(req))

        self.push_screen(NewRunScreen(preset, overrides, self.machine_info, self.runs_dir, init_from), done)

    def action_train_recommended(self) -> None:
        if not self.recommended:
            self.notify("Still reading the hardware…", severity="warning")
            return
        self.action_new_run(self.recommended[0])

    # Each operation: a request message, answered by a thread worker of its own group (the CLI call
    # blocks). notify() only posts a message, so the workers call it directly.

    @on(StartRun)
    @work(thread=True, group="start", exit_on_error=False)
    def _start(self, msg: StartRun) -> None:
        self.notify(f"Starting a {msg.request.preset} run…")
        if (rid := self._cli("train", launcher.start_run, self.runs_dir, msg.request)) is not None:
            self.post_message(RunStarted(rid, "started"))

    @on(ResumeRun)
    @work(thread=True, group="resume", exit_on_error=False)
    def _resume(self, msg: ResumeRun) -> None:
        s = self.summary(msg.run_id)
        if msg.checkpoint == "latest" and s is not None and s.state in LIVE_STATES:
            self.notify(f"{msg.run_id} is already running.", severity="warning")
            return
        more = f" for {msg.more:,} more steps" if msg.more else ""
        self.notify(f"Resuming {msg.run_id} from checkpoint {msg.checkpoint}{more}…")
        rid = self._cli("resume", launcher.resume_run, self.runs_dir, msg.run_id, msg.checkpoint, 120, msg.more)
        if rid is not None:
            self.post_message(RunStarted(rid, "resumed" if rid == msg.run_id else f"branched from {msg.run_id}"))

    @on(StopRun)
    @work(thread=True, group="stop", exit_on_error=False)
    def _stop(self, msg: StopRun) -> None:
        self.notify(f"Stopping {msg.run_id}: the trainer saves a checkpoint, then exits…")
        if (out := self._cli("stop", launcher.stop_run, self.runs_dir, msg.run_id)) is not None:
            self.notify(out or f"Sent stop to {msg.run_id}.")
            self._list_runs()

    @on(RunsPane.DeleteRequested)
    @work(thread=True, group="delete", exit_on_error=False)
    def _delete(self, msg: RunsPane.DeleteRequested) -> None:
        try:
            delete_run(self.runs_dir, msg.run_dir, msg.checkpoint)
        except RunError as e:
            self.notify(str(e), severity="error")
            return
        self.notify(f"Deleted {msg.what}.")
        self._list_runs()

    # The queue: the pane reads queue.db itself; every change is a `workbench queue` command, so the TUI never
    # writes the database and a runner it starts lives on when it quits.

    @on(QueuePane.AddRequested)
    def _queue_add_requested(self, msg: QueuePane.AddRequested) -> None:
        preset = self.query_one(PresetsPane).current or (self.recommended[0] if self.recommended else None)
        if not preset:
            self.notify("Choose a preset in the Presets pane (2) first.", severity="warning")
            return
        self._queue_command(("add", preset), f"Queued a {preset} run.")

    @on(QueuePane.CommandRequested)
    def _queue_command_requested(self, msg: QueuePane.CommandRequested) -> None:
        self._queue_command(msg.args, msg.done)

    @work(thread=True, group="queue", exit_on_error=False)
    def _queue_command(self, args: tuple[str, ...], done: str) -> None:
        if self._cli(f"queue {args[0]}", launcher.queue_command, self.runs_dir, *args) is not None:
            self.notify(done)
            self.call_from_thread(self._reread_queue)

    def _reread_queue(self) -> None:
        if not self._panes_gone():
            self.query_one(QueuePane).refresh_queue()

    def _cli(self, what: str, call: Callable[..., str], *args) -> str | None:
        """Run a launcher call (in a worker's thread): its output, or None once the user is told why
        ``what`` failed."""
        try:
            return call(*args)
        except launcher.LaunchError as e:
            self.notify(f"{what} failed: {e}", severity="error", timeout=10)
            return None

    def on_run_started(self, msg: RunStarted) -> None:
        if self._panes_gone():
            return
        if not msg.run_id or not (self.runs_dir / msg.run_id).is_dir():
            self.notify(f"The trainer did not say which run it started ({msg.run_id!r}).", severity="error")
            return
        self.notify(f"Run {msg.run_id} {msg.how}; it keeps running if you close workbench.")
        self.query_one(CurvesPane).select_run(msg.run_id)  # its loss is what the user wants to see next
        self.monitor(msg.run_id)
        self.action_refresh_runs()
        self._pending_sample_run = msg.run_id  # and its checkpoints in Sample, once it is listed

    # ------------------------------------------------------------------ hardware

    @on(HardwarePane.Read)
    def _hardware_read(self, msg: HardwarePane.Read) -> None:
        self.recommended = msg.recommended
        self.machine_info = msg.info

    def action_refresh_hardware(self) -> None:
        self.query_one(HardwarePane).read_hardware()

    # ------------------------------------------------------------------ errors

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.notify(f"{event.worker.name or event.worker.group} failed: {event.worker.error!r}",
                        severity="error", timeout=10)


def run_tui(runs_dir: str | None = None) -> int:
    """Entry point for bare `workbench`: open the TUI on ``runs_dir`` (default ./runs)."""
    app = WorkbenchApp(runs_dir)
    app.run()
    return app.return_code or 0
