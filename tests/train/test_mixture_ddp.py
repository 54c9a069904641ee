"""A mixture (data.mixture) trained by two processes (torchrun, gloo, on the CPU), killed with SIGKILL (the CLI,
torchrun and both ranks, wherever they are once rank 0 has drawn a step picked at random) and resumed: the token
stream each rank trained, concatenated over the two pieces, equals the uninterrupted run's; each step's rows are
the mixture's planned global batch, rank 0 the first half of it and rank 1 the second (each rank its slice of the
same order)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.support.cli import tiny, wb
from tests.support.mixtures import write_two_corpora
from tests.support.runs import losses, read_jsonl
from workbench import cli_client, rundir
from workbench.config import resolve_preset
from workbench.data.preset_data import prepare_data

pytestmark = pytest.mark.slow

STEPS = 12
RUN = (f"train.max_iters={STEPS}", f"train.lr_decay_iters={STEPS}", "train.ckpt_interval=3",
       f"train.eval_interval={STEPS}", "train.batch_size=4", "model.dropout=0.1")


def _corpora(d: Path) -> list[str]:
    """Two small text corpora of different look (made-up words; number words), as --corpus items 0.7 / 0.3."""
    write_two_corpora(d)
    return ["--corpus", f"words={d / 'words.txt'}:0.7", f"nums={d / 'nums.txt'}:0.3"]


def _killed_at(args: list[str], log: Path, step: int) -> None:
    """Run ``workbench ARGS`` (two processes under torchrun) until rank 0 has drawn the rows of ``step``, then
    SIGKILL it whole: the CLI, torchrun and both ranks (each rank is in a session of its own). Fresh interpreters,
    as a user's are: forked from the tests' spawn server, torchrun and the ranks would be its children, not the
    CLI's descendants."""
    p = cli_client.popen([sys.executable, "-m", "workbench", *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                         env=dict(os.environ, WORKBENCH_TEST_BATCH_LOG=str(log), WORKBENCH_TEST_SPAWN=""))
    end = time.time() + 120
    while max((r["step"] for r in _records(log, 0)), default=0) < step:
        assert p.poll() is None and time.time() < end, f"the run ended before step {step} ({p.returncode})"
        time.sleep(0.02)
    tree = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    for proc in tree:
        proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree, timeout=30)
    p.wait()


def _records(log: Path, rank: int) -> list[dict]:
    f = log / f"rank{rank}.jsonl"
    if not f.exists():
        return []
    lines = f.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]  # a line cut by the kill: not a record


def _stream(log: Path, rank: int) -> dict[int, list]:
    """The rows a rank trained at each step, over the pieces of the run in the order they ran (a step trained again
    after the resume, from the checkpoint before the kill, must be the same rows as the first time)."""
    out: dict[int, list] = {}
    for r in _records(log, rank):
        assert r["micro"] == 0
        if r["step"] in out:
            assert out[r["step"]] == r["rows"], f"rank {rank} drew other rows at step {r['step']} when resumed ({log})"
        out[r["step"]] = r["rows"]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mixddp")
    base = ["train", "cpu-small", *_corpora(root), "--runs-dir", str(root), "--nproc", "2"]
    (root / "log-straight").mkdir()
    (root / "log-killed").mkdir()
    wb(*base, "--name", "straight", *tiny(*RUN), env={"WORKBENCH_TEST_BATCH_LOG": str(root / "log-straight")},
       check=True)
    at = random.randint(4, STEPS - 2)   # any step must do: after the first checkpoint (step 3: one every 3 steps)
    (root / "killed-at").write_text(str(at))
    _killed_at([*base, "--name", "killed", *tiny(*RUN)], root / "log-killed", at)
    wb("resume", "killed", "--runs-dir", str(root), env={"WORKBENCH_TEST_BATCH_LOG": str(root / "log-killed")},
       check=True)
    return root


def test_killed_and_resumed_on_two_processes_trains_the_same_token_stream(runs):
    straight = [_stream(runs / "log-straight", rank) for rank in (0, 1)]
    killed = [_stream(runs / "log-killed", rank) for rank in (0, 1)]
    at = (runs / "killed-at").read_text()
    for rank in (0, 1):
        assert sorted(straight[rank]) == sorted(killed[rank]) == list(range(1, STEPS + 1)), f"killed at step {at}"
        assert killed[rank] == straight[rank], f"rank {rank}, killed once rank 0 drew step {at}"
    assert straight[0] != straight[1]                          # each rank its own rows
    d = runs / "killed"
    assert rundir.read_status(d).state == "finished"
    assert [r.get("event") for r in read_jsonl(d / "metrics.jsonl")].count("resume") == 1
    assert losses(d) == losses(runs / "straight")              # and the same losses, bitwise


def test_each_rank_trains_its_half_of_the_mixtures_planned_batch(runs):
    """The rows are the plan's: a sampler of the run's preset, drawn in-process, gives each step's global batch of
    4 rows; rank 0 trained rows 0-1 of it and rank 1 rows 2-3."""
    p = resolve_preset(str(runs / "straight" / "preset.toml"))
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: None)
    sampler = data.sampler("train", p, p.train.seed)
    streams = [_stream(runs / "log-straight", rank) for rank in (0, 1)]
    for step in range(1, STEPS + 1):
        rows = sampler.next_batch().inputs
        assert np.array_equal(rows[:2], streams[0][step]) and np.array_equal(rows[2:], streams[1][step]), step
    last = Path(rundir.list_checkpoints(runs / "killed")[-1]["path"])
    drawn = json.loads((last / "trainer_state.json").read_text())
    assert drawn["sampler"]["drawn"] == sampler.plan.drawn(STEPS * 4)
