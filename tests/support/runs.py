"""Reading a run back as a test sees it: its records, its losses and evals by step, its state over time,
and a snapshot of a directory tree (to show nothing changed, or nothing was left behind)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable

from workbench.rundir import RunStatus, read_status


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def records_since_last_start(run_dir: Path) -> list[dict]:
    """metrics.jsonl from the last start or resume on."""
    recs = read_jsonl(Path(run_dir) / "metrics.jsonl")
    last = max(i for i, r in enumerate(recs) if r.get("event") in ("start", "resume"))
    return recs[last:]


def losses(run_dir: Path, since_last_start: bool = False) -> dict[int, float]:
    """step -> training loss (a step logged again after a resume or rollback: its last value)."""
    recs = records_since_last_start(run_dir) if since_last_start else read_jsonl(Path(run_dir) / "metrics.jsonl")
    return {r["step"]: r["loss"] for r in recs if r["kind"] == "train"}


def evals(run_dir: Path) -> dict[int, float]:
    """step -> validation loss."""
    return {r["step"]: r["val_loss"] for r in read_jsonl(Path(run_dir) / "metrics.jsonl") if r["kind"] == "eval"}


def wait_until(cond: Callable[[], Any], timeout: float = 60.0, what: str = "a condition", every: float = 0.1) -> Any:
    """``cond()``'s first true value, polled every ``every`` seconds; an AssertionError naming ``what`` after
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (v := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
    return v


def wait_running(run_dir: Path, min_step: int, timeout: float = 120) -> RunStatus:
    """The status of a detached run once its trainer is running at or past ``min_step`` (the last status read,
    whatever it says, after ``timeout``: the caller asserts on it)."""
    end = time.time() + timeout
    st = RunStatus()
    while time.time() < end:
        if (Path(run_dir) / "status.json").is_file():
            st = read_status(run_dir)
            if st.state == "running" and st.step >= min_step:
                break
        time.sleep(0.2)
    return st


def tree(root: Path, text: bool = False) -> dict[str, str]:
    """Every file under ``root`` (its SHA-256, or with ``text`` its text) and every directory ("<dir>"), by
    relative path: equal snapshots mean nothing was written, changed, or left behind, not even an empty
    directory."""
    root = Path(root)
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): "<dir>" if p.is_dir() else p.read_text() if text
            else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}
