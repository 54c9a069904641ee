"""Train / monitor pane: progress with ETA, live numbers, the run doctor's Health box, events, train.log tail.

The app decides which run is shown (``show_run``); the pane stops (after asking), resumes or plots
the run it shows by messages, and says when the user picks another run in its list. The Health box
(``widgets.health``) checks the run shown in a worker of its own and posts ``MonitorPane.HealthChecked``,
which the app turns into a marker on the Train tab."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.message import Message
from textual.widgets import Label, ProgressBar, RichLog, Select, Static

from workbench.rundir import LIVE_STATES, LOG_FILE, EventRecord, TrainRecord
from workbench.tui import display
from workbench.tui.messages import ResumeRun, StopRun
from workbench.tui.rundata import EVENT_STYLES, RunData
from workbench.tui.screens.dialogs import ConfirmScreen
from workbench.tui.widgets.health import HealthBox
from workbench.tui.widgets.pane import Pane

NO_RUN = "(no runs yet: press n to start one)"


def preparing(d: RunData) -> dict | None:
    """The corpus preparation a starting trainer reports in status.json, while it lasts."""
    p = d.status.preparing
    return p if isinstance(p, dict) and d.state in LIVE_STATES else None


def progress_text(d: RunData) -> str:
    step, total = d.step, d.max_iters
    prep = preparing(d)
    if prep:
        done, all_ = prep.get("done_bytes"), prep.get("total_bytes")
        size = f" {display.human_bytes(done)} of {display.human_bytes(all_)}" if done is not None and all_ else ""
        rate = f", {prep['mb_per_s']:.1f} MB/s" if prep.get("mb_per_s") else ""
        eta = f", ETA {display.duration(prep['eta_s'])}" if prep.get("eta_s") is not None else ""
        return f"preparing the corpus: {prep.get('phase', '')}{size} ({100 * prep.get('fraction', 0):.0f}%){rate}{eta}"
    if not total and d.state == "starting":
        return "starting the trainer…"
    pct = f"{100 * step / total:.0f}%" if total else ""
    if d.compiling:
        eta = "compiling…"
    elif d.state == "running" and total and step >= total:
        # the steps are done: the trainer is on its last eval (its sample and checkpoint), which a budget kept time
        # for; "warming up… 100%" (no rate yet) or "ETA 0s" said nothing of it
        eta = "final eval…"
    elif d.state in ("starting", "running"):
        speed = d.steps_per_s()
        eta = "ETA " + display.duration(d.eta_s()) if speed else "warming up…"
    else:
        eta = d.state.replace("_", "-")
    return f"step {step:,} / {total:,}  {pct}  {eta}"


def mfu_text(mfu: float | None, start: EventRecord | None) -> str:
    """MFU as the pane shows it; "(uncertain)" when its peak was only ever measured beside other busy
    processes, so it may read high (the start event's calibration, workbench.machine.rates)."""
    if mfu is None:
        return "—"
    cal = start.get("calibration") if start else None
    return f"{100 * mfu:.1f}%" + (" (uncertain)" if isinstance(cal, dict) and cal.get("uncertain") else "")


def reward_cells(d: RunData) -> list[tuple[str, str]]:
    """A GRPO run's latest numbers (its reward records): the train reward and its spread, the held-out reward,
    the share of groups without signal, KL to the reference (beta > 0) and the completion length."""
    r, v = d.last_reward("train"), d.last_reward("val")
    reward = "—" if r is None or r.reward is None else (
        f"{r.reward:.3f}" + (f" ± {r.reward_std:.3f}" if r.reward_std is not None else ""))
    return [("reward", reward),
            ("held-out reward", display.num(v.reward if v else None, ".3f")),
            ("no signal", "—" if r is None or r.no_signal is None else f"{100 * r.no_signal:.0f}% of groups"),
            ("KL", display.num(r.kl if r else None, ".4f")),
            ("completion len", display.num(r.completion_len if r else None, ".1f"))]


def stats_table(d: RunData, wide: bool) -> Table:
    r = d.last_train or TrainRecord.from_dict({})
    labels = (("mem_allocated_mb", "alloc"), ("mem_reserved_mb", "reserved"), ("mem_device_used_mb", "device"),
              ("mem_rss_mb", "RSS"))
    mem_parts = [f"{label} {display.mb(r.memory[key])}" for key, label in labels if key in r.memory]
    start = d.start_event()
    device = str(start.get("device") or "") if start else ""
    mem_label = "RSS" if device == "cpu" else "GPU mem" if device.startswith(("cuda", "mps")) else "memory"
    if len(mem_parts) == 1 and mem_parts[0].startswith(mem_label + " "):
        mem_parts = [mem_parts[0][len(mem_label) + 1:]]  # "RSS 326 MB" under the label RSS: once is enough
    mem = " · ".join(mem_parts) if mem_parts else display.mb(r.mem_mb)
    cells = [
        ("tokens/s", display.si(r.tokens_per_s)),
        ("MFU", mfu_text(r.mfu, start)),
        ("loss", display.loss(r.loss)),
        ("val loss", display.loss(d.last_eval.val_loss if d.last_eval else None)),
        ("best val", display.loss(d.best_val())),
        ("lr", display.num(r.lr, ".2e")),
        ("grad norm", display.num(r.grad_norm, ".3g")),
        (mem_label, mem),
        ("tokens", display.si(r.tokens_seen if d.last_train else None)),
        ("elapsed", display.duration(r.elapsed_s)),
        ("skipped", str(d.skipped_total)),
        # bits per byte: compares runs with different tokenizers (the events have their own list)
        ("val bpb", display.num(d.last_eval.val_bpb if d.last_eval else None, ".4f")),
    ]
    if d.last_reward("train") or d.last_reward("val"):
        # a GRPO run: no targets, so no val loss or bits per byte (its eval is the held-out reward); its numbers
        # take their places, after the loss
        cells = [c for c in cells if c[0] not in ("val loss", "best val", "val bpb")]
        cells[3:3] = reward_cells(d)
    ncols = 3 if wide else 2
    t = Table.grid(padding=(0, 1), expand=True)
    for _ in range(ncols):
        t.add_column(style="dim", no_wrap=True)
        t.add_column(style="bold", no_wrap=True, ratio=1)
    for i in range(0, len(cells), ncols):
        row: list[str] = []
        for label, value in cells[i:i + ncols]:
            row += [label, value]
        t.add_row(*row)
    return t


def event_message(e: EventRecord) -> str:
    """A short description of an event record, from its message or its known fields."""
    if e.get("message"):
        return str(e.get("message"))
    if e.event in ("start", "resume"):
        parts = [str(e.get(k)) for k in ("device", "precision") if e.get(k)]
        if e.get("params"):
            parts.append(f"{display.si(e.get('params'))} params")
        if e.get("compile") is not None:
            parts.append("compile " + ("on" if e.get("compile") else "off"))
        if e.get("checkpoint"):
            parts.append(f"from {e.get('checkpoint')}")
        return ", ".join(parts)
    if e.event == "checkpoint":  # the step is in its own column already: say why, and what was pruned
        bits = [str(e.get("reason") or e.get("name") or "saved")]
        if e.get("removed"):
            bits.append(f"pruned {len(e.get('removed'))}")
        return ", ".join(bits)
    return str(e.get("error") or e.get("reason") or "")


def run_header(d: RunData, preset: str = "") -> str:
    """State, preset and device line for the run shown."""
    start = d.start_event()
    bits = [preset] + ([start.get("device"), start.get("precision"),
                        f"{display.si(start.get('params'))} params" if start.get("params") else ""] if start else [])
    bits = [b for b in bits if b]
    return display.state_markup(d.state) + (f"  [dim]{' · '.join(bits)}[/]" if bits else "")


def event_line(e: EventRecord | dict) -> Text:
    if isinstance(e, dict):
        e = EventRecord.from_dict(e)
    msg = event_message(e)
    return Text.assemble((f"{e.step:>7} ", "dim"), (e.event, EVENT_STYLES.get(e.event, "")),
                         (f" {msg}" if msg else "", ""))



class TailLog(RichLog):
    """A RichLog that stays at its newest line when its own height changes: the stats above it growing when
    the terminal narrows, or the pane laid out again after it was hidden. (RichLog follows only its writes;
    the pane's own resize comes before its children's, so the pane cannot do it.)"""

    def on_resize(self, event: Resize) -> None:  # RichLog's own handler runs after this one (Textual's MRO)
        if self.auto_scroll:
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True, x_axis=False)

