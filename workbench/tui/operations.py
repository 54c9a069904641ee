"""What the app does when a pane asks to start, resume, stop or delete a run, or to change the queue: each a
request message, answered by a thread worker of its own group that runs the CLI (``workbench.tui.launcher``:
the call blocks; the TUI never imports torch), and what follows when a run has started. A part of
:class:`workbench.tui.app.WorkbenchApp` (its base), kept apart so the app's module is its routing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from textual import work

from workbench.cli_client import CliError
from workbench.rundir import LIVE_STATES, RunError, delete_run
from workbench.tui import launcher
from workbench.tui.messages import ResumeRun, RunStarted, StartRun, StopRun

if TYPE_CHECKING:
    from pathlib import Path

    from workbench.analysis.summary import RunSummary
    from workbench.tui.launcher import RunRequest
    from workbench.tui.widgets.curves import CurvesPane
    from workbench.tui.widgets.presets import PresetsPane
    from workbench.tui.widgets.queue import QueuePane
    from workbench.tui.widgets.runs import RunsPane


class RunOperations:
    """The app's operations on runs and the queue (mixed into ``WorkbenchApp``: ``self`` is the app)."""

    # What the operations use of the app (declared for the type checker: the app defines them)
    runs_dir: Path
    recommended: tuple[str, str] | None
    _pending_sample_run: str | None
    presets_pane: PresetsPane
    curves_pane: CurvesPane
    queue_pane: QueuePane
    notify: Callable[..., None]
    post_message: Callable[..., Any]
    call_from_thread: Callable[..., Any]

    if TYPE_CHECKING:  # (not at run time: these would hide the app's own, after this base in its MRO)
        def summary(self, run_id: str) -> RunSummary | None: ...
        def _panes_gone(self) -> bool: ...
        def _list_runs(self) -> object: ...  # a worker
        def monitor(self, run_id: str, switch: bool = True) -> None: ...
        def action_show_tab(self, tab: str) -> None: ...
        def action_refresh_runs(self) -> None: ...

    # Each operation: a request message, answered by a thread worker of its own group (the CLI call
    # blocks). notify() only posts a message, so the workers call it directly.

    @work(thread=True, group="start", exit_on_error=False)
    def on_start_run(self, msg: StartRun) -> None:
        self.notify(f"Starting a {msg.request.preset} run…")
        if (rid := self._cli("train", launcher.start_run, self.runs_dir, msg.request)) is not None:
            self.post_message(RunStarted(rid, "started"))

    @work(thread=True, group="resume", exit_on_error=False)
    def on_resume_run(self, msg: ResumeRun) -> None:
        s = self.summary(msg.run_id)
        if msg.checkpoint == "latest" and s is not None and s.state in LIVE_STATES:
            self.notify(f"{msg.run_id} is already running.", severity="warning")
            return
        more = f" for {msg.more:,} more steps" if msg.more else ""
        self.notify(f"Resuming {msg.run_id} from checkpoint {msg.checkpoint}{more}…")
        rid = self._cli("resume", launcher.resume_run, self.runs_dir, msg.run_id, msg.checkpoint, 120, msg.more)
        if rid is not None:
            self.post_message(RunStarted(rid, "resumed" if rid == msg.run_id else f"branched from {msg.run_id}"))

    @work(thread=True, group="stop", exit_on_error=False)
    def on_stop_run(self, msg: StopRun) -> None:
        self.notify(f"Stopping {msg.run_id}: the trainer saves a checkpoint, then exits…")
        if (out := self._cli("stop", launcher.stop_run, self.runs_dir, msg.run_id)) is not None:
            self.notify(out or f"Sent stop to {msg.run_id}.")
            self._list_runs()

    def on_runs_pane_delete_requested(self, msg: RunsPane.DeleteRequested) -> None:
        self._delete(msg)

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

    def on_queue_pane_add_requested(self, msg: "QueuePane.AddRequested") -> None:
        presets = self.presets_pane
        preset = presets.current or (self.recommended[0] if self.recommended else None)
        if not preset:
            self.notify("Choose a preset in the Presets pane (2) first.", severity="warning")
            return
        if presets.current and not presets.saved_or_say("queue"):   # the file on disk is what a run reads
            return
        self._queue_preset(preset)

    def on_presets_pane_queue_requested(self, msg: "PresetsPane.QueueRequested") -> None:
        self._queue_preset(msg.preset)

    @work(thread=True, group="queue", exit_on_error=False)
    def _queue_preset(self, preset: str) -> None:
        """``workbench queue add PRESET`` (refused, in one line, where the estimate says it will not fit)."""
        if (out := self._cli("queue add", launcher.queue_command, self.runs_dir, "add", preset)) is not None:
            self._queued(out)

    def on_queue_pane_command_requested(self, msg: "QueuePane.CommandRequested") -> None:
        self._queue_command(msg.args, msg.done)

    @work(thread=True, group="queue", exit_on_error=False)
    def _queue_command(self, args: tuple[str, ...], done: str) -> None:
        if self._cli(f"queue {args[0]}", launcher.queue_command, self.runs_dir, *args) is not None:
            self.notify(done)
            self.call_from_thread(self._reread_queue)

    def on_queue_pane_sweep_curves_requested(self, msg: "QueuePane.SweepCurvesRequested") -> None:
        curves = self.curves_pane
        curves.show_sweep(msg.title, msg.runs, msg.metric)
        self.action_show_tab("curves")
        self.notify(f"{msg.title}; v: train and val, space: tick other runs.")

    def on_queue_pane_save_best_requested(self, msg: "QueuePane.SaveBestRequested") -> None:
        self._save_best(msg.sweep)

    @work(thread=True, group="save-best", exit_on_error=False)
    def _save_best(self, sweep: str) -> None:
        out = self._cli("save the best trial", launcher.sweep_command, self.runs_dir, "save-best", sweep)
        if out is not None:
            self.notify(out, timeout=10)
            self.call_from_thread(self._presets_changed)

    def _presets_changed(self) -> None:
        if not self._panes_gone():
            self.presets_pane.reload()

    def queue_request(self, req: "RunRequest") -> None:
        """The new-run form's "add to queue": ``workbench queue add`` with the form's arguments."""
        self._queue_add(req)

    @work(thread=True, group="queue", exit_on_error=False)
    def _queue_add(self, req: "RunRequest") -> None:
        if (out := self._cli("queue add", launcher.queue_run, self.runs_dir, req)) is not None:
            self._queued(out)

    def _queued(self, name: str) -> None:
        """Say which run was queued (in a worker's thread), and show it in the Queue tab."""
        self.notify(f"Queued {name}: the queue's runner starts it in its turn (7: the Queue tab; r there starts "
                    "a runner if none is at work).", timeout=8)
        self.call_from_thread(self._reread_queue)

    def _reread_queue(self) -> None:
        if not self._panes_gone():
            self.queue_pane.refresh_queue()

    def _cli(self, what: str, call: Callable[..., str], *args: Any) -> str | None:
        """Run a launcher call (in a worker's thread): its output, or None once the user is told why
        ``what`` failed."""
        try:
            return call(*args)
        except CliError as e:
            self.notify(f"{what} failed: {e}", severity="error", timeout=10)
            return None

    def on_run_started(self, msg: RunStarted) -> None:
        if self._panes_gone():
            return
        if not msg.run_id or not (self.runs_dir / msg.run_id).is_dir():
            self.notify(f"The trainer did not say which run it started ({msg.run_id!r}).", severity="error")
            return
        self.notify(f"Run {msg.run_id} {msg.how}; it keeps running if you close workbench.")
        self.curves_pane.select_run(msg.run_id)  # its loss is what the user wants to see next
        self.monitor(msg.run_id)
        self.action_refresh_runs()
        self._pending_sample_run = msg.run_id  # and its checkpoints in Sample, once it is listed
