"""The workbench TUI: hardware, presets, live training, loss curves, sampling, run browser.

The app never imports torch. It starts trainers and samplers as subprocesses of
the CLI (``workbench.tui.launcher``) and learns everything else from the run
directories: a single tailer thread (``workbench.tui.watcher``) reads new bytes
of ``metrics.jsonl`` / ``train.log`` and posts messages; slower reads (run
summaries, hardware) run in thread workers. Closing the app stops nothing.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Select, TabbedContent, TabPane
from textual.worker import Worker, WorkerState, get_current_worker

from workbench.fs import write_atomic
from workbench.plan.summary import summarize_run
from workbench.rundir import LIVE_STATES, RunLock, iter_run_dirs, runs_root
from workbench.tui import hwinfo, launcher
from workbench.tui.messages import HardwareRead, RunsListed, RunStarted, RunUpdated
from workbench.tui.palette import WorkbenchCommands
from workbench.tui.rundata import RunData
from workbench.tui.screens.dialogs import ConfirmScreen, NameScreen
from workbench.tui.screens.new_run import NewRunScreen, RunRequest
from workbench.tui.watcher import RunWatcher
from workbench.tui.widgets.curves import CurvesPane
from workbench.tui.widgets.hardware import HardwarePane
from workbench.tui.widgets.monitor import MonitorPane
from workbench.tui.widgets.presets import PresetsPane
from workbench.tui.widgets.runs import RunsPane
from workbench.tui.widgets.sample import SampleOutput, SamplePane, resolve_checkpoint


class WorkbenchApp(App[int]):
    CSS_PATH = "workbench.tcss"
    TITLE = "workbench"
    COMMANDS = App.COMMANDS | {WorkbenchCommands}
    TAB_LABELS = {"hardware": "Hardware", "presets": "Presets", "train": "Train",
                  "curves": "Loss curves", "sample": "Sample", "runs": "Runs"}
    BINDINGS = [
        Binding("1", "show_tab('hardware')", "Hardware", show=False),
        Binding("2", "show_tab('presets')", "Presets", show=False),
        Binding("3", "show_tab('train')", "Train", show=False),
        Binding("4", "show_tab('curves')", "Curves", show=False),
        Binding("5", "show_tab('sample')", "Sample", show=False),
        Binding("6", "show_tab('runs')", "Runs", show=False),
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
        self.hardware_info: dict | None = hardware_info
        self.recommended: tuple[str, str] | None = (
            hwinfo.recommend(hardware_info) if hardware_info else None)
        self.watch_interval = watch_interval
        self.list_interval = list_interval
        self.hardware_interval = hardware_interval
        self.initial_tab = initial_tab
        self.run_data: dict[str, RunData] = {}
        self.summaries: list = []
        self.monitored: str | None = None
        self.watcher = RunWatcher(self.runs_dir, self.post_message, interval=watch_interval)
        self._samplers: list[launcher.SampleProcess] = []
        self._curves_dirty = False
        self._listed_once = False
        self._pending_sample_run: str | None = None  # a run started here, for the Sample pane

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        initial = self.initial_tab or ("train" if self._has_runs() else "hardware")
        with TabbedContent(initial=initial, id="tabs"):
            with TabPane("1 Hardware", id="hardware"):
                yield HardwarePane(id="hardware-pane")
            with TabPane("2 Presets", id="presets"):
                yield PresetsPane(id="presets-pane")
            with TabPane("3 Train", id="train"):
                yield MonitorPane(id="monitor-pane")
            with TabPane("4 Loss curves", id="curves"):
                yield CurvesPane(self.run_data, id="curves-pane")
            with TabPane("5 Sample", id="sample"):
                yield SamplePane(id="sample-pane")
            with TabPane("6 Runs", id="runs"):
                yield RunsPane(id="runs-pane")
        yield Footer()

    def _has_runs(self) -> bool:
        return next(iter_run_dirs(self.runs_dir), None) is not None

    def _panes_gone(self) -> bool:
        """True while the app shuts down: a worker's message may still arrive after the panes are
        removed, and handling it must not raise (it would print a traceback on quit)."""
        return not self.is_running or not self.screen_stack or not self.query(TabbedContent)

    def on_mount(self) -> None:
        self.sub_title = str(self.runs_dir)
        self._watch_worker()
        self.action_refresh_runs()
        self.set_interval(self.list_interval, self.action_refresh_runs)
        if self.injected_hardware is None:
            self.action_refresh_hardware()
            self.set_interval(self.hardware_interval, self._refresh_hardware_if_visible)
        else:
            self._show_hardware()
        self.set_interval(max(0.5, self.watch_interval), self._redraw_curves_if_dirty)
        self._focus_pane(self.query_one(TabbedContent).active)

    # ------------------------------------------------------------------ tabs and focus

    PANE_FOCUS = {"hardware": "#hardware-pane", "presets": "#preset-list", "train": "#mon-log",
                  "curves": "#curves-runs", "sample": "#smp-run", "runs": "#runs-table"}

    def action_show_tab(self, tab: str) -> None:
        tabs = self.query_one(TabbedContent)
        if tabs.active != tab:
            tabs.active = tab  # the switcher shows the new pane at once
        # Focus its main widget now, in the same step: keys typed right after the tab key (a
        # quick "3 x y", or keys buffered while the app was busy) must reach the new pane, not
        # the old one or nothing.
        self._focus_pane(tab)

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        tab = event.pane.id or ""
        focused = self.default_screen.focused
        if focused is None or event.pane not in focused.ancestors:  # e.g. a click on the tab
            self._focus_pane(tab)
        if tab == "curves":
            self.query_one(CurvesPane).redraw()
        elif tab == "train":
            # lines written while the pane was hidden could not scroll it (no size then)
            self.call_after_refresh(self.query_one(MonitorPane).follow_tails)
        elif tab == "hardware":
            self._refresh_hardware_if_visible()
        elif tab == "sample":
            run = self.query_one("#smp-run", Select).value
            if run != Select.NULL and (self.runs_dir / str(run)).is_dir():
                self.query_one(SamplePane).show_run(self.runs_dir / str(run), keep=True)

    def _focus_pane(self, tab: str) -> None:
        """Focus the pane's main widget so its key bindings are live and shown in the footer."""
        target = self.PANE_FOCUS.get(tab)
        if not target:
            return
        try:
            widget = self.query_one(target)
        except Exception:
            return
        # synchronous (Widget.focus() waits for the next idle); on the panes' own screen, which
        # may be under a dialog or the command palette just now
        widget.screen.set_focus(widget)
        if tab == "curves":
            self.query_one(CurvesPane).ensure_highlight()

    # ------------------------------------------------------------------ the tailer

    @work(thread=True, exclusive=True, group="watch", exit_on_error=False)
    def _watch_worker(self) -> None:
        worker = get_current_worker()
        self.watcher.run(lambda: worker.is_cancelled)

    def on_unmount(self) -> None:
        self.watcher.stopped.set()
        self.watcher.wake.set()
        self.action_cancel_sampling()

    def on_run_updated(self, msg: RunUpdated) -> None:
        if self._panes_gone():
            return
        d = self.run_data.setdefault(msg.run_id, RunData(msg.run_id))
        prev_state = d.state
        d.status = msg.status
        d.feed(msg.records)
        if msg.run_id == self.monitored:
            mon = self.query_one(MonitorPane)
            mon.show_run(d)
            mon.append_log(msg.log_lines)
        if msg.records and msg.run_id in self.query_one(CurvesPane).selected_ids():
            self._curves_dirty = True
        if prev_state != d.state and prev_state != "?":
            self.action_refresh_runs()  # the browser should show the new state now

    def _redraw_curves_if_dirty(self) -> None:
        if self._panes_gone():
            return
        if self._curves_dirty and self.query_one(TabbedContent).active == "curves":
            self._curves_dirty = False
            self.query_one(CurvesPane).redraw()

    def watch_runs_for_curves(self, run_ids: list[str]) -> None:
        for rid in run_ids:
            self.run_data.setdefault(rid, RunData(rid))
            self.watcher.watch(rid)

    # ------------------------------------------------------------------ runs list

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
        # newest first: started time, else the directory name
        runs.sort(key=lambda s: (s.started or 0, s.id), reverse=True)
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
        self.query_one(MonitorPane).set_runs(ids, self.monitored)
        self.query_one(CurvesPane).set_runs(ids)
        self.query_one(SamplePane).set_runs(ids)
        if not self._listed_once:
            self._listed_once = True
            if self.monitored:
                self.query_one(CurvesPane).select_run(self.monitored)
        pending = self._pending_sample_run
        if pending in ids:
            self._pending_sample_run = None
            self._sample_run_changed(pending)
        elif self.monitored and self.query_one("#smp-run", Select).value == Select.NULL:
            self._sample_run_changed(self.monitored)  # e.g. the first run, started from this TUI
        presets = self.query_one(PresetsPane)
        for s in reversed(msg.runs):  # newest wins
            if s.tokens_per_s:
                presets.measured[s.preset] = {"tokens_per_s": s.tokens_per_s, "run": s.id}

    def summary(self, run_id: str):
        return next((s for s in self.summaries if s.id == run_id), None)

    # ------------------------------------------------------------------ monitor

    def monitor(self, run_id: str, switch: bool = True) -> None:
        """Follow ``run_id`` in the Train pane (with its train.log)."""
        changed = run_id != self.monitored
        self.monitored = run_id
        d = self.run_data.setdefault(run_id, RunData(run_id))
        if changed:  # the pane is cleared, so its train.log tail starts over
            self.watcher.watch(run_id, with_log=True, fresh_log=True)
        mon = self.query_one(MonitorPane)
        mon.set_runs([s.id for s in self.summaries] or [run_id], run_id)
        mon.show_run(d, reset=changed)
        if switch:
            self.action_show_tab("train")

    @on(Select.Changed, "#mon-run")
    def _monitor_select(self, event: Select.Changed) -> None:
        if event.value != Select.NULL and event.value != self.monitored:
            self.monitor(str(event.value), switch=False)

    def action_show_curves(self) -> None:
        if self.monitored:
            self.open_curves(self.monitored)

    def action_stop_run(self) -> None:
        rid = self.monitored
        d = self.run_data.get(rid or "")
        if not rid or d is None or d.state not in LIVE_STATES:
            self.notify("The run shown is not running.", severity="warning")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.notify(f"Stopping {rid}: the trainer saves a checkpoint, then exits…")
                self._launch("stop", rid)

        self.push_screen(ConfirmScreen(f"Stop run [b]{rid}[/b]?\n\nThe trainer saves a checkpoint "
                                       "and exits; you can resume it later.", "Stop"), answer)

    def action_resume_run(self) -> None:
        if self.monitored:
            self.resume(self.monitored, "latest")

    def resume(self, run_id: str, checkpoint: str = "latest") -> None:
        s = self.summary(run_id)
        if s is not None and s.state in LIVE_STATES:
            self.notify(f"{run_id} is already running.", severity="warning")
            return
        self.notify(f"Resuming {run_id} from checkpoint {checkpoint}…")
        self._launch("resume", run_id, checkpoint)

    # ------------------------------------------------------------------ starting runs

    def action_new_run(self, preset: str | None = None, overrides: str = "") -> None:
        preset = preset or (self.recommended[0] if self.recommended else None)

        def done(req: RunRequest | None) -> None:
            if req is not None:
                self.notify(f"Starting a {req.preset} run…")
                self._launch("train", req)

        self.push_screen(NewRunScreen(preset, overrides), done)

    def action_train_recommended(self) -> None:
        if not self.recommended:
            self.notify("Still reading the hardware…", severity="warning")
            return
        self.action_new_run(self.recommended[0])

    @work(thread=True, group="launch", exit_on_error=False)
    def _launch(self, kind: str, *args) -> None:
        try:
            if kind == "train":
                req: RunRequest = args[0]
                rid = launcher.start_run(self.runs_dir, req.preset, req.corpus, req.name, req.overrides)
                self.post_message(RunStarted(rid, "started"))
            elif kind == "resume":
                rid = launcher.resume_run(self.runs_dir, args[0], args[1])
                self.post_message(RunStarted(args[0], "resumed"))
            elif kind == "stop":
                out = launcher.stop_run(self.runs_dir, args[0])
                self.call_from_thread(self.notify, out or f"Sent stop to {args[0]}.")
                self.call_from_thread(self.action_refresh_runs)
        except launcher.LaunchError as e:
            self.call_from_thread(self.notify, f"{kind} failed: {e}", severity="error", timeout=10)

    def on_run_started(self, msg: RunStarted) -> None:
        if self._panes_gone():
            return
        if not msg.run_id or not (self.runs_dir / msg.run_id).is_dir():
            self.notify(f"The trainer did not say which run it started ({msg.run_id!r}).", severity="error")
            return
        self.notify(f"Run {msg.run_id} {msg.how}; it keeps running if you close workbench.")
        curves = self.query_one(CurvesPane)
        curves.select_run(msg.run_id)  # its loss is what the user wants to see next
        self.watch_runs_for_curves(curves.selected_ids())
        self.monitor(msg.run_id)
        self.action_refresh_runs()
        self._pending_sample_run = msg.run_id  # and its checkpoints in Sample, once it is listed

    # ------------------------------------------------------------------ runs browser actions

    def _selected_run(self) -> str | None:
        rid = self.query_one(RunsPane).selected_run_id()
        if rid is None:
            self.notify("No run selected.", severity="warning")
        return rid

    def action_monitor_selected(self) -> None:
        if (rid := self._selected_run()):
            self.monitor(rid)

    def action_resume_selected(self, which: str) -> None:
        pane = self.query_one(RunsPane)
        rid = self._selected_run()
        if not rid:
            return
        if which == "latest":
            self.resume(rid, "latest")
            return
        ck = pane.selected_checkpoint()
        if ck is None:
            self.notify(f"{rid} has no checkpoint to resume from.", severity="warning")
            return
        self.resume(rid, str(ck["step"]))

    def action_sample_selected(self) -> None:
        pane = self.query_one(RunsPane)
        if (rid := self._selected_run()):
            ck = pane.selected_checkpoint() if pane.focused_table() == "ckpt-table" else None
            self.open_sample(rid, str(ck["step"]) if ck else None)

    def action_curves_selected(self) -> None:
        if (rid := self._selected_run()):
            self.open_curves(rid)

    def open_curves(self, run_id: str) -> None:
        curves = self.query_one(CurvesPane)
        curves.select_run(run_id)
        self.watch_runs_for_curves(curves.selected_ids())
        self.action_show_tab("curves")
        curves.redraw()

    def curves_action(self, name: str) -> None:
        self.action_show_tab("curves")
        getattr(self.query_one(CurvesPane), f"action_{name}")()

    def action_delete_selected(self) -> None:
        pane = self.query_one(RunsPane)
        rid = self._selected_run()
        if not rid:
            return
        if pane.focused_table() == "ckpt-table":
            ck = pane.selected_checkpoint()
            if ck:
                self.delete_checkpoint(rid, ck)
        else:
            self.delete_run(rid)

    def _is_live(self, run_id: str) -> bool:
        return RunLock(self.runs_dir / run_id).held_by_other() or (
            (s := self.summary(run_id)) is not None and s.state in LIVE_STATES)

    def delete_run(self, run_id: str) -> None:
        if self._is_live(run_id):
            self.notify(f"{run_id} is running; stop it first.", severity="error")
            return
        path = self.runs_dir / run_id

        def answer(yes: bool | None) -> None:
            if yes:
                self._delete(path, f"run {run_id}")

        self.push_screen(ConfirmScreen(f"Delete run [b]{run_id}[/b] and all its checkpoints?\n\n{path}\n\n"
                                       "This cannot be undone.", "Delete"), answer)

    def delete_checkpoint(self, run_id: str, ck: dict) -> None:
        if self._is_live(run_id):
            self.notify(f"{run_id} is running (it prunes its own checkpoints); stop it first.", severity="error")
            return
        path = Path(ck["path"])

        def answer(yes: bool | None) -> None:
            if yes:
                self._delete(path, f"checkpoint {ck.get('name')} of {run_id}")

        self.push_screen(ConfirmScreen(f"Delete checkpoint [b]{ck.get('name')}[/b] of {run_id}?\n\n"
                                       "This cannot be undone.", "Delete"), answer)

    @work(thread=True, group="delete", exit_on_error=False)
    def _delete(self, path: Path, what: str) -> None:
        root = self.runs_dir.resolve()
        if root not in path.resolve().parents:  # never remove anything outside the runs directory
            self.call_from_thread(self.notify, f"refusing to delete {path}: not inside {root}", severity="error")
            return
        shutil.rmtree(path)
        self.call_from_thread(self.notify, f"Deleted {what}.")
        self._list_runs()

    # ------------------------------------------------------------------ sampling

    def open_sample(self, run_id: str, checkpoint: str | None = None) -> None:
        self.query_one(SamplePane).set_runs([s.id for s in self.summaries] or [run_id], run_id)
        self._sample_run_changed(run_id, checkpoint)
        self.action_show_tab("sample")

    @on(Select.Changed, "#smp-run")
    def _sample_select(self, event: Select.Changed) -> None:
        if event.value != Select.NULL:
            self._sample_run_changed(str(event.value))

    def _sample_run_changed(self, run_id: str, checkpoint: str | None = None) -> None:
        pane = self.query_one(SamplePane)
        with pane.prevent(Select.Changed):
            pane.query_one("#smp-run", Select).value = run_id
        pane.show_run(self.runs_dir / run_id, checkpoint)

    def action_generate(self) -> None:
        pane = self.query_one(SamplePane)
        run = pane.query_one("#smp-run", Select).value
        if run == Select.NULL:
            self.notify("Choose a run to sample from.", severity="warning")
            return
        try:
            params = pane.params()
        except ValueError as e:
            self.notify(str(e), severity="error")
            return
        self.action_cancel_sampling()
        a = str(pane.query_one("#smp-ckpt-a", Select).value)
        b = str(pane.query_one("#smp-ckpt-b", Select).value)
        # a live run writes and prunes checkpoints: re-read them, and refuse a choice that is gone
        pane.show_run(self.runs_dir / str(run), keep=True)
        gone = [ck for ck, now in ((a, pane.query_one("#smp-ckpt-a", Select).value),
                                   (b, pane.query_one("#smp-ckpt-b", Select).value)) if str(now) != ck]
        if gone:
            self.notify(f"Checkpoint step {gone[0]} of {run} is gone (the trainer keeps only recent and best "
                        "checkpoints); choose another.", severity="warning", timeout=8)
            return
        columns = [("#smp-out-a", a)] + ([("#smp-out-b", b)] if b != "none" else [])
        if b == "none":
            pane.query_one("#smp-out-b", SampleOutput).reset("checkpoint B (choose one to compare)", "")
        for out_id, choice in columns:
            out = pane.query_one(out_id, SampleOutput)
            # latest / best pinned to a step now, so the title names what the sampler loads
            ck = resolve_checkpoint(self.runs_dir / str(run), choice)
            shown = choice if ck == choice else f"{choice} (step {ck})"
            out.reset(f"{run} @ {shown}  T={params['temperature']} k={params['top_k']} p={params['top_p']} "
                      f"seed={params['seed']}", params["prompt"])
            argv = launcher.sample_argv(self.runs_dir, str(run), ck, params["prompt"], params["max_new_tokens"],
                                        params["temperature"], params["top_k"], params["top_p"], params["seed"])
            self._sample_worker(argv, out, params["prompt"])

    @work(thread=True, group="sample", exit_on_error=False)
    def _sample_worker(self, argv: list[str], out: SampleOutput, prompt: str = "") -> None:
        worker = get_current_worker()
        echo = launcher.PromptEcho(prompt)
        try:
            proc = launcher.SampleProcess(argv)
        except OSError as e:
            self.call_from_thread(out.append, f"\n[could not start the sampler: {e}]", "bold red")
            return
        self._samplers.append(proc)
        started = time.monotonic()
        try:
            for chunk in proc.chunks():
                if worker.is_cancelled:
                    proc.kill()
                    break
                if (chunk := echo.strip(chunk)):
                    self.call_from_thread(out.append, chunk)
            rc, err = proc.finish()
        finally:
            if proc in self._samplers:
                self._samplers.remove(proc)
        if rc != 0 and not worker.is_cancelled:
            self.call_from_thread(out.append, f"\n[sampler failed: {err or f'exit status {rc}'}]", "bold red")
        else:
            self.call_from_thread(out.finish, f"[{time.monotonic() - started:.1f}s]")

    def action_cancel_sampling(self) -> None:
        for proc in list(self._samplers):
            proc.kill()
        self.workers.cancel_group(self, "sample")

    # ------------------------------------------------------------------ presets

    def save_preset(self, as_new: bool = False) -> None:
        from workbench.config import check_preset_name, shipped_presets_dir, user_presets_dir
        pane = self.query_one(PresetsPane)
        pane.check()
        name = pane.current
        if not name:
            return
        if pane.valid is None:
            self.notify("Not saved: the preset has an error (see below the editor). "
                        "A file on disk is never replaced by an invalid one.", severity="error")
            return
        path, kind = pane.paths[name]
        user_dir = user_presets_dir()
        same_dir = user_dir.resolve() == shipped_presets_dir().resolve()
        if as_new or (kind == "shipped" and same_dir):
            def check(new: str) -> str | None:
                try:
                    check_preset_name(new)
                except Exception as e:
                    return str(e)
                if new in pane.paths:
                    return f"a preset named {new!r} exists already; choose another name"
                return None

            def chosen(new: str | None) -> None:
                if new:
                    self._write_preset(pane, new, user_dir / f"{new}.toml", rename=True)

            hint = "" if as_new else " (shipped presets in this directory are kept; save a copy)"
            self.push_screen(NameScreen(f"Save preset as{hint}:", f"{name}-copy", check), chosen)
            return
        target = path if kind == "user" else user_dir / f"{name}.toml"
        self._write_preset(pane, name, target, rename=False)

    def _write_preset(self, pane: PresetsPane, name: str, target: Path, rename: bool) -> None:
        import re
        text = pane.editor_text()
        if rename:
            if re.search(r'(?m)^name\s*=.*$', text):
                text = re.sub(r'(?m)^name\s*=.*$', f'name = "{name}"', text, count=1)
            else:
                text = f'name = "{name}"\n' + text
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, text)
        except OSError as e:
            self.notify(f"Could not save {target}: {e}", severity="error")
            return
        old = pane.current
        if old:
            pane.buffers.pop(old, None)
        pane.current = None  # do not stash the editor over the saved file
        self.notify(f"Saved {target}" + (" (a user copy: it overrides the shipped preset)"
                                          if not rename and pane.paths.get(name, ("", ""))[1] == "shipped" else ""))
        pane.reload(select=name)

    # ------------------------------------------------------------------ hardware

    def action_refresh_hardware(self) -> None:
        if self.injected_hardware is None:
            self._read_hardware()

    def _refresh_hardware_if_visible(self) -> None:
        if self._panes_gone():
            return
        if self.injected_hardware is None and self.query_one(TabbedContent).active == "hardware":
            self._read_hardware()

    @work(thread=True, exclusive=True, group="hardware", exit_on_error=False)
    def _read_hardware(self) -> None:
        info = hwinfo.detect()
        if self.recommended is None:
            self.recommended = hwinfo.recommend(info)
        self.post_message(HardwareRead(info))

    def on_hardware_read(self, msg: HardwareRead) -> None:
        if self._panes_gone():
            return
        self.hardware_info = msg.info
        self._show_hardware()

    def _show_hardware(self) -> None:
        if self.hardware_info is not None:
            self.query_one(HardwarePane).show(self.hardware_info, self.recommended or ("?", ""))

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
