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
from typing import TYPE_CHECKING, Generic, TypeVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, TabPane
from textual.worker import Worker, WorkerState, get_current_worker

from workbench.analysis.summary import RunSummary, list_runs
from workbench.machine.detect import calibration
from workbench.rundir import LIVE_STATES, iter_run_dirs, runs_root
from workbench.tui import hwinfo
from workbench.tui.launcher import RunRequest
from workbench.tui.messages import RunsListed, RunUpdated, StartRun
from workbench.tui.operations import RunOperations
from workbench.tui.rundata import RunData
from workbench.tui.screens.dialogs import ConfirmScreen
from workbench.tui.watcher import RunWatcher
from workbench.tui.widgets.pane import Pane
from workbench.tui.widgets.tabs import PaneTabs

if TYPE_CHECKING:  # the panes' modules load with their panes (see _make_pane)
    from textual.command import Provider

    from workbench.tui.widgets.curves import CurvesPane
    from workbench.tui.widgets.hardware import HardwarePane
    from workbench.tui.widgets.monitor import MonitorPane
    from workbench.tui.widgets.presets import PresetsPane
    from workbench.tui.widgets.queue import QueuePane
    from workbench.tui.widgets.runs import RunsPane
    from workbench.tui.widgets.sample import SamplePane


def _palette() -> "type[Provider]":
    """The command palette's provider, loaded when the palette first opens (it imports every pane)."""
    from workbench.tui.palette import WorkbenchCommands
    return WorkbenchCommands


P = TypeVar("P", bound=Pane)


class PaneById(Generic[P]):
    """An app attribute that is the pane of this id, typed (its class is imported only where the pane is made,
    see ``_make_pane``)."""

    def __init__(self, pane_id: str):
        self.selector = f"#{pane_id}"

    def __get__(self, app: App | None, owner: type | None = None) -> P:
        if app is None:  # looked up on the class
            return self  # type: ignore[return-value]  # (the descriptor itself)
        return app.query_one(self.selector)  # type: ignore[return-value]  # (a Widget: the P _make_pane made)


