"""Fault injection for the tests: read once from the environment when a trainer starts, then
called at named points of the loop and of a checkpoint save. With none set (every real run),
each point is a cheap attribute check.

    WORKBENCH_TEST_SIGTERM_AT_STEP=N   send ourselves SIGTERM after step N (a `workbench stop`)
    WORKBENCH_TEST_KILL_AT_STEP=N      SIGKILL after step N (a crash)
    WORKBENCH_TEST_OOM_AT_STEP=N       raise CUDA's out-of-memory error after step N
    WORKBENCH_TEST_NAN_STEPS=a,b,...   poison the loss of those steps (once each, or every time
    WORKBENCH_TEST_NAN_ALWAYS=1        they are reached again after a rollback)
    WORKBENCH_TEST_FAIL_SAVE_AT_STEP=N the disk fills up in the middle of step N's save
    WORKBENCH_TEST_PAUSE_IN_SAVE=P     sleep at point P of a save (after_model | before_rename),
    WORKBENCH_TEST_PAUSE_MARKER=FILE   after writing our pid to FILE,
    WORKBENCH_TEST_PAUSE_SECONDS=S     for S seconds (default 30), so a test can kill us there
    WORKBENCH_TEST_PAUSE_AFTER_SHARD=N corpus preparation: pause (as above) once N token shards are written
    WORKBENCH_TEST_REFERENCE_IS_POLICY=1 a preference run's reference is the policy itself (TRL #1107's bug)
    WORKBENCH_TEST_SLOW_EVALS=S        every eval after step 0 takes S seconds longer (a machine busier than when
                                       a time budget's plan timed its eval batch)
    WORKBENCH_TEST_BATCH_LOG=DIR       each rank appends the rows it trains (their input tokens) to
                                       DIR/rank<R>.jsonl, a line a micro-batch: a test compares runs' token streams
    WORKBENCH_TEST_SPAWN=SOCKET        a detached trainer is forked by the tests' spawn server listening there
                                       (tests/support/spawner.py: torch already imported) instead of started in a
                                       fresh interpreter, and so is a command the TUI, the queue or a bench runs
                                       (``workbench.cli_client``: ``spawn_detached``, ``popen``)

No torch here: corpus preparation (``workbench data prepare``) uses it too.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _int(env: dict, key: str) -> int | None:
    v = env.get(key, "").strip()
    return int(v) if v else None


@dataclass
class Faults:
    sigterm_at: int | None = None
    kill_at: int | None = None
    oom_at: int | None = None
    nan_steps: frozenset[int] = frozenset()
    nan_always: bool = False
    fail_save_at: int | None = None
    pause_in_save: str | None = None
    pause_marker: str | None = None
    pause_seconds: float = 30.0
    pause_after_shard: int | None = None
    reference_is_policy: bool = False
    slow_evals: float = 0.0
    batch_log: str | None = None
    _poisoned: set[int] = field(default_factory=set)

    @classmethod
    def from_env(cls, env: dict | None = None) -> "Faults":
        env = dict(os.environ if env is None else env)
        nan = env.get("WORKBENCH_TEST_NAN_STEPS", "")
        return cls(sigterm_at=_int(env, "WORKBENCH_TEST_SIGTERM_AT_STEP"),
                   kill_at=_int(env, "WORKBENCH_TEST_KILL_AT_STEP"),
                   oom_at=_int(env, "WORKBENCH_TEST_OOM_AT_STEP"),
                   nan_steps=frozenset(int(s) for s in nan.split(",") if s.strip()),
                   nan_always=env.get("WORKBENCH_TEST_NAN_ALWAYS") == "1",
                   fail_save_at=_int(env, "WORKBENCH_TEST_FAIL_SAVE_AT_STEP"),
                   pause_in_save=env.get("WORKBENCH_TEST_PAUSE_IN_SAVE") or None,
                   pause_marker=env.get("WORKBENCH_TEST_PAUSE_MARKER") or None,
                   pause_seconds=float(env.get("WORKBENCH_TEST_PAUSE_SECONDS", "30")),
                   reference_is_policy=env.get("WORKBENCH_TEST_REFERENCE_IS_POLICY") == "1",
                   pause_after_shard=_int(env, "WORKBENCH_TEST_PAUSE_AFTER_SHARD"),
                   slow_evals=float(env.get("WORKBENCH_TEST_SLOW_EVALS") or 0.0),
                   batch_log=env.get("WORKBENCH_TEST_BATCH_LOG") or None)

    def poison_step(self, step: int) -> bool:
        """Whether the loss of optimizer step ``step`` (1-based) is to be made NaN."""
        if step not in self.nan_steps or (step in self._poisoned and not self.nan_always):
            return False
        self._poisoned.add(step)
        return True

    def after_step(self, step: int) -> None:
        """After optimizer step ``step`` and its log record: stop, crash or run out of memory."""
        if step == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        if step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == self.oom_at:  # what torch.OutOfMemoryError says (the trainer recognises it by its text)
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (test hook)")

    def _pause(self) -> None:
        if self.pause_marker:
            Path(self.pause_marker).write_text(str(os.getpid()))
        time.sleep(self.pause_seconds)

    def in_save(self, point: str, step: int) -> None:
        """At ``point`` of a checkpoint save: pause (to be killed there) or fail as a full disk would."""
        if self.pause_in_save == point:
            self._pause()
        if point == "after_model" and step == self.fail_save_at:
            raise OSError(errno.ENOSPC, "No space left on device")

    def in_eval(self, step: int) -> None:
        """An eval after step 0: slower, as on a machine that got busier."""
        if self.slow_evals and step > 0:
            time.sleep(self.slow_evals)

    def trained_rows(self, step: int, micro: int, rank: int, inputs: Any) -> None:
        """The rows (input tokens; anything with ``tolist``) rank ``rank`` trains in micro-batch ``micro`` of
        step ``step``, appended to its batch log."""
        if self.batch_log:
            with open(Path(self.batch_log) / f"rank{rank}.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "micro": micro, "rows": inputs.tolist()}) + "\n")

    def after_shard(self, shards_written: int) -> None:
        """Corpus preparation: pause (to be killed there) once this many token shards are on disk."""
        if self.pause_after_shard is not None and shards_written == self.pause_after_shard:
            self._pause()


NO_FAULTS = Faults()
