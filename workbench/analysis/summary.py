"""One run at a glance, for ``workbench runs`` and the Runs pane: state, progress, losses, memory
measured beside the estimate, the share of its wall-clock spent in evals and checkpoint saves, checkpoints, disk
use, the newest task scores. Read from the run directory (no torch). ``list_runs``: every run, in the one order
both show (newest first), with each file's bytes counted once."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from workbench.analysis.report_card import latest_headline
from workbench.analysis.time_spent import latest_time_spent
from workbench.config import load_preset_file
from workbench.config.objectives import OBJECTIVES, SFT
from workbench.errors import WorkbenchError
from workbench.fs import dir_size, dir_usage
from workbench.machine.detect import Machine
from workbench.plan.fit.memory import estimate_memory
from workbench.rundir import (
    METRICS_FILE,
    PRESET_FILE,
    EvalRecord,
    TrainRecord,
    best_checkpoint,
    first_event,
    iter_run_dirs,
    last_records,
    list_checkpoints,
    parent_of,
    read_status,
)


@dataclass
class RunSummary:
    id: str
    path: str
    state: str
    preset: str
    step: int
    max_iters: int
    train_loss: float | None = None
    val_loss: float | None = None
    val_bpb: float | None = None      # bits per byte of the last eval (comparable across tokenizers); None for a
    #                                   preference run, whose val loss is its objective's (per pair), not a text loss
    objective: str = SFT              # train.objective: a name of the table of objectives (config.objectives)
    best_val_loss: float | None = None
    tokens_per_s: float | None = None
    mem_mb: float | None = None
    checkpoints: list[dict] = field(default_factory=list)
    disk_bytes: int = 0               # its files, each once; in list_runs less those an older run holds too
    shared_bytes: int = 0             # list_runs: its files an older run holds too (hard links: a branch's checkpoint)
    error: str | None = None
    started: float | None = None
    created: float = 0.0              # when the run was made: its start, a branch's resume, else its preset.toml's
    device: str | None = None
    parent: str | None = None         # "run@step" for a run branched from another run's checkpoint
    source: str | None = None         # the model its weights first came from (`workbench import`): its directory
    architecture: str | None = None   # ... and that model's architecture (LlamaForCausalLM, ...)
    init: str | None = None           # "run@step" whose weights it started from (--init-from)
    finetune: str | None = None       # full | lora, for a run started from another's weights
    est_mem_mb: float | None = None   # the estimator's figure for what mem_mb measures
    mem_err_pct: float | None = None  # (measured - estimate) / estimate
    # The run's wall-clock so far and its seconds in evals and checkpoint saves, as of its newest eval record or
    # its end (analysis.time_spent); the shares are of the wall-clock. None: not recorded (an older trainer).
    elapsed_s: float | None = None
    eval_s: float | None = None
    ckpt_s: float | None = None
    eval_share: float | None = None
    ckpt_share: float | None = None
    task_step: int | None = None      # the newest step with task scores, and its headline scores
    tasks: dict[str, dict] = field(default_factory=dict)   # task -> {"metric", "value", "n"}
    val_sources: dict[str, float] = field(default_factory=dict)  # a mixture's last eval: each source's val loss


def estimate_for_run(run_dir: Path, device: str, precision: str) -> float | None:
    """MiB the estimator predicts for the figure the trainer logs as mem_mb
    (peak allocated on CUDA/MPS, the whole process's RSS on CPU), on the device the run used."""
    try:
        p = load_preset_file(Path(run_dir) / PRESET_FILE)
        m = estimate_memory(p, precision, device, machine=Machine.assumed(device))
    except (WorkbenchError, OSError, ValueError):
        return None
    return (m.total if device == "cpu" else m.peak_allocated) / 2**20


def _mtime(path: Path) -> float:
    """When ``path`` was written (a run's preset.toml: when the run was made; an imported model never starts)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def summarize_run(run_dir: Path) -> RunSummary:
    run_dir = Path(run_dir)
    st = read_status(run_dir)
    try:
        data = tomllib.loads((run_dir / PRESET_FILE).read_text())
    except (OSError, ValueError):
        data = {}
    preset = data.get("name", "?")
    objective = (data.get("train") or {}).get("objective", SFT)
    s = RunSummary(id=run_dir.name, path=str(run_dir), state=st.state, preset=preset,
                   objective=objective if isinstance(objective, str) else SFT, step=st.step,
                   max_iters=st.max_iters, error=st.error, started=st.started, best_val_loss=st.best_val_loss,
                   created=st.started or st.resumed or _mtime(run_dir / PRESET_FILE))
    evals: list[float] = []
    spec = OBJECTIVES.get(s.objective)  # a past run's may be a name this version does not know: no text loss then
    text_loss = spec is not None and not spec.preference
    tail = last_records(run_dir / METRICS_FILE)
    if (ts := latest_time_spent(tail)) is not None:
        s.elapsed_s, s.eval_s, s.ckpt_s = ts.elapsed_s, ts.eval_s, ts.ckpt_s
        s.eval_share, s.ckpt_share = ts.eval_share, ts.ckpt_share
    for r in tail:
        if isinstance(r, TrainRecord):
            s.train_loss, s.tokens_per_s = r.loss, r.tokens_per_s
            if r.peak_mem_mb is not None:
                s.mem_mb = max(s.mem_mb or 0.0, r.peak_mem_mb)
        elif isinstance(r, EvalRecord):
            s.val_loss, s.val_bpb = r.val_loss, r.val_bpb if text_loss else None
            s.val_sources = dict(r.extra.get("val_sources") or {})
            if r.val_loss is not None:
                evals.append(r.val_loss)
    start = first_event(run_dir / METRICS_FILE, ("start", "resume"))  # a branch starts with a resume
    if start and start.get("device"):
        s.device = str(start.get("device")).split(":")[0]
        s.est_mem_mb = estimate_for_run(run_dir, s.device, start.get("precision", "fp32"))
        if s.est_mem_mb and s.mem_mb:
            s.mem_err_pct = 100.0 * (s.mem_mb - s.est_mem_mb) / s.est_mem_mb
    if (par := parent_of(run_dir)):
        s.parent = f"{par[0]}@{par[1]}"
    src, init = data.get("source"), data.get("init")
    if isinstance(src, dict) and isinstance(src.get("model"), str):
        s.source, s.architecture = src["model"], src.get("architecture")
    if isinstance(init, dict) and "run" in init and "step" in init:
        s.init = f"{init['run']}@{init['step']}"
        s.finetune = (data.get("train") or {}).get("finetune", "full")
    s.checkpoints = list_checkpoints(run_dir)
    if s.best_val_loss is None:  # as the Train pane says it (tui.rundata.RunData.best_val): then the evals seen
        b = best_checkpoint(s.checkpoints)
        s.best_val_loss = min(evals) if evals else b["val_loss"] if b else None
    if (latest := latest_headline(run_dir)):
        s.task_step = latest[0]
        s.tasks = {t: {"metric": r.metric, "value": r.value, "n": r.n} for t, r in latest[1].items()}
    s.disk_bytes = dir_size(run_dir)
    return s


def list_runs(root: Path) -> list[RunSummary]:
    """Every run in the runs directory ``root``, newest first (when each was made: an imported model and a branch
    too, which have no start time), the one order of `workbench runs` and the Runs pane. A file several runs hold
    (hard links: a branch's first checkpoint is its parent's, a fine-tune's init/ weights its source's) is counted
    once, in the disk use of the oldest run holding it, and in the others' ``shared_bytes``: the rows add up to
    what the runs take on the disk."""
    runs = []
    for p in iter_run_dirs(Path(root)):
        try:
            runs.append(summarize_run(p))
        except Exception:  # noqa: BLE001 - a run deleted or half-written while read is left out of this listing
            continue
    runs.sort(key=lambda s: (s.created, s.id), reverse=True)
    seen: set[tuple[int, int]] = set()
    for s in reversed(runs):
        s.disk_bytes, s.shared_bytes = dir_usage(s.path, seen)
    return runs


def descendants(runs: list[RunSummary], run_id: str) -> list[tuple[RunSummary, str]]:
    """The runs that come from ``run_id``: its branches and the runs fine-tuned from it (--init-from), then theirs,
    each with how it came from its origin ("branched from w at step 5", "LoRA from w at step 10"), oldest first
    at each remove."""
    out: list[tuple[RunSummary, str]] = []
    todo, seen = [run_id], {run_id}
    oldest_first = sorted(runs, key=lambda r: (r.created, r.id))
    while todo:
        origin = todo.pop(0)
        for r in oldest_first:
            if r.id in seen:
                continue
            if r.parent:  # a branch (its preset keeps the [init] of the fine-tune it branched from)
                if r.parent.rsplit("@", 1)[0] != origin:
                    continue
                how = f"branched from {origin} at step {r.parent.rsplit('@', 1)[1]}"
            elif r.init and r.init.rsplit("@", 1)[0] == origin:
                how = (f"{'LoRA' if r.finetune == 'lora' else 'full fine-tune'} from {origin} at step "
                       f"{r.init.rsplit('@', 1)[1]}")
            else:
                continue
            out.append((r, how))
            seen.add(r.id)
            todo.append(r.id)
    return out
