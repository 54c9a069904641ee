"""App-wide messages: what thread workers report, and the run operations any part of the UI may
request (the app starts, resumes and stops runs, each in a worker of its own).

Messages that belong to one pane are nested in its class (``RunsPane.SampleRequested``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.message import Message

from workbench.analysis.summary import RunSummary
from workbench.rundir import RunStatus
from workbench.tui.launcher import RunRequest


@dataclass
class RunUpdated(Message):
    """New metrics records / status / train.log lines of one watched run; ``task_file``: every record of
    its tasks.jsonl when that changed (None: unchanged)."""
    run_id: str
    records: list[dict]
    status: RunStatus
    log_lines: list[str] = field(default_factory=list)
    task_file: list[dict] | None = None


@dataclass
class RunsListed(Message):
    """A fresh summary of every run in the runs directory."""
    runs: list[RunSummary]


@dataclass
class RunStarted(Message):
    """A trainer was started or resumed (the monitor follows it)."""
    run_id: str
    how: str  # "started" | "resumed" | "branched from RUN"


# ----------------------------------------------------------------------------- requests to the app


@dataclass
class StartRun(Message):
    """Start a new run as the new-run form describes it (``workbench train ... --detach``)."""
    request: RunRequest


@dataclass
class ResumeRun(Message):
    """Resume ``run_id`` from ``checkpoint``: ``latest`` (in place), or a step (a checkpoint other than the
    latest continues in a new run, a branch); ``more``: train that many steps past the checkpoint."""
    run_id: str
    checkpoint: str = "latest"
    more: int | None = None


@dataclass
class StopRun(Message):
    """Stop ``run_id`` (already confirmed by the user): the trainer saves a checkpoint and exits."""
    run_id: str