class MonitorPane(Vertical, Pane):
    MAIN_WIDGET = "#mon-log"
    BINDINGS = [
        Binding("x", "stop", "Stop run"),
        Binding("r", "resume", "Resume"),
        Binding("c", "curves", "Loss curves"),
    ]

    @dataclass
    class RunChosen(Message):
        """The user picked this run in the pane's run list."""
        run_id: str

    @dataclass
    class CurvesRequested(Message):
        """Plot the loss of the run shown."""
        run_id: str

    # The run doctor checked the run shown (bubbles from the Health box): findings and the tab's marker.
    HealthChecked: TypeAlias = HealthBox.Checked

    def __init__(self, runs_dir: str | Path | None = None, **kw: Any) -> None:
        """``runs_dir``: where the runs shown live (the Health box reads them); None: no Health box checks."""
        super().__init__(**kw)
        self.runs_dir = runs_dir
        self.shown: RunData | None = None  # the run shown
        self.presets: dict[str, str] = {}  # run id -> its preset's name, for the header
        self._events_shown = 0
        self._log_pending: list[str] = []  # train.log lines read while the log had no width

    def compose(self) -> ComposeResult:
        with Horizontal(id="mon-top"):
            yield Select([], prompt=NO_RUN, id="mon-run", allow_blank=True)
            yield Label("", id="mon-state")
        with Horizontal(id="mon-progress-row"):
            yield ProgressBar(total=1, show_eta=False, show_percentage=False, id="mon-progress")
            yield Label("", id="mon-progress-text")
        yield Static("", id="mon-stats")
        yield HealthBox(self.runs_dir, id="mon-health")
        with Horizontal(id="mon-bottom"):
            yield TailLog(id="mon-events", max_lines=500, auto_scroll=True, wrap=False)
            # wrap: a long line (a traceback, a warning with a path) is read whole, not cut at the edge
            yield TailLog(id="mon-log", max_lines=2000, auto_scroll=True, wrap=True, markup=False,
                          highlight=False, min_width=10)  # min_width: wrap at the pane's width, however narrow

    def on_mount(self) -> None:
        self.query_one("#mon-events", RichLog).border_title = "events"
        self.query_one("#mon-log", RichLog).border_title = LOG_FILE
        self.show_run(None)  # until a run is chosen: say how to start one

    def set_runs(self, run_ids: list[str], current: str | None, presets: dict[str, str] | None = None) -> None:
        """The runs to choose from, ``current`` shown as chosen; ``presets`` names each run's preset."""
        if presets is not None:
            self.presets = presets
        sel = self.query_one("#mon-run", Select)
        options = [(rid, rid) for rid in run_ids]
        with self.prevent(Select.Changed):
            sel.set_options(options)
            if current in run_ids:
                sel.value = current

    def show_run(self, d: RunData | None, reset: bool = False) -> None:
        """Redraw from the run's data; ``reset`` when the run shown changed."""
        self.shown = d
        self.query_one(HealthBox).follow(d.run_id if d else None, d.state if d else "?")
        if reset:
            self.query_one("#mon-events", RichLog).clear()
            self.query_one("#mon-log", RichLog).clear()
            self._log_pending.clear()
            self._events_shown = 0
        if d is None:
            self.query_one("#mon-state", Label).update("")
            self.query_one("#mon-progress-text", Label).update("")
            self.query_one("#mon-stats", Static).update(
                "No run shown. Press [b]n[/b] to start one, or choose a run above.")
            return
        self.query_one("#mon-state", Label).update(run_header(d, self.presets.get(d.run_id, "")))
        bar = self.query_one("#mon-progress", ProgressBar)
        prep = preparing(d)
        if prep:  # the bar shows the preparation until training starts
            bar.update(total=1000, progress=int(1000 * float(prep.get("fraction") or 0)))
        else:
            bar.update(total=max(1, d.max_iters), progress=min(d.step, max(1, d.max_iters)))
        self.query_one("#mon-progress-text", Label).update(progress_text(d))
        table = stats_table(d, wide=self.size.width >= 110)
        if d.status.error and d.state in ("failed", "crashed"):
            self.query_one("#mon-stats", Static).update(
                Group(table, Text(f"{d.state}: {d.status.error}", style="bold red")))
        else:
            self.query_one("#mon-stats", Static).update(table)
        ev = self.query_one("#mon-events", RichLog)
        for e in d.events[self._events_shown:]:
            ev.write(event_line(e))
        self._events_shown = len(d.events)

    def tab_shown(self) -> None:
        # lines written while the pane was hidden could not scroll it (no size then)
        self.call_after_refresh(self.follow_tails)

    def follow_tails(self) -> None:
        """Show the newest events and train.log lines (after the pane was hidden or resized)."""
        self._flush_log()
        for log in (self.query_one("#mon-events", RichLog), self.query_one("#mon-log", RichLog)):
            if log.auto_scroll:
                log.scroll_end(animate=False, immediate=True, x_axis=False)

    def on_resize(self) -> None:
        self.call_after_refresh(self.follow_tails)

    def append_log(self, lines: list[str]) -> None:
        self._log_pending.extend(lines)
        self._flush_log()

    def _flush_log(self) -> None:
        """Write the lines read so far, once the log has a width: a hidden pane has none, and a line
        written then would be wrapped at a few columns for good."""
        log = self.query_one("#mon-log", RichLog)
        if not self._log_pending or log.scrollable_content_region.width < 8:
            return
        for line in self._log_pending:
            log.write(Text(line))  # as text: brackets in a log line are not markup
        self._log_pending.clear()

    # ------------------------------------------------------------------ actions on the run shown

    @on(Select.Changed, "#mon-run")
    def _run_chosen(self, event: Select.Changed) -> None:
        event.stop()
        if event.value != Select.NULL:
            self.post_message(self.RunChosen(str(event.value)))

    def action_stop(self) -> None:
        """Ask, then request the stop. The dialog opens in this keystroke, so a "y" typed right
        after the "x" answers it."""
        d = self.shown
        if d is None or d.state not in LIVE_STATES:
            self.notify("The run shown is not running.", severity="warning")
            return
        rid = d.run_id

        def answer(yes: bool | None) -> None:
            if yes:
                self.post_message(StopRun(rid))

        self.app.push_screen(ConfirmScreen(f"Stop run [b]{rid}[/b]?\n\nThe trainer saves a checkpoint "
                                           "and exits; you can resume it later.", "Stop"), answer)

    def action_resume(self) -> None:
        if self.shown is not None:
            self.post_message(ResumeRun(self.shown.run_id, "latest"))

    def action_curves(self) -> None:
        if self.shown is not None:
            self.post_message(self.CurvesRequested(self.shown.run_id))