class WorkbenchApp(RunOperations, App[int]):
    CSS_PATH = "workbench.tcss"
    TITLE = "workbench"
    COMMANDS = App.COMMANDS | {_palette}
    TAB_LABELS = {"hardware": "Hardware", "presets": "Presets", "train": "Train",
                  "curves": "Loss curves", "sample": "Sample", "runs": "Runs", "queue": "Queue"}
    OTHER_PANES_WAIT_S = 1.0  # the longest the other panes wait for the first hardware reading
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
        self.panes_ready = False  # every pane mounted (the first screen's comes first: compose)
        self._mounting_panes = False

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        # Only the first screen's pane is made before the first frame: the others (their modules, their
        # widgets and styles) follow right after it, so a new user sees the machine in well under a
        # second (bench/tui_first_paint.py). The runs are listed, and followed, once every pane is there.
        initial = self.initial_tab or ("train" if self._has_runs() else "hardware")
        with PaneTabs(initial=initial, id="tabs"):
            for n, (tab, label) in enumerate(self.TAB_LABELS.items(), 1):
                with TabPane(f"{n} {label}", id=tab):
                    if tab == initial:
                        yield self._make_pane(tab)
        yield Footer()

    def _make_pane(self, tab: str) -> Pane:
        """The pane of ``tab`` (its module imported here, when the pane is made)."""
        # lazily: the first frame waits for its own pane's module only; the others load after it
        if tab == "hardware":
            from workbench.tui.widgets.hardware import HardwarePane
            return HardwarePane(self.injected_hardware, self.hardware_interval, id="hardware-pane")
        if tab == "presets":
            from workbench.tui.widgets.presets import PresetsPane
            return PresetsPane(id="presets-pane")
        if tab == "train":
            from workbench.tui.widgets.monitor import MonitorPane
            return MonitorPane(self.runs_dir, id="monitor-pane")
        if tab == "curves":
            from workbench.tui.widgets.curves import CurvesPane
            return CurvesPane(self.run_data, max(0.5, self.watch_interval), runs_dir=self.runs_dir, id="curves-pane")
        if tab == "sample":
            from workbench.tui.widgets.sample import SamplePane
            return SamplePane(self.runs_dir, id="sample-pane")
        if tab == "runs":
            from workbench.tui.widgets.runs import RunsPane
            return RunsPane(id="runs-pane")
        if tab == "queue":
            from workbench.tui.widgets.queue import QueuePane
            return QueuePane(self.runs_dir, max(0.5, self.watch_interval), id="queue-pane")
        raise ValueError(f"no tab {tab!r}")

    async def _mount_other_panes(self) -> None:
        """After the first frame: every other pane, then the run list and the tailer that feed them."""
        if self._mounting_panes:
            return
        self._mounting_panes = True
        tabs = self.query_one(PaneTabs)
        for tab in self.TAB_LABELS:
            if tabs.pane(tab) is None:
                await tabs.get_pane(tab).mount(self._make_pane(tab))
        self.panes_ready = True
        if self.screen is tabs.screen and (self.focused is None or self.focused.screen is not self.screen):
            tabs.focus_pane(tabs.active)  # a tab key pressed before its pane was there
        self._watch_worker()
        self.action_refresh_runs()
        self.set_interval(self.list_interval, self.action_refresh_runs)

    hardware_pane: PaneById[HardwarePane] = PaneById("hardware-pane")
    presets_pane: PaneById[PresetsPane] = PaneById("presets-pane")
    monitor_pane: PaneById[MonitorPane] = PaneById("monitor-pane")
    curves_pane: PaneById[CurvesPane] = PaneById("curves-pane")
    sample_pane: PaneById[SamplePane] = PaneById("sample-pane")
    runs_pane: PaneById[RunsPane] = PaneById("runs-pane")
    queue_pane: PaneById[QueuePane] = PaneById("queue-pane")

    def _has_runs(self) -> bool:
        return next(iter_run_dirs(self.runs_dir), None) is not None

    def _panes_gone(self) -> bool:
        """True while the app shuts down: a worker's message may still arrive after the panes are
        removed, and handling it must not raise (it would print a traceback on quit)."""
        return not self.is_running or not self.screen_stack or not self.query(PaneTabs)

    def on_mount(self) -> None:
        self.sub_title = str(self.runs_dir)
        tabs = self.query_one(PaneTabs)
        tabs.focus_pane(tabs.active)
        if tabs.active == "hardware" and self.injected_hardware is None:
            # the machine first (its reading is a thread's: making the other panes would hold it back),
            # then the rest; on_hardware_pane_read starts them, or this, should the reading hang
            self.set_timer(self.OTHER_PANES_WAIT_S, self._mount_other_panes)
        else:
            self.call_after_refresh(self._mount_other_panes)

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
            mon = self.monitor_pane
            mon.show_run(d)
            mon.append_log(msg.log_lines)
        if msg.records or msg.task_file is not None:
            self.curves_pane.records_added(msg.run_id)
        if prev_state != d.state and prev_state != "?":
            self.action_refresh_runs()  # the browser should show the new state now

    def on_curves_pane_runs_ticked(self, msg: CurvesPane.RunsTicked) -> None:
        for rid in msg.run_ids:  # (ticking a run in the pane, or select_run() below, posts this)
            self.run_data.setdefault(rid, RunData(rid))
            self.watcher.watch(rid)

    # ------------------------------------------------------------------ runs list

    def on_runs_pane_refresh_requested(self) -> None:
        self.action_refresh_runs()

    def action_refresh_runs(self) -> None:
        if self.panes_ready:  # (the list feeds every pane)
            self._list_runs()

    @work(thread=True, exclusive=True, group="list", exit_on_error=False)
    def _list_runs(self) -> None:
        self.post_message(RunsListed(list_runs(self.runs_dir)))  # newest first, as `workbench runs`

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
        self.runs_pane.set_runs(msg.runs)
        self.monitor_pane.set_runs(ids, self.monitored, self._presets())
        self.curves_pane.set_runs(ids)
        sample = self.sample_pane
        sample.set_runs(ids)
        if not self._listed_once:
            self._listed_once = True
            if self.monitored and not self.curves_pane.overlay:  # a sweep drawn before the first listing stays
                self.curves_pane.select_run(self.monitored)
        pending = self._pending_sample_run
        if pending in ids:
            self._pending_sample_run = None
            sample.choose(pending)
        elif self.monitored and sample.run_id is None:
            sample.choose(self.monitored)  # e.g. the first run, started from this TUI
        self.presets_pane.set_measured(msg.runs)

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
        mon = self.monitor_pane
        mon.set_runs([s.id for s in self.summaries] or [run_id], run_id, self._presets())
        mon.show_run(d, reset=changed)
        if switch:
            self.action_show_tab("train")

    def on_monitor_pane_run_chosen(self, msg: MonitorPane.RunChosen) -> None:
        if msg.run_id != self.monitored:
            self.monitor(msg.run_id, switch=False)

    def on_runs_pane_monitor_requested(self, msg: RunsPane.MonitorRequested) -> None:
        self.monitor(msg.run_id)

    def on_health_box_checked(self, msg: MonitorPane.HealthChecked) -> None:  # (HealthChecked is HealthBox's)
        if not self._panes_gone():
            self.query_one(PaneTabs).mark("train", *msg.marker)  # the run shown has findings while it trains

    def on_monitor_pane_curves_requested(self, msg: MonitorPane.CurvesRequested) -> None:
        self.open_curves(msg.run_id)

    def on_runs_pane_curves_requested(self, msg: RunsPane.CurvesRequested) -> None:
        self.open_curves(msg.run_id)

    def open_curves(self, run_id: str) -> None:
        curves = self.curves_pane
        curves.select_run(run_id)
        self.action_show_tab("curves")
        curves.redraw()

    def on_runs_pane_sample_requested(self, msg: RunsPane.SampleRequested) -> None:
        self.open_sample(msg.run_id, msg.checkpoint)

    def open_sample(self, run_id: str, checkpoint: str | None = None) -> None:
        sample = self.sample_pane
        sample.set_runs([s.id for s in self.summaries] or [run_id], run_id)
        sample.choose(run_id, checkpoint)
        self.action_show_tab("sample")

    def action_generate(self) -> None:
        """Sample from the Sample pane's checkpoints (the pane runs the samplers)."""
        self.sample_pane.action_generate()

    # ------------------------------------------------------------------ start, resume, stop, delete

    def on_hardware_pane_train_requested(self, msg: HardwarePane.TrainRequested) -> None:
        self.action_new_run(msg.preset)

    def on_presets_pane_train_requested(self, msg: PresetsPane.TrainRequested) -> None:
        self.action_new_run(msg.preset)

    def on_runs_pane_fine_tune_requested(self, msg: RunsPane.FineTuneRequested) -> None:
        self.action_new_run(init_from=msg.init_from)

    def on_sample_pane_train_on_picks_requested(self, msg: SamplePane.TrainOnPicksRequested) -> None:
        from workbench.config import preset_paths
        preset = self._presets().get(msg.run_id)  # the run's own preset (its dropout, its batch), where it is one
        self.action_new_run(preset if preset in preset_paths() else None, "train.objective=dpo", msg.init_from,
                            msg.corpus, note=f"DPO on your {msg.picks} picks from {msg.run_id} (F5 / F6 in Sample)")

    async def action_quit(self) -> None:
        """Quit; unsaved preset edits (valid or not) would be lost, so the user is asked first."""
        drafts = [] if self._panes_gone() else self.presets_pane.unsaved()
        if not drafts:
            self.exit()
            return
        which = ", ".join(drafts)
        self.push_screen(ConfirmScreen(f"Quit and lose the unsaved changes to {which}? (n, then ctrl+s in Presets "
                                       "saves a valid one)", "Quit"),
                         lambda yes: self.exit() if yes else None)

    def action_new_run(self, preset: str | None = None, overrides: str = "", init_from: str = "",
                       corpus: str = "builtin", note: str = "") -> None:
        preset = preset or (self.recommended[0] if self.recommended else None)

        from workbench.tui.screens.new_run import NewRunScreen  # lazily: the run planner, not before the first frame
        form = NewRunScreen(preset, overrides, self.machine_now(), self.runs_dir, init_from, corpus, note)

        def done(req: RunRequest | None) -> None:
            if req is not None and form.queued:
                self.queue_request(req)
            elif req is not None:
                self.post_message(StartRun(req))

        self.push_screen(form, done)

    def on_presets_pane_sweep_requested(self, msg: PresetsPane.SweepRequested) -> None:
        self.open_sweep_form(msg.preset)

    def on_queue_pane_sweep_requested(self, msg: QueuePane.SweepRequested) -> None:
        presets = self.presets_pane   # the preset chosen there, as the Queue tab's `a` takes it
        if presets.current and not presets.saved_or_say("sweep"):
            return
        self.open_sweep_form(presets.current or (self.recommended[0] if self.recommended else None))

    def open_sweep_form(self, preset: str | None) -> None:
        """The sweep form; once it has queued the sweep (`workbench sweep`), the Queue tab shows it."""
        from workbench.tui.screens.sweep_form import SweepFormScreen, SweepQueued  # lazily, as the new-run form

        def done(queued: SweepQueued | None) -> None:
            if queued is None or self._panes_gone():
                return
            self.notify(f"Sweep {queued.name}: {queued.said}", timeout=max(10, self.NOTIFICATION_TIMEOUT))
            self.queue_pane.choose_sweep(queued.name)
            self.action_show_tab("queue")

        self.push_screen(SweepFormScreen(preset, self.runs_dir, self.machine_now()), done)

    def action_train_recommended(self) -> None:
        if not self.recommended:
            self.notify("Still reading the hardware…", severity="warning")
            return
        self.action_new_run(self.recommended[0])

    # ------------------------------------------------------------------ hardware

    def on_hardware_pane_read(self, msg: HardwarePane.Read) -> None:
        self.recommended = msg.recommended
        self.machine_info = msg.info
        if not self._panes_gone() and self.query("#presets-pane"):
            self.presets_pane.recommendation_known(msg.recommended[0])
        if not self._mounting_panes:
            self.call_after_refresh(self._mount_other_panes)  # once the machine is on the screen

    def machine_now(self) -> dict | None:
        """What the estimates are for: the hardware as last read, with the matmul rates this machine has measured
        since (a run, or `workbench estimate`, measures them into the cache; the Hardware pane reads again only
        while it is shown, so its reading may be older: the form said "time: unknown" beside a known rate)."""
        if self.machine_info is None or self.injected_hardware is not None:
            return self.machine_info
        return {**self.machine_info, "calibration": calibration()}

    def action_refresh_hardware(self) -> None:
        self.hardware_pane.read_hardware()

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
