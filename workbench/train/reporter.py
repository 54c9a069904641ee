"""What the trainer tells the world, all through the run directory: train.log lines, typed
metric records, status.json. Rank 0 owns the run directory; other ranks' reports go nowhere."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from workbench import rundir
from workbench.config import Preset
from workbench.errors import WorkbenchError
from workbench.fmt import millions
from workbench.machine.detect import Machine
from workbench.plan.fit.memory import estimate_memory
from workbench.plan.settings import RunSettings
from workbench.rundir import EventRecord, MetricsWriter, NullWriter, PreferenceRecord, Record
from workbench.train.runtime import is_oom


class Reporter:
    def __init__(self, run_dir: Path, is_main: bool, echo: bool):
        self.run_dir, self.is_main, self.echo = Path(run_dir), is_main, echo
        self.metrics: MetricsWriter | NullWriter = NullWriter()
        self.log_file = None

    def open(self) -> None:
        """Once the run's lock is held: start appending to metrics.jsonl (and train.log when our
        stdout is a terminal; detached, stdout *is* train.log)."""
        if self.is_main:
            self.metrics = MetricsWriter(self.run_dir / rundir.METRICS_FILE)
            if self.echo:
                self.log_file = open(self.run_dir / rundir.LOG_FILE, "a", encoding="utf-8")

    def log(self, msg: str) -> None:
        if not self.is_main:
            return
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        if self.log_file:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    def record(self, rec: Record) -> None:
        self.metrics.write(rec)

    def sample(self, step: int, prompt: str, text: str) -> None:
        """A sample generated at an eval, appended to samples.jsonl."""
        rundir.append_jsonl(self.run_dir / rundir.SAMPLES_FILE,
                            [{"step": step, "prompt": prompt, "text": text, "time": time.time()}])

    def preset_changes(self, step: int, changes: dict[str, list]) -> None:
        """The [train] keys a resume changed since its checkpoint ({key: [old, new]}), if any."""
        if changes:
            self.event("preset_changed", step, changes=changes)
            self.log("preset changes since that checkpoint: "
                     + ", ".join(f"train.{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()))

    def event(self, event: str, step: int, **data: Any) -> None:
        self.metrics.write(EventRecord(event=event, step=step, time=time.time(), data=data))

    def status(self, **fields: Any) -> None:
        if self.is_main:
            rundir.write_status(self.run_dir, **fields)

    def close(self) -> None:
        self.metrics.close()
        if self.log_file:
            self.log_file.close()
            self.log_file = None


class Throughput:
    """Tokens per second of the training steps alone. The first step after a (re)start or a
    rollback only starts the clock (compile and warm-up are left out); after an eval or a
    checkpoint the clock restarts, so their time is left out too."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.tokens = 0
        self.steps = 0
        self.data_s = 0.0   # of that time, spent drawing batches and moving them to the device

    def reset(self) -> None:
        """The next step starts the clock and is not counted."""
        self.t0 = None

    def start(self, now: float) -> None:
        """Count from ``now``: the next step is counted."""
        self.t0, self.tokens, self.steps, self.data_s = now, 0, 0, 0.0

    def tick(self, tokens: int, now: float, data_s: float = 0.0) -> bool:
        """One step done (``data_s`` of it waiting for data); True when it only started the clock."""
        if self.t0 is None:
            self.start(now)
            return True
        self.tokens += tokens
        self.steps += 1
        self.data_s += data_s
        return False

    def data_fraction(self, now: float) -> float | None:
        """The share of the window's time spent waiting for data (a data-bound run shows here)."""
        return self.data_s / (now - self.t0) if self.steps and self.t0 is not None and now > self.t0 else None

    def rate(self, now: float) -> float | None:
        return self.tokens / (now - self.t0) if self.steps and self.t0 is not None else None

    def after_log(self, now: float) -> None:
        """A new window after each logged rate."""
        if self.steps:
            self.start(now)


