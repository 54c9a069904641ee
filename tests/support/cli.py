"""The real CLI in a subprocess, and the overrides that make a preset tiny."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import zygote

REPO = Path(__file__).resolve().parents[2]

# A tiny model on a small slice of the built-in corpus: a few steps take about a second.
TINY = [
    "model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.seq_len=32",
    "model.vocab_size=512", "train.batch_size=4", "train.warmup_iters=2", "train.eval_iters=2",
    "train.log_interval=1", "data.builtin_mb=0.3", "data.tokenizer_sample_mb=0.3", "hardware.nproc=1",
    # tiny models: a compile would not pay back (auto compiles CPU runs of 10 minutes or more)
    "hardware.compile=false",
    # the suite's runs keep AdamW + cosine (cpu-small's default until 2026-11-27: what its tests were written
    # against); the shipped recipe, Muon + wsd, has its own (tests/train/test_optim.py)
    "train.optimizer=adamw", "train.schedule=cosine",
]

# bench/gpu_check.sh's ~124 M config (as overrides of gpu-8gb), measured on an H100 (README, GPU numbers)
# without QK-norm, before it became the presets' default
G124 = ["model.qk_norm=false", "model.vocab_size=32768", "model.dim=768", "model.n_layers=12", "model.n_heads=12",
        "model.n_kv_heads=12", "model.ffn_hidden=2560", "model.seq_len=1024", "model.dropout=0.0",
        "train.batch_size=32", "hardware.activation_checkpointing=false", "hardware.chunked_loss=false"]

# What the facts_run fixture's model learns by heart ("code 003 means cloud."): known greedy answers.
FACTS = [(f"code {i:03d} means", word) for i, word in
         enumerate("apple river stone cloud maple tiger ocean candle silver garden rocket violin".split())]


def tiny(*extra: str) -> list[str]:
    return ["--set", *TINY, *extra]


def wb(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300,
       check: bool = False, fresh: bool = False, input: str | None = None) -> subprocess.CompletedProcess:
    """Run the real `workbench` CLI in a process of its own: forked from a server that has torch imported
    (tests/support/zygote.py), or with ``fresh`` a new interpreter (what depends on the interpreter's start).
    ``input``: what it reads on standard input (else nothing: /dev/null)."""
    e = dict(os.environ, PYTHONUNBUFFERED="1")
    e.update(env or {})
    cp = None if fresh else zygote.run(list(args), str(cwd) if cwd else None, e, timeout, input)
    if cp is None:
        cp = subprocess.run([sys.executable, "-m", "workbench", *args], cwd=cwd, env=e, capture_output=True,
                            text=True, timeout=timeout, input=input,
                            stdin=subprocess.DEVNULL if input is None else None)
    if check and cp.returncode != 0:
        raise AssertionError(f"workbench {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}")
    return cp
