"""What the Sample pane reads from a run directory: its checkpoints as the selects' choices (``latest`` and
``best`` resolved to the step they mean now), the A/B picks saved so far, the trainer's own eval samples."""

from __future__ import annotations

from pathlib import Path

from workbench.rundir import PREFERENCES_FILE, SAMPLES_FILE, list_checkpoints, read_jsonl_tail, select_checkpoint


def count_picks(run_dir: Path) -> int:
    """The preference pairs saved in the run's preferences.jsonl (F5 / F6): its non-blank lines; 0 without it."""
    try:
        with open(run_dir / PREFERENCES_FILE, "rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0



def checkpoint_options(run_dir: Path) -> list[tuple[str, str]]:
    opts = [("latest", "latest"), ("best", "best")]
    for c in reversed(list_checkpoints(run_dir)):
        val = c.get("val_loss")
        label = f"step {c['step']}" + (f" (val {val:.3f})" if isinstance(val, (int, float)) else "")
        opts.append((label, str(c["step"])))
    return opts


def resolve_checkpoint(run_dir: Path, choice: str) -> str:
    """``latest`` / ``best`` as the step they mean now (a step stays as it is); the choice
    itself when it cannot be resolved, so that the sampler reports why."""
    if choice not in ("latest", "best"):
        return choice
    try:
        return str(select_checkpoint(run_dir, choice)["step"])
    except Exception:
        return choice


def trainer_samples(run_dir: Path, limit: int = 20) -> list[dict]:
    """The last ``limit`` entries of samples.jsonl (reads only the file's tail)."""
    recs = read_jsonl_tail(run_dir / SAMPLES_FILE, tail_bytes=32768)
    return recs[-limit:]
