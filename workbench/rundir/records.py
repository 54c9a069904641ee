"""metrics.jsonl: one typed record per line, written by the trainer and read by everyone else.

Four kinds, each defined once here (the writer and every reader use these classes):

- :class:`TrainRecord`  every ``train.log_interval`` steps: loss, lr, throughput, memory
- :class:`EvalRecord`   every ``train.eval_interval`` steps: mean train and val loss on fixed windows, the
  eval's seconds and the run's wall-clock so far with its seconds in evals and checkpoint saves
- :class:`TaskRecord`   ``train.eval_tasks`` scored at a step: one record per task and metric (the
  trainer writes them here; ``workbench eval`` writes the same records to ``tasks.jsonl``)
- :class:`PreferenceRecord` (preference objectives) rewards, margin, accuracy and log-prob drift, at each log
  line (train) and eval (val)
- :class:`EventRecord`  start, resume, compile_done, checkpoint, early_stop, nonfinite_skip,
  rollback, preset_changed, stop, error, finish (each with its own fields in ``data``; a start's or a
  resume's are a :class:`StartRecord`)

Keys a reader does not know are kept in ``extra`` (and written back by ``to_dict``), so a
newer trainer's records survive an older reader. Writing and reading the files (append-only, read by byte
offset, never re-read whole by a live reader) is :mod:`workbench.rundir.jsonl`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

# The memory fields a train record carries depend on the device (see the trainer's memory_mb).
MEMORY_KEYS = ("mem_allocated_mb", "mem_reserved_mb", "mem_device_used_mb", "mem_rss_mb", "mem_peak_rss_mb")
# Where a run's wall-clock went, as eval records and the run's end event (finish, stopped, early_stopped) carry
# it: the run's seconds so far, and those spent in evals and in checkpoint saves (whole run, across resumes).
TIME_KEYS = ("elapsed_s", "eval_s", "ckpt_s")


def _num(v: Any) -> float | None:
    """A finite number, else None (JSON has no NaN; a writer's None means "not finite")."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _int(v: Any, default: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return default
    return int(v)


def _opt_int(v: Any) -> int | None:
    return None if _num(v) is None else _int(v)


@dataclass
class TrainRecord:
    kind: ClassVar[str] = "train"
    step: int
    loss: float | None                 # None: the step's loss was not finite (the update was skipped)
    lr: float | None
    grad_norm: float | None
    tokens_per_s: float | None         # None for the first step after a (re)start, compile or eval
    tokens_seen: int
    elapsed_s: float | None
    skipped: int                       # non-finite steps skipped so far in the run
    time: float | None
    mem_mb: float | None = None        # headline memory: peak allocated (CUDA/MPS) or process RSS (CPU)
    mfu: float | None = None
    data_fraction: float | None = None  # share of the logged interval spent waiting for batches
    memory: dict[str, float] = field(default_factory=dict)   # MEMORY_KEYS that the device reports
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": self.kind, "step": self.step, "loss": self.loss, "lr": self.lr, "grad_norm": self.grad_norm,
             "tokens_per_s": self.tokens_per_s, "tokens_seen": self.tokens_seen, "elapsed_s": self.elapsed_s,
             "skipped": self.skipped, "time": self.time, "mem_mb": self.mem_mb, "mfu": self.mfu,
             "data_fraction": self.data_fraction}
        return {**d, **self.memory, **self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainRecord":
        known = {"kind", "step", "loss", "lr", "grad_norm", "tokens_per_s", "tokens_seen", "elapsed_s", "skipped",
                 "time", "mem_mb", "mfu", "data_fraction", *MEMORY_KEYS}
        return cls(step=_int(d.get("step")), loss=_num(d.get("loss")), lr=_num(d.get("lr")),
                   grad_norm=_num(d.get("grad_norm")), tokens_per_s=_num(d.get("tokens_per_s")),
                   tokens_seen=_int(d.get("tokens_seen")), elapsed_s=_num(d.get("elapsed_s")),
                   skipped=_int(d.get("skipped")), time=_num(d.get("time")), mem_mb=_num(d.get("mem_mb")),
                   mfu=_num(d.get("mfu")), data_fraction=_num(d.get("data_fraction")),
                   memory={k: v for k in MEMORY_KEYS if (v := _num(d.get(k))) is not None},
                   extra={k: v for k, v in d.items() if k not in known})

    @property
    def peak_mem_mb(self) -> float | None:
        """The largest memory figure of the step: the peak RSS on CPU, else ``mem_mb``."""
        return self.memory.get("mem_peak_rss_mb", self.mem_mb)


@dataclass
class EvalRecord:
    kind: ClassVar[str] = "eval"
    step: int
    train_loss: float | None
    val_loss: float | None
    time: float | None = None
    # bits per byte of the same windows: the loss per UTF-8 byte of text, comparable across vocabularies
    train_bpb: float | None = None
    val_bpb: float | None = None
    seconds: float | None = None       # this eval's wall-clock seconds (the first's includes drawing its batches)
    # The run's wall-clock so far at the eval's end (a train record's elapsed_s), and how much of it went to
    # evals (this one included) and to checkpoint saves (TIME_KEYS; the run's end event carries them too).
    elapsed_s: float | None = None
    eval_s: float | None = None
    ckpt_s: float | None = None
    # a budgeted run: the share of its budget's training done when the eval began (the schedule's progress, the share
    # its evals on the way are placed at: train.eval_shares, a sweep's rungs, where its pruner compares trials)
    budget_share: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        bpb = {"train_bpb": self.train_bpb, "val_bpb": self.val_bpb} if self.val_bpb is not None else {}
        times = {"seconds": self.seconds, **self.time_spent()} if self.seconds is not None else {}
        share = {"budget_share": self.budget_share} if self.budget_share is not None else {}
        return {"kind": self.kind, "step": self.step, "train_loss": self.train_loss, "val_loss": self.val_loss,
                "time": self.time, **bpb, **times, **share, **self.extra}

    def time_spent(self) -> dict[str, float | None]:
        return {k: getattr(self, k) for k in TIME_KEYS}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalRecord":
        known = {"kind", "step", "train_loss", "val_loss", "time", "train_bpb", "val_bpb", "seconds", "budget_share",
                 *TIME_KEYS}
        return cls(step=_int(d.get("step")), train_loss=_num(d.get("train_loss")), val_loss=_num(d.get("val_loss")),
                   time=_num(d.get("time")), train_bpb=_num(d.get("train_bpb")), val_bpb=_num(d.get("val_bpb")),
                   seconds=_num(d.get("seconds")), elapsed_s=_num(d.get("elapsed_s")), eval_s=_num(d.get("eval_s")),
                   ckpt_s=_num(d.get("ckpt_s")), budget_share=_num(d.get("budget_share")),
                   extra={k: v for k, v in d.items() if k not in known})


@dataclass
class PreferenceRecord:
    """A preference run's measures beside its loss (train: every ``train.log_interval`` steps, the mean over the
    micro-batches since the last; val and train at each eval, on the eval's fixed batches), as TRL names them:
    the rewards of the chosen and the rejected answers (β times the policy's log-prob over the reference's; the
    reference-free objectives' β times the length-averaged log-prob), their margin and the share of pairs whose
    chosen reward is the higher (KTO: none), the policy's log-probs of both answers, and their drift from the
    reference (policy - reference, summed over the answer; none without a reference). Under DDP rank 0's."""
    kind: ClassVar[str] = "pref"
    step: int
    split: str                          # train | val | eval-train (the eval's train batches)
    loss: float | None = None
    chosen_reward: float | None = None
    rejected_reward: float | None = None
    margin: float | None = None
    accuracy: float | None = None
    chosen_logps: float | None = None
    rejected_logps: float | None = None
    chosen_drift: float | None = None
    rejected_drift: float | None = None
    time: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    FIELDS: ClassVar[tuple[str, ...]] = ("loss", "chosen_reward", "rejected_reward", "margin", "accuracy",
                                         "chosen_logps", "rejected_logps", "chosen_drift", "rejected_drift")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "split": self.split,
                **{k: getattr(self, k) for k in self.FIELDS}, "time": self.time, **self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PreferenceRecord":
        known = {"kind", "step", "split", "time", *cls.FIELDS}
        return cls(step=_int(d.get("step")), split=str(d.get("split") or "train"), time=_num(d.get("time")),
                   **{k: _num(d.get(k)) for k in cls.FIELDS}, extra={k: v for k, v in d.items() if k not in known})


@dataclass
class RewardRecord:
    """A GRPO run's rollouts as they scored (train: every ``train.log_interval`` steps, the mean over the steps
    since the last; val: at each eval, the held-out prompts' completions from fixed seeds): the mean reward, its
    spread over the completions, the share of groups whose rewards were all equal (no signal: every advantage 0),
    the k3 KL to the reference (``train.grpo_beta`` > 0), the mean completion length in tokens and the share of
    tokens whose ratio was clipped."""
    kind: ClassVar[str] = "reward"
    step: int
    split: str                          # train | val
    reward: float | None = None
    reward_std: float | None = None
    no_signal: float | None = None
    kl: float | None = None
    completion_len: float | None = None
    clipped: float | None = None
    loss: float | None = None
    time: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    FIELDS: ClassVar[tuple[str, ...]] = ("reward", "reward_std", "no_signal", "kl", "completion_len", "clipped",
                                         "loss")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "split": self.split,
                **{k: getattr(self, k) for k in self.FIELDS}, "time": self.time, **self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RewardRecord":
        known = {"kind", "step", "split", "time", *cls.FIELDS}
        return cls(step=_int(d.get("step")), split=str(d.get("split") or "train"), time=_num(d.get("time")),
                   **{k: _num(d.get(k)) for k in cls.FIELDS}, extra={k: v for k, v in d.items() if k not in known})


@dataclass
class TaskRecord:
    kind: ClassVar[str] = "task"
    step: int
    task: str                          # the task's name (built-in name or the file's stem)
    metric: str                        # centered | acc | acc_norm | exact | contains | bpb | loss
    value: float | None
    n: int                             # items (or, for bpb, tokens) scored
    time: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # e.g. source (the file), checkpoint, seconds

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "task": self.task, "metric": self.metric, "value": self.value,
                "n": self.n, "time": self.time, **self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskRecord":
        known = {"kind", "step", "task", "metric", "value", "n", "time"}
        return cls(step=_int(d.get("step")), task=str(d.get("task") or "?"), metric=str(d.get("metric") or "?"),
                   value=_num(d.get("value")), n=_int(d.get("n")), time=_num(d.get("time")),
                   extra={k: v for k, v in d.items() if k not in known})


@dataclass
class EventRecord:
    kind: ClassVar[str] = "event"
    event: str
    step: int
    time: float | None = None
    data: dict[str, Any] = field(default_factory=dict)   # the event's own fields (device, reason, ...)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "event": self.event, "step": self.step, "time": self.time, **self.data}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EventRecord":
        return cls(event=str(d.get("event") or "?"), step=_int(d.get("step")), time=_num(d.get("time")),
                   data={k: v for k, v in d.items() if k not in ("kind", "event", "step", "time")})

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


@dataclass(frozen=True)
class StartRecord:
    """The ``start`` event of a trainer process (``resume``: from a checkpoint), typed: what it runs, where and
    how, once. ``data``: the data's own facts by kind (``{"chat": {...}}``); the optional fields (budget_s to
    init) are left out of the event without a value. A reader of an older trainer's event gets the defaults."""
    params: int = 0
    device: str = ""
    precision: str = ""
    compile: bool = False
    compile_mode: str = ""
    loss_chunk_tokens: int = 0
    activation_checkpointing: bool = False
    savers_reason: str = ""
    tokens_per_step: int = 0
    corpus: str = ""
    train_tokens: int = 0
    val_tokens: int = 0
    eval_iters: int = 0
    peak_flops: float | None = None
    pid: int = 0
    world_size: int = 1
    parallel: str = "none"
    finetune: str = "full"
    trainable: int = 0
    budget_s: float | None = None
    budget_steps: int | None = None
    calibration: dict[str, Any] | None = None   # the measured MFU peak (machine.rates)
    checkpoint: str | None = None               # the checkpoint a resume goes on from
    parent: dict[str, Any] | None = None        # the preset's parent (a branch) and init (a fine-tune's weights)
    init: dict[str, Any] | None = None
    objective: dict[str, Any] | None = None     # a preference run's: objective, beta, reference (objective_plan)
    data: dict[str, Any] = field(default_factory=dict)

    def event(self, resume: bool, step: int, time: float) -> EventRecord:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "data"}
        optional = list(d)[list(d).index("budget_s"):]
        return EventRecord("resume" if resume else "start", step, time,
                           {**{k: v for k, v in d.items() if v is not None or k not in optional}, **self.data})

    @classmethod
    def of(cls, e: EventRecord) -> "StartRecord":
        known = set(cls.__dataclass_fields__) - {"data"}
        return cls(**{k: v for k, v in e.data.items() if k in known}, data={k: v for k, v in e.data.items()
                                                                          if k not in known})


