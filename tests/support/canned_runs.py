"""Canned run directories for the TUI tests: fixed numbers, no clocks, no torch.

``make_runs(root)`` writes three runs that look exactly like the trainer's output (through the typed records:
``tests.support.rundirs``):

- ``alpha``  finished, 400 steps, evals every 100, checkpoints at 200 and 400
- ``beta``   stopped at step 150 of 400, one checkpoint, a non-finite skip event
- ``gamma``  failed at step 20 with an error

``live_pid`` (with ``live_pid_start``) adds ``delta``, a run whose status says
running under that pid, so the TUI treats it as live.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

from tests.support.rundirs import RunDir

PRESET = """name = "{preset}"
[model]
vocab_size = 512
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
seq_len = 64

[train]
batch_size = 4
max_iters = {max_iters}
warmup_iters = 2
eval_interval = 100
ckpt_interval = 200
"""

T0 = 1_700_000_000.0  # a fixed "started" time


def _loss(step: int, offset: float = 0.0) -> float:
    return round(6.2 * math.exp(-step / 120) + 2.1 + offset + 0.05 * math.sin(step), 4)


def _write_run(root: Path, rid: str, preset: str, max_iters: int, last_step: int, state: str,
               offset: float, ckpts: list[int], extra_events: list[dict] | None = None,
               error: str | None = None, pid: int | None = None, pid_start: float | None = None,
               started: float = T0) -> Path:
    tokens_per_step = 4 * 64
    # (step, write) in the order the trainer writes them; the extra events go before their step's records
    items: list[tuple[int, Callable[[RunDir], None]]] = [
        (0, lambda r: r.event("start", 0, device="cpu", precision="fp32", params=131392, compile=False))]
    for step in range(10, last_step + 1, 10):
        items.append((step, lambda r, step=step: r.train(
            step, _loss(step, offset), lr=1e-3 * min(1, step / 20), tokens_per_s=25600.0,
            tokens_seen=step * tokens_per_step, elapsed_s=step * 0.1, mem_mb=310.5, grad_norm=1.25, mfu=0.0123,
            skipped=1 if (extra_events and step >= 60) else 0)))
        if step % 100 == 0:
            items.append((step, lambda r, step=step: r.eval(step, _loss(step, offset), _loss(step, offset + 0.15))))
        if step in ckpts:
            items.append((step, lambda r, step=step: r.event("checkpoint", step,
                                                            message=f"saved checkpoints/step_{step:07d}")))
    for e in extra_events or []:
        at = next(i for i, (s, _w) in enumerate(items) if s >= e["step"])
        items.insert(at, (e["step"], lambda r, e=e: r.event(e["event"], e["step"], message=e["message"])))
    if state in ("finished", "stopped", "failed"):
        items.append((last_step, lambda r: r.event({"finished": "finish", "stopped": "stop", "failed": "error"}[state],
                                                   last_step, message=error or state)))
    with RunDir(root, rid, PRESET.format(preset=preset, max_iters=max_iters)) as r:
        for _step, write in items:
            write(r)
        r.status(state=state, pid=pid or 999999, pid_start=pid_start, step=last_step, max_iters=max_iters,
                 error=error, started=started, compiling=False)
        r.write_text("train.log", "".join(f"step {s:5d} | loss {_loss(s, offset):.4f}\n"
                                          for s in range(10, last_step + 1, 10)))
        r.write_text("samples.jsonl", "".join(
            json.dumps({"step": s, "prompt": "def ", "text": f"foo_{s}(x):\n    return x"}) + "\n"
            for s in range(100, last_step + 1, 100)))
        for s in ckpts:
            r.checkpoint(s, train_loss=_loss(s, offset), val_loss=_loss(s, offset + 0.15),
                         tokens_seen=s * tokens_per_step, wall_time=T0 + s, elapsed_s=s * 0.1)
    return r.path


def make_runs(root: Path, live_pid: int | None = None, live_pid_start: float | None = None) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _write_run(root, "alpha", "cpu-small", 400, 400, "finished", 0.0, [200, 400], started=T0)
    _write_run(root, "beta", "cpu-small", 400, 150, "stopped", 0.3, [100],
               extra_events=[{"kind": "event", "event": "nonfinite_skip", "step": 60,
                              "message": "loss was nan; step skipped"}], started=T0 + 100)
    _write_run(root, "gamma", "medium", 1000, 20, "failed", 0.5, [],
               error="CUDA out of memory; lower train.batch_size", started=T0 + 200)
    if live_pid:
        _write_run(root, "delta", "cpu-small", 400, 120, "running", 0.1, [100], pid=live_pid,
                   pid_start=live_pid_start, started=T0 + 300)
    return root


HARDWARE = {
    "host": "fixture", "os": "Linux", "python": "3.11",
    "cpu": {"model": "Fixture CPU 9000", "arch": "x86_64", "physical_cores": 8, "logical_cores": 16,
            "usable_cores": 16, "ram_total": 64 * 1024 ** 3, "ram_available": 48 * 1024 ** 3,
            "native_bf16": False},
    "nvidia": [{"index": 0, "name": "NVIDIA GeForce RTX 4060", "vram_total": 8 * 1024 ** 3,
                "vram_used": 1024 ** 3, "vram_free": 7 * 1024 ** 3, "compute_capability": "8.9",
                "driver": "560.35", "utilization_pct": 12, "temperature_c": 45, "power_w": 30.0,
                "power_limit_w": 115.0}],
    "nvidia_note": "1 NVIDIA GPU(s)", "mps": False, "cxx": True,
}
