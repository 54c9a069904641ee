"""Shared fixtures: one cache of tokenizers/corpora for the whole session, tiny presets, CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A tiny model on a small slice of the built-in corpus: a few steps take about a second.
TINY = [
    "model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.seq_len=32",
    "model.vocab_size=512", "train.batch_size=4", "train.warmup_iters=2", "train.eval_iters=2",
    "train.log_interval=1", "data.builtin_mb=0.3", "data.tokenizer_sample_mb=0.3", "hardware.nproc=1",
    # tiny models: a compile would not pay back (auto compiles CPU runs of 10 minutes or more)
    "hardware.compile=false",
]


# bench/gpu_check.sh's ~124 M config (as overrides of gpu-8gb), measured on an H100 (README, GPU numbers)
# without QK-norm, before it became the presets' default
G124 = ["model.qk_norm=false", "model.vocab_size=32768", "model.dim=768", "model.n_layers=12", "model.n_heads=12",
        "model.n_kv_heads=12", "model.ffn_hidden=2560", "model.seq_len=1024", "model.dropout=0.0",
        "train.batch_size=32", "hardware.activation_checkpointing=false", "hardware.chunked_loss=false"]


def tiny(*extra: str) -> list[str]:
    return ["--set", *TINY, *extra]


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory):
    """Tokenizers and encoded corpora are cached once per test session (subprocesses inherit it)."""
    d = tmp_path_factory.mktemp("wbcache")
    old = os.environ.get("WORKBENCH_CACHE_DIR")
    os.environ["WORKBENCH_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("WORKBENCH_CACHE_DIR", None)
    else:
        os.environ["WORKBENCH_CACHE_DIR"] = old


def wb(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300,
       check: bool = False) -> subprocess.CompletedProcess:
    """Run the real `workbench` CLI in a subprocess."""
    e = dict(os.environ, PYTHONUNBUFFERED="1")
    e.update(env or {})
    cp = subprocess.run([sys.executable, "-m", "workbench", *args], cwd=cwd, env=e, capture_output=True,
                        text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and cp.returncode != 0:
        raise AssertionError(f"workbench {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}")
    return cp


def wait_running(run_dir: Path, min_step: int, timeout: float = 120):
    """The status (a RunStatus) of a detached run once its trainer is running at or past ``min_step``."""
    import time

    from workbench.rundir import RunStatus, read_status
    end = time.time() + timeout
    st = RunStatus()
    while time.time() < end:
        if (run_dir / "status.json").is_file():
            st = read_status(run_dir)
            if st.state == "running" and st.step >= min_step:
                break
        time.sleep(0.2)
    return st


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """One tiny real run on the built-in corpus, shared by the tests that only read it."""
    root = tmp_path_factory.mktemp("runs")
    wb("train", "cpu-small", "--name", "tiny", "--runs-dir", str(root),
       *tiny("train.max_iters=60", "train.eval_interval=20", "train.ckpt_interval=20", "model.dropout=0.1",
             "train.lr=3e-3"), check=True)
    return root / "tiny"
