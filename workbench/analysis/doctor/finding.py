"""A finding of the run doctor: what is wrong, the numbers from the run that show it, and the change."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.rundir import PRESET_FILE

# Most important first. "high": the run is failing or wasting most of its time; "medium": a clear
# problem worth fixing before the next run; "low": worth knowing, the run is fine without it.
SEVERITIES = ("high", "medium", "low")
# Within a severity: what breaks a run before what slows it, before what makes it learn less; last, the queue
# around it (runs waiting with no runner: ``workbench.queue.doctor``, added by `workbench doctor` and the TUI).
KINDS = ("unstable", "memory", "slow", "overfitting", "data", "preference", "reward", "queue")


@dataclass(frozen=True)
class Finding:
    kind: str                        # one of KINDS
    code: str                        # a stable name, "kind.what" (slow.busy_cpu, unstable.nonfinite, ...)
    severity: str                    # one of SEVERITIES
    title: str                       # one line: what is wrong
    evidence: tuple[str, ...]        # the numbers from the run (and the machine) that show it
    change: str                      # the concrete change: a `--set ...` line or a command
    set: dict[str, Any] = field(default_factory=dict)   # the --set of `change`, key -> value ({} for a command)
    command: str = ""                # a whole command line that applies it, where there is one
    also: tuple[str, ...] = ()       # other changes that would help
    step: int | None = None          # the step it was seen at (or first seen)
    data: dict[str, Any] = field(default_factory=dict)  # the numbers, for scripts

    def sort_key(self) -> tuple:
        return (SEVERITIES.index(self.severity), KINDS.index(self.kind), self.step or 0)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "code": self.code, "severity": self.severity, "title": self.title,
                "evidence": list(self.evidence), "change": self.change, "set": dict(self.set),
                "command": self.command, "also": list(self.also), "step": self.step, "data": dict(self.data)}


def toml_value(v: Any) -> str:
    """A value as --set takes it on a shell's command line: 0.2, 300, true, a bare word (auto, bf16) as
    --set reads one, other text as a quoted TOML string."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        text = f"{v:.6g}"
        return text + ".0" if re.fullmatch(r"-?\d+", text) else text  # 1.0, not 1: TOML's float
    if isinstance(v, int):
        return str(v)
    text = str(v)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", text) and text not in ("true", "false", "inf", "nan"):
        return text
    return "'" + json.dumps(text).replace("'", "'\\''") + "'"


def set_line(values: dict[str, Any]) -> str:
    """``--set k=v k2=v2`` for these overrides."""
    return "--set " + " ".join(f"{k}={toml_value(v)}" for k, v in values.items())


def shown_path(path: Path) -> str:
    """A path as a user would type it here: relative to the working directory when it is below it."""
    try:
        rel = Path(path).resolve().relative_to(Path.cwd().resolve())
        return str(rel) if str(rel) != "." else str(path)
    except (ValueError, OSError):
        return str(path)


def new_run_command(run_dir: Path, values: dict[str, Any]) -> str:
    """Train the run's own preset again (its preset.toml, with every override it had) with these changes."""
    preset = shown_path(Path(run_dir) / PRESET_FILE)
    if " " in preset:
        preset = f"'{preset}'"
    return f"workbench train {preset} {set_line(values)}"


# Keys `workbench resume` may change (training keys, hardware, dropout); the rest need a new run.
def resumable(key: str) -> bool:
    section, _, name = key.partition(".")
    return section in ("train", "hardware") or key == "model.dropout"


def resume_command(run_id: str, values: dict[str, Any]) -> str:
    return f"workbench resume {run_id} {set_line(values)}"


def percent(x: float) -> str:
    return f"{100 * x:.0f} %" if x >= 0.1 else f"{100 * x:.1f} %"


def num(x: float) -> str:
    """A count or rate with thousands separators, 3 significant digits below 100."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def env_path_hint() -> str:
    """Where the token cache lives (the data-wait change moves it)."""
    return os.environ.get("WORKBENCH_CACHE_DIR") or "~/.cache/workbench"
