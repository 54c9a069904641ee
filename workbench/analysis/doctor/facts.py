"""What the run doctor knows about one run, read from its directory: the preset it trains, its status,
its start event, the evals and events of its current timeline, recent train records, spikes and peaks.

:class:`RunFacts` reads ``metrics.jsonl`` by byte offset: ``refresh()`` reads only what was appended
since the last call, so the TUI can keep one per run shown and check it every few seconds for the
cost of the new lines (a long run's file is never read twice). ``read_run(run_dir)`` is one read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.analysis.doctor.finding import new_run_command, resumable, resume_command, shown_path
from workbench.analysis.doctor.spikes import SpikeFinder
from workbench.analysis.time_spent import TimeSpent, time_spent_of
from workbench.config import Preset, PresetError, load_preset_file
from workbench.errors import WorkbenchError
from workbench.machine.activity import HardwareSnapshot
from workbench.machine.detect import Machine
from workbench.rundir import (
    METRICS_FILE,
    PRESET_FILE,
    TIMELINE_EVENTS,
    EvalRecord,
    EventRecord,
    MetricsTail,
    PreferenceRecord,
    Record,
    RewardRecord,
    RunStatus,
    RunView,
    TrainRecord,
    list_checkpoints,
    read_status,
)

# Train records kept for the checks that look at the recent run (throughput, data wait): enough for a
# median over many log intervals, few enough that a million-step run costs the TUI nothing.
RECENT_TRAIN = 200
# A preference run's train records kept: its first ones (how it started) and the recent ones (where it is).
PREFS_FIRST, PREFS_RECENT = 20, 50
# A GRPO run's train reward records kept, the same way.
REWARDS_FIRST, REWARDS_RECENT = 20, 50


@dataclass
class RunFacts(RunView):
    """One run as the doctor sees it (see the module docstring)."""
    run_dir: Path
    status: RunStatus = field(default_factory=RunStatus)
    preset: Preset | None = None
    preset_error: str | None = None
    start: EventRecord | None = None          # the latest start or resume: device, precision, corpus sizes
    evals: list[EvalRecord] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    recent: deque[TrainRecord] = field(default_factory=lambda: deque(maxlen=RECENT_TRAIN))
    last_train: TrainRecord | None = None
    train_records: int = 0
    peak_mem_mb: float | None = None          # the largest memory figure any step logged (see TrainRecord)
    peak_reserved_mb: float | None = None     # CUDA: the most the allocator held
    grad_spikes: SpikeFinder = field(default_factory=lambda: SpikeFinder("grad_norm"))
    loss_spikes: SpikeFinder = field(default_factory=lambda: SpikeFinder("loss"))
    time_spent: TimeSpent | None = None       # the newest time totals: wall-clock, evals, saves
    prefs_first: list[PreferenceRecord] = field(default_factory=list)   # a preference run's first train records
    prefs_recent: deque[PreferenceRecord] = field(default_factory=lambda: deque(maxlen=PREFS_RECENT))
    rewards_first: list[RewardRecord] = field(default_factory=list)     # a GRPO run's first train reward records
    rewards_recent: deque[RewardRecord] = field(default_factory=lambda: deque(maxlen=REWARDS_RECENT))
    _tail: MetricsTail | None = None

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    @property
    def max_iters(self) -> int:
        """The step the run ends at: the preset's max_iters or, with a time budget, the step the trainer expects it
        to end at (status.json, re-estimated as it goes; the preset's max_iters is only its first guess)."""
        if self.preset is None or (self.preset.train.time_budget and self.status.max_iters):
            return self.status.max_iters
        return self.preset.train.max_iters

    @property
    def device(self) -> str | None:
        return str(self.start.get("device")) if self.start and self.start.get("device") else None

    def start_value(self, key: str, default: Any = None) -> Any:
        return self.start.get(key, default) if self.start else default

    def event_list(self, name: str) -> list[EventRecord]:
        return [e for e in self.events if e.event == name]

    # ------------------------------------------------------------------ reading

    def refresh(self) -> "RunFacts":
        """Read what changed since the last call: status and preset (small files, whole) and the lines
        appended to metrics.jsonl."""
        self.status = read_status(self.run_dir)
        try:
            self.preset, self.preset_error = load_preset_file(self.run_dir / PRESET_FILE), None
        except (PresetError, WorkbenchError, OSError) as e:
            self.preset, self.preset_error = None, str(e)
        if self.preset is not None:  # the warmup's gradient norms are large by nature
            self.grad_spikes.after_step = self.preset.train.warmup_iters
        if self._tail is None:
            self._tail = MetricsTail(self.run_dir / METRICS_FILE)
        while True:  # a long history arrives in 4 MB pieces
            batch = self._tail.read_records()
            if not batch:
                break
            for r in batch:
                self._add(r)
        return self

    def _add(self, r: Record) -> None:
        self.time_spent = time_spent_of(r) or self.time_spent
        if isinstance(r, TrainRecord):
            self.train_records += 1
            self.last_train = r
            self.recent.append(r)
            if (m := r.peak_mem_mb) is not None:
                self.peak_mem_mb = max(self.peak_mem_mb or 0.0, m)
            if (m := r.memory.get("mem_reserved_mb")) is not None:
                self.peak_reserved_mb = max(self.peak_reserved_mb or 0.0, m)
            self.grad_spikes.add(r.step, r.grad_norm, r.lr)
            self.loss_spikes.add(r.step, r.loss, r.lr)
        elif isinstance(r, PreferenceRecord):
            if r.split == "train":
                if len(self.prefs_first) < PREFS_FIRST:
                    self.prefs_first.append(r)
                self.prefs_recent.append(r)
        elif isinstance(r, RewardRecord):
            if r.split == "train":
                if len(self.rewards_first) < REWARDS_FIRST:
                    self.rewards_first.append(r)
                self.rewards_recent.append(r)
        elif isinstance(r, EvalRecord):
            if r.val_loss is not None and r.train_loss is not None:
                self.evals.append(r)
        elif isinstance(r, EventRecord):
            self.events.append(r)
            if r.event in ("start", "resume"):
                self.start = r
            if r.event in TIMELINE_EVENTS:  # records after the step it went back to were abandoned
                self.evals = [e for e in self.evals if e.step <= r.step]
                self.recent = deque((t for t in self.recent if t.step <= r.step), maxlen=RECENT_TRAIN)
                self.grad_spikes.rewind(r.step)
                self.prefs_first = [x for x in self.prefs_first if x.step <= r.step]
                self.prefs_recent = deque((x for x in self.prefs_recent if x.step <= r.step), maxlen=PREFS_RECENT)
                self.rewards_first = [x for x in self.rewards_first if x.step <= r.step]
                self.rewards_recent = deque((x for x in self.rewards_recent if x.step <= r.step),
                                            maxlen=REWARDS_RECENT)
                self.loss_spikes.rewind(r.step)


def read_run(run_dir: Path) -> RunFacts:
    """The facts of the run in ``run_dir``, read once."""
    return RunFacts(Path(run_dir)).refresh()


@dataclass
class Context:
    """What every check reads: the run, the hardware snapshot, and where to say what it could not check."""
    facts: RunFacts
    snapshot: HardwareSnapshot
    notes: list[str] = field(default_factory=list)

    @property
    def machine(self) -> Machine:
        return self.snapshot.machine

    @property
    def preset_ref(self) -> str:
        """The run's preset file as a user would type it (``workbench train`` and ``fit`` take it)."""
        return shown_path(self.facts.run_dir / PRESET_FILE)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def apply_command(self, values: dict[str, Any]) -> str:
        """The command that applies ``values``: a resume of this run where it can take them (a run that
        stopped or failed part-way, with training, hardware or dropout changes, from a checkpoint), else a new
        run of its preset."""
        f = self.facts
        if (f.state in ("stopped", "failed", "crashed") and all(resumable(k) for k in values)
                and list_checkpoints(f.run_dir)):
            return resume_command(f.run_id, values)
        return new_run_command(f.run_dir, values)