def start_line(run_id: str, p: Any, s: Any, device: Any, world: int, n_params: int, trainable: int,
               tokens_per_step: int, source: str, cached: bool) -> str:
    """The log's first line of a start or resume: what runs, where, how (``p`` the preset, ``s`` its RunSettings)."""
    layout = {"fsdp": f" x {world} processes, sharded (FSDP2)",
              "ddp": f" x {world} processes, replicated (DDP)"}.get(s.parallel, "")
    tuned = {"lora": f" ({millions(trainable, '.3f')} in LoRA adapters trained, rank "
                     f"{p.train.lora_rank}; the rest frozen)"}.get(p.train.finetune, "")
    if p.init is not None:
        tuned += f", from {p.init['run']} step {p.init['step']}"
    return (f"run {run_id}: preset {p.name}, {millions(n_params, '.2f')} params{tuned}, device {device}"
            f"{layout}, precision {s.precision}, compile {s.compile_mode}, "
            + {"8bit": "8-bit AdamW states, ", "offload": "AdamW states on the CPU, "}.get(s.optimizer_states, "")
            + ("flex attention for packed rows, " if s.attention_kernel == "flex" and s.packed else "")
            + f"{tokens_per_step:,} tokens/step, corpus {source}"
            + (" (tokenizer and tokens from cache)" if cached else ""))


def savers_line(s: Any) -> str:
    """The log's line on the memory savers: the loss and activation checkpointing, and why (auto's rule)."""
    loss = f"fused loss ({s.loss_chunk_tokens} tokens a chunk)" if s.loss_chunk_tokens else "plain loss"
    ckpt = "activation checkpointing" if s.activation_checkpointing else "no activation checkpointing"
    return f"memory: {loss}, {ckpt}" + (f" ({s.savers_reason})" if s.savers_reason else "")


# ----------------------------------------------------------------------------- the one line a failed run ends with

def oom_message(p: Preset, settings: RunSettings, device: str) -> str:
    t = p.train
    half = max(1, t.batch_size // 2)
    est = ""
    try:
        m = estimate_memory(p, settings.precision, settings.device_type, batch_size=half,
                            machine=Machine.assumed(settings.device_type))
        est = f" (estimated {m.total / 2**30:.1f} GiB at batch_size {half})"
    except WorkbenchError:  # the advice stands without the number
        pass
    return (f"out of memory on {device} at batch_size {t.batch_size} x seq_len {p.model.seq_len}; lower "
            f"train.batch_size (raise train.grad_accum to keep the tokens per step){est}, lower model.seq_len, or set "
            f"hardware.activation_checkpointing = true; `workbench fit {p.name}` finds a batch that fits")


def failure_message(e: BaseException, *, preset: Preset | None, settings: RunSettings | None, device: str,
                    report: Reporter, rank: int | None, run_name: str) -> str:
    """The one line status.json and the CLI show for a run that failed with ``e`` (``rank``: this process's in
    a run of several, else None)."""
    if isinstance(e, WorkbenchError):
        return str(e)
    if is_oom(e) and settings is not None and preset is not None:
        return oom_message(preset, settings, device)
    if isinstance(e, KeyboardInterrupt):
        return "interrupted twice; stopped without saving (the last checkpoint is intact)"
    report.log(traceback.format_exc())
    if rank is not None and isinstance(e, (RuntimeError, OSError)):
        return (f"rank {rank}: another rank of this run stopped (its process died or was killed: "
                f"{type(e).__name__} in a collective); see train.log for which, then `workbench resume {run_name}`")
    return f"{type(e).__name__}: {e} (traceback in train.log)"


def preference_summary(r: PreferenceRecord) -> str:
    """The log line's tail for a preference run: reward margin and accuracy, the answers' log-prob drift."""
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)
    out = f", margin {num(r.margin, '.3f')}"
    if r.accuracy is not None:
        out += f", acc {r.accuracy:.2f}"
    if r.chosen_drift is not None:
        out += f", drift chosen {num(r.chosen_drift, '+.2f')} rejected {num(r.rejected_drift, '+.2f')}"
    return out