Record = Union[TrainRecord, EvalRecord, TaskRecord, EventRecord, PreferenceRecord, RewardRecord]

# Events after which the run continues from the event's step: a resume from a checkpoint, or a rollback
# to one. Train, eval and task records logged before such an event for later steps belong to the timeline it
# abandoned; readers drop them (current_timeline), so no two histories are ever drawn as one.
# "imported": a model brought in by `workbench import` (a step-0 checkpoint, never trained itself).
STATES = ("starting", "running", "finished", "stopped", "early_stopped", "failed", "crashed", "imported")
LIVE_STATES = ("starting", "running")


@dataclass(frozen=True)
class RunStatus:
    """status.json: where a run is now (replaced whole by its writers: the launcher, the trainer, import).

    Every writer goes through ``rundir.write_status`` with these field names, every reader gets this
    record from ``rundir.read_status``; keys it does not know are kept in ``extra``."""
    state: str = "?"                   # one of STATES ("?": not known yet, e.g. before status.json is read)
    pid: int | None = None             # the trainer process, and its start time (a reused pid is not it)
    pid_start: float | None = None
    step: int = 0
    max_iters: int = 0                 # with a time budget: the step it should end at, re-estimated as it goes
    budget_s: float | None = None      # train.time_budget in seconds, and how much of it is spent
    budget_spent_s: float | None = None
    warmup: int | None = None          # with a time budget: the warmup steps its plan gave it (plan.schedule.horizon)
    tokens_seen: int | None = None
    error: str | None = None           # the one line a failed or crashed run says
    compiling: bool = False
    world_size: int | None = None
    started: float | None = None       # wall-clock times
    resumed: float | None = None
    finished: float | None = None
    updated: float | None = None
    best_val_loss: float | None = None
    ckpt_seconds: float | None = None
    preparing: dict[str, Any] | None = None   # the corpus preparation's progress, while a trainer prepares
    source: str | None = None          # an imported run: the model directory it came from
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """The status says a trainer is at work (``read_status`` has checked that its process is alive)."""
        return self.state in LIVE_STATES

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f for f in cls.__dataclass_fields__ if f != "extra")

    def to_dict(self) -> dict[str, Any]:
        """Every field; a run without a time budget leaves its two out."""
        unset = {"budget_s", "budget_spent_s", "warmup"} if self.budget_s is None else set()
        return {**{f: getattr(self, f) for f in self.fields() if f not in unset}, **self.extra}

    @classmethod
    def from_dict(cls, d: Any) -> "RunStatus":
        d = d if isinstance(d, dict) else {}
        text = lambda v: v if isinstance(v, str) else None  # noqa: E731
        pid = d.get("pid")
        prep = d.get("preparing")
        return cls(state=text(d.get("state")) or "?", pid=pid if isinstance(pid, int) and pid > 0 else None,
                   pid_start=_num(d.get("pid_start")), step=_int(d.get("step")), max_iters=_int(d.get("max_iters")),
                   budget_s=_num(d.get("budget_s")), budget_spent_s=_num(d.get("budget_spent_s")),
                   warmup=_opt_int(d.get("warmup")), tokens_seen=_opt_int(d.get("tokens_seen")),
                   error=text(d.get("error")),
                   compiling=d.get("compiling") is True,
                   world_size=_opt_int(d.get("world_size")),
                   started=_num(d.get("started")), resumed=_num(d.get("resumed")), finished=_num(d.get("finished")),
                   updated=_num(d.get("updated")), best_val_loss=_num(d.get("best_val_loss")),
                   ckpt_seconds=_num(d.get("ckpt_seconds")), preparing=prep if isinstance(prep, dict) else None,
                   source=text(d.get("source")), extra={k: v for k, v in d.items() if k not in cls.fields()})


