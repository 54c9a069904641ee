"""The Train pane's Health box: the run doctor's findings for the run shown (``workbench.analysis.doctor``).

A thread worker checks the run when it is shown, every ``INTERVAL`` seconds while it trains (sampling
what else uses the CPU and GPU for ``SAMPLE_SECONDS``), and once more when it ends. Each check reads
only the new lines of metrics.jsonl (one :class:`RunFacts` per run, kept here). The result is posted
as ``HealthBox.Checked``; it bubbles to the app, which marks the Train tab while a running run has
findings (the check at its end clears the marker; the box keeps the findings).

Under the findings, the queue (``workbench.queue.doctor``, read every ``INTERVAL`` seconds in a worker of its
own, whether or not a run is shown): the run shown's place in it (a sweep's trial pruned, a run failed in the
queue) and what the queue runs, how many runs wait and whether a runner is at work.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.text import Text
from textual import on, work
from textual.message import Message
from textual.widgets import Static

from workbench.analysis.doctor import Finding, RunFacts, diagnose
from workbench.errors import WorkbenchError
from workbench.machine.activity import take_snapshot
from workbench.queue.doctor import look
from workbench.rundir import LIVE_STATES

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}
SHOWN = 3          # findings listed; the rest are counted
SHOWN_COMPACT = 2  # when the pane is short


def marker(findings: list[Finding]) -> tuple[str, str]:
    """The Train tab's marker for these findings: ("●2 findings", style of the worst), or nothing. It says what it
    counts (a bare "●2" did not); the tabs drop the word where it does not fit (:meth:`PaneTabs.mark`)."""
    if not findings:
        return "", ""
    worst = min(findings, key=Finding.sort_key).severity
    n = len(findings)
    return f"●{n} finding{'s' if n != 1 else ''}", SEVERITY_STYLE[worst]


def queue_lines(run_id: str | None, runs_dir: Path) -> list[Text]:
    """The run's line in the queue (when it is a queue item or a sweep's trial) and the queue's (when something
    runs or waits, or a runner is at work); none when nothing was ever queued."""
    try:
        q = look(runs_dir)
    except WorkbenchError as e:
        return [Text(f"queue: {e}", style="red", no_wrap=True, overflow="ellipsis")]
    if q is None:
        return []
    out = []
    if run_id is not None and (about := q.about(run_id)):
        style = "red" if q.state_of(run_id) == "failed" else ""
        out.append(Text.assemble(("in the queue: ", "bold"), (about, style), no_wrap=True, overflow="ellipsis"))
    if (line := q.line(tui=True)) is not None:
        out.append(Text.assemble(("queue: ", "bold"), (line, "yellow" if q.waiting_without_runner() else "dim"),
                                 no_wrap=True, overflow="ellipsis"))
    return out


def render_health(findings: list[Finding] | None, run_id: str | None, compact: bool = False,
                  error: str = "", queue: list[Text] | None = None) -> Group | Text:
    """What the box shows: each finding's title and its change, most important first; then ``queue``'s lines."""
    queue = queue or []

    def with_queue(line: Text) -> Group | Text:
        return Group(line, *queue) if queue else line

    if run_id is None:
        return Group(*queue) if queue else Text("")
    if error:
        return with_queue(Text(f"the check failed: {error}", style="red"))
    if findings is None:
        return with_queue(Text("checking…", style="dim"))
    if not findings:
        return with_queue(Text("✓ no problems found", style="green"))
    n = SHOWN_COMPACT if compact else SHOWN
    lines: list[Text] = []
    for f in findings[:n]:
        lines.append(Text.assemble(("● ", SEVERITY_STYLE[f.severity]), (f"{f.kind}: ", "bold"), f.title,
                                   no_wrap=True, overflow="ellipsis"))
        if not compact and f.evidence:
            lines.append(Text.assemble("    ", (f.evidence[0], "dim"), no_wrap=True, overflow="ellipsis"))
        lines.append(Text.assemble("  → ", (f.change, "italic"), no_wrap=True, overflow="ellipsis"))
    more = len(findings) - n
    lines.append(Text(f"{'+' + str(more) + ' more; ' if more > 0 else ''}evidence and changes: "
                      f"workbench doctor {run_id}", style="dim", no_wrap=True, overflow="ellipsis"))
    return Group(*lines, *queue)


class HealthBox(Static):
    """See the module docstring. ``follow(run_id, state)`` is all the pane calls."""

    INTERVAL = 5.0         # seconds between checks of a running run
    SAMPLE_SECONDS = 0.5   # CPU and GPU use sampled this long at each check

    @dataclass
    class Checked(Message):
        """The run doctor looked at ``run_id``; ``marker`` is the Train tab's ("●2", style) or ("", "")."""
        run_id: str
        findings: list[Finding]
        notes: list[str] = field(default_factory=list)
        marker: tuple[str, str] = ("", "")
        error: str = ""        # the check itself failed (the run's files unreadable, a bug): why

    @dataclass
    class QueueLooked(Message):
        """The queue as it is now, for ``run_id``: the lines the box shows under the findings."""
        run_id: str | None
        lines: list[Text]

    def __init__(self, runs_dir: str | Path | None, **kw: Any) -> None:
        super().__init__("", **kw)
        self.runs_dir = Path(runs_dir) if runs_dir is not None else None
        self.run_id: str | None = None
        self.live = False
        self.findings: list[Finding] | None = None
        self.error = ""
        self.queue: list[Text] = []
        self._facts: dict[str, RunFacts] = {}
        self._lock = threading.Lock()  # one check at a time (a cancelled worker's thread may still run)

    def on_mount(self) -> None:
        self.border_title = "health"
        self.set_interval(self.INTERVAL, self._tick)
        self.look_queue()

    def follow(self, run_id: str | None, state: str) -> None:
        """Show the health of ``run_id`` (in ``state`` now): checked at once when it is new, or when it
        started or ended since the last call."""
        live = state in LIVE_STATES
        if run_id != self.run_id:
            self.run_id, self.live, self.findings, self.error = run_id, live, None, ""
            self.queue = [line for line in self.queue if line.plain.startswith("queue: ")]  # not the last run's
            self._show()
            self.look_queue()
            if run_id is not None:
                self.check()
        elif live != self.live:  # started, or ended: checked again, which sets the tab's marker or clears it
            self.live = live
            self.check()

    def _tick(self) -> None:
        if self.live:
            self.check()
        self.look_queue()

    def look_queue(self) -> None:
        """Read the queue (in a thread): the run shown's place in it and what it runs and holds."""
        if self.runs_dir is not None:
            self._look_queue(self.run_id)

    @work(thread=True, exclusive=True, group="health-queue", exit_on_error=False)
    def _look_queue(self, run_id: str | None) -> None:
        assert self.runs_dir is not None  # (look_queue starts this only with one)
        self.post_message(self.QueueLooked(run_id, queue_lines(run_id, self.runs_dir)))

    @on(QueueLooked)
    def _queue_looked(self, msg: QueueLooked) -> None:
        msg.stop()
        if msg.run_id == self.run_id:
            self.queue = msg.lines
            self._show()

    def check(self) -> None:
        """Check the run shown now (in a thread)."""
        if self.run_id is not None and self.runs_dir is not None:
            self._check(self.run_id)

    @work(thread=True, exclusive=True, group="health", exit_on_error=False)
    def _check(self, run_id: str) -> None:
        assert self.runs_dir is not None  # (check starts this only with one)
        notes: list[str] = []
        error = ""
        with self._lock:
            facts = self._facts.setdefault(run_id, RunFacts(self.runs_dir / run_id))
            try:
                facts.refresh()
                pid = facts.status.pid if facts.live else None
                snapshot = take_snapshot(int(pid) if pid else None, interval=self.SAMPLE_SECONDS)
                findings = diagnose(facts, snapshot, notes)
            except Exception as e:  # noqa: BLE001 - a check that fails must say so, not kill the box
                findings, error = [], repr(e)
        self.post_message(self.Checked(run_id, findings, notes, error=error))

    @on(Checked)
    def _checked(self, msg: Checked) -> None:
        if msg.run_id != self.run_id:
            msg.stop()  # a run no longer shown: nobody needs it
            return
        self.findings, self.error = msg.findings, msg.error
        # the tab is marked while the run trains: once it has ended, its findings are in the box alone
        msg.marker = marker(msg.findings) if self.live else ("", "")
        self._show()

    def on_resize(self) -> None:
        self._show()

    def _show(self) -> None:
        self.update(render_health(self.findings, self.run_id, self.app.size.height < 36, self.error, self.queue))
