"""Fixtures for the TUI tests: canned run directories, and one real tiny run for the panes that run the real
subprocesses (the app factory and waits: tests.support.tui)."""

from __future__ import annotations

import os
import shutil

import psutil
import pytest

from tests.support.canned_runs import make_runs
from tests.support.chat import CHAT_SFT, conversations, write_jsonl
from tests.support.cli import wb
from tests.support.shared import built_once

# The real run of the Sample pane's and the Runs pane's eval/export tests (test_sample_real, test_eval_export_real):
# ~20 steps of a tiny model on the built-in corpus, checkpoints at 10 and 20, the trainer's samples of "import".
REAL_RUN = ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.seq_len=32",
            "model.vocab_size=512", "train.batch_size=4", "train.warmup_iters=2", "train.eval_iters=2",
            "train.max_iters=20", "train.eval_interval=10", "train.ckpt_interval=10", "data.builtin_mb=0.3",
            "data.tokenizer_sample_mb=0.3", "train.sample_prompt=import", "train.sample_tokens=8",
            "hardware.compile=false"]


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    """alpha (finished), beta (stopped), gamma (failed); user presets go to tmp."""
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    return make_runs(tmp_path / "runs")


@pytest.fixture
def live_runs_dir(tmp_path, monkeypatch):
    """The same plus delta, 'running' under this test process's pid (never stop it!)."""
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    me = psutil.Process(os.getpid())
    return make_runs(tmp_path / "runs", live_pid=me.pid, live_pid_start=me.create_time())


@pytest.fixture(scope="session")
def real_run_once(tmp_path_factory):
    """``t``, trained once for the session, whatever the number of test workers (each module trained its own, the
    same run, and then each worker: issue 54's CI time)."""
    def train(out):
        wb("train", "cpu-small", "--name", "t", "--runs-dir", str(out / "runs"), "--set", *REAL_RUN, check=True)
    root = built_once(tmp_path_factory, "real-run", train) / "runs"
    assert (root / "t" / "checkpoints" / "step_0000010" / "meta.json").is_file()
    return root


@pytest.fixture
def real_runs(real_run_once, tmp_path):
    """A runs directory of this test's own holding a copy of ``t`` (a finished real run, checkpoints at steps 10 and
    20): the tests write into it (task scores, exports beside it, samples)."""
    return shutil.copytree(real_run_once, tmp_path / "runs")


@pytest.fixture(scope="session")
def chat_sft_once(tmp_path_factory):
    """``sft``: a finished chat-tuned run (tests.support.chat.CHAT_SFT: 60 steps on 300 generated conversations,
    checkpoints at 10, 20, ..., 60), trained once for the session whatever the number of test workers: the Sample
    pane's chat modules (test_ab_picks, test_sample_picks, test_train_on_picks, test_chat_server) each trained the
    same run (issue 54's CI time)."""
    def train(out):
        corpus = write_jsonl(out / "chat.jsonl", conversations(300, seed=1))
        wb("train", "cpu-small", "--corpus", str(corpus), "--runs-dir", str(out / "runs"), "--name", "sft",
           "--set", *CHAT_SFT, check=True)
    root = built_once(tmp_path_factory, "chat-sft", train) / "runs"
    steps = [int(p.name.split("_")[1]) for p in sorted((root / "sft" / "checkpoints").glob("step_*"))]
    assert steps == [10, 20, 30, 40, 50, 60], steps
    return root


@pytest.fixture(scope="module")
def chat_sft(chat_sft_once, tmp_path_factory):
    """A runs directory of this module's own holding a copy of ``sft`` (chat_sft_once): its tests write into it
    (picks, ratings, a DPO run beside it)."""
    return shutil.copytree(chat_sft_once, tmp_path_factory.mktemp("chat-sft") / "runs")