class RunView:
    """What a reader of one run (the doctor's facts, the TUI's run data) derives from the run's ``status``
    and its newest train record ``last_train``; the class using it has both attributes."""
    status: RunStatus
    last_train: "TrainRecord | None"

    @property
    def state(self) -> str:
        return self.status.state

    @property
    def live(self) -> bool:
        return self.status.live

    @property
    def step(self) -> int:
        """The newest step: the status's, or a train record's written since."""
        return max(self.last_train.step if self.last_train else 0, self.status.step)

    @property
    def max_iters(self) -> int:
        return self.status.max_iters


TIMELINE_EVENTS = ("resume", "rollback")


def current_timeline(records: list[Record]) -> list[Record]:
    """The records in file order, without the train, eval and task records of abandoned timelines."""
    out: list[Record] = []
    for r in records:
        if isinstance(r, EventRecord) and r.event in TIMELINE_EVENTS:
            kept = [x for x in out if not (isinstance(x, (TrainRecord, EvalRecord, TaskRecord, PreferenceRecord,
                                                          RewardRecord))
                                           and x.step > r.step)]
            out = kept
        out.append(r)
    return out
RecordClass = Union[type[TrainRecord], type[EvalRecord], type[TaskRecord], type[EventRecord], type[PreferenceRecord],
                    type[RewardRecord]]
RECORD_KINDS: dict[str, RecordClass] = {c.kind: c for c in (TrainRecord, EvalRecord, TaskRecord, EventRecord,
                                                            PreferenceRecord, RewardRecord)}


def parse_record(d: Any) -> Record | None:
    """The typed record of one parsed JSON line; None for a line of another or no kind."""
    if not isinstance(d, dict):
        return None
    kind = d.get("kind")
    cls = RECORD_KINDS.get(kind) if isinstance(kind, str) else None
    return cls.from_dict(d) if cls else None


# ----------------------------------------------------------------------------- writing


__all__ = ["current_timeline", "EvalRecord", "EventRecord", "LIVE_STATES", "MEMORY_KEYS", "parse_record",
           "PreferenceRecord", "Record", "RECORD_KINDS", "RewardRecord",
           "RunStatus", "RunView", "StartRecord", "STATES", "TaskRecord",
           "TIME_KEYS", "TIMELINE_EVENTS", "TrainRecord"]
