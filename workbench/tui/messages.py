"""App-wide messages, posted by thread workers and handled on the UI thread."""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.message import Message

from workbench.plan.summary import RunSummary


@dataclass
class RunUpdated(Message):
    """New metrics records / status / train.log lines of one watched run."""
    run_id: str
    records: list[dict]
    status: dict
    log_lines: list[str] = field(default_factory=list)


@dataclass
class RunsListed(Message):
    """A fresh summary of every run in the runs directory."""
    runs: list[RunSummary]


@dataclass
class HardwareRead(Message):
    info: dict


@dataclass
class RunStarted(Message):
    """A trainer was started or resumed (the monitor follows it)."""
    run_id: str
    how: str  # "started" | "resumed"
