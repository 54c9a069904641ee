"""Data-parallel training under torchrun on CPU (gloo): same curve as one process, stop/resume, rank death."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.chat import conversations, write_jsonl
from tests.support.cli import tiny, wb
from tests.support.runs import evals, losses, read_jsonl, wait_running
from workbench import cli_client, rundir

pytestmark = pytest.mark.slow


COMMON = ("train.max_iters=8", "train.eval_interval=4", "train.ckpt_interval=4", "train.lr_decay_iters=8")


def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    root = str(tmp_path)
    wb("train", "cpu-small", "--name", "one", "--runs-dir", root, *tiny(*COMMON, "train.batch_size=4"), check=True)
    wb("train", "cpu-small", "--name", "two", "--runs-dir", root, "--nproc", "2",
       *tiny(*COMMON, "train.batch_size=4"), check=True)  # batch_size is global: 2 per process
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 9))  # one set of records: rank 0 alone writes
    for s in one:
        assert two[s] == pytest.approx(one[s], rel=1e-5, abs=1e-6), s
    assert sorted(evals(tmp_path / "one")) == sorted(evals(tmp_path / "two")) == [0, 4, 8]
    for s, v in evals(tmp_path / "one").items():
        assert evals(tmp_path / "two")[s] == pytest.approx(v, rel=1e-5)
    d = tmp_path / "two"
    assert [c["step"] for c in rundir.list_checkpoints(d)] == [4, 8]
    start = next(r for r in read_jsonl(d / "metrics.jsonl") if r.get("event") == "start")
    assert start["world_size"] == 2 and start["tokens_per_step"] == 4 * 32
    assert rundir.read_status(d).state == "finished"


def test_a_chat_run_on_two_processes_follows_one_process(tmp_path):
    """README: a chat step's loss is the mean over the trained tokens of the whole step, every micro-batch and rank:
    each rank's rows hold different numbers of trained tokens (ragged masks), and two processes still give one
    process's losses and evals (2 micro-batches of 4 rows, 2 a rank)."""
    f = write_jsonl(tmp_path / "chat.jsonl", conversations(300, seed=4))
    root = str(tmp_path)
    sets = tiny(*COMMON, "train.batch_size=4", "train.grad_accum=2", "model.seq_len=64", "model.vocab_size=400")
    wb("train", "cpu-small", "--name", "one", "--runs-dir", root, "--corpus", str(f), *sets, check=True)
    wb("train", "cpu-small", "--name", "two", "--runs-dir", root, "--corpus", str(f), "--nproc", "2", *sets,
       check=True)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 9))
    for s in one:
        assert two[s] == pytest.approx(one[s], rel=1e-5, abs=1e-6), s
    for s, v in evals(tmp_path / "one").items():
        assert evals(tmp_path / "two")[s] == pytest.approx(v, rel=1e-5)
    start = next(r for r in read_jsonl(tmp_path / "two" / "metrics.jsonl") if r.get("event") == "start")
    assert start["world_size"] == 2 and start["chat"]["packing"] is True


def test_stop_and_resume_under_ddp_is_exact(tmp_path):
    root = str(tmp_path)
    args = tiny("train.max_iters=10", "train.lr_decay_iters=10", "train.ckpt_interval=100", "train.eval_interval=100",
                "train.batch_size=4", "model.dropout=0.1")
    wb("train", "cpu-small", "--name", "straight", "--runs-dir", root, "--nproc", "2", *args, check=True)
    cp = wb("train", "cpu-small", "--name", "stopped", "--runs-dir", root, "--nproc", "2", *args,
            env={"WORKBENCH_TEST_SIGTERM_AT_STEP": "4"})
    assert cp.returncode == 0, cp.stderr
    d = tmp_path / "stopped"
    st = rundir.read_status(d)
    assert st.state == "stopped" and st.step in (4, 5)  # ranks agree at the next step's sync
    assert rundir.list_checkpoints(d)[-1]["step"] == st.step
    wb("resume", "stopped", "--runs-dir", root, check=True)  # hardware.nproc = 2 comes from the run's preset
    assert rundir.read_status(d).state == "finished"
    assert sorted(losses(d)) == list(range(1, 11))
    assert losses(d) == losses(tmp_path / "straight")  # per-rank dropout RNG and the data stream resumed exactly


def test_a_dying_rank_fails_the_run_clearly_and_its_resume_stops_every_rank_cleanly(tmp_path):
    """A rank killed: the run fails with a line that says so and how to go on. That resume trains on from the last
    checkpoint, and `workbench stop` ends torchrun and both ranks cleanly: no error in the resume's log, its last
    checkpoint at the step it stopped at. (One detached run for both: each costs a torchrun and two fresh ranks.)
    The ranks are torchrun's own children, fresh interpreters, as a user's are: not forked from the tests' spawn
    server (cli_client.stand_in), whose children they would be."""
    root = str(tmp_path)
    fresh = {"WORKBENCH_TEST_SPAWN": ""}
    wb("train", "cpu-small", "--name", "r", "--runs-dir", root, "--nproc", "2", "--detach",
       *tiny("train.max_iters=100000", "train.ckpt_interval=5", "train.eval_interval=1000", "train.batch_size=4"),
       env=fresh, check=True)
    d = tmp_path / "r"
    st = wait_running(d, 6)
    rank0 = psutil.Process(st.pid)
    first = [rank0.parent(), *rank0.parent().children()]  # torchrun and both ranks
    other = [c for c in first[1:] if c.pid != rank0.pid]
    os.kill(other[0].pid, signal.SIGKILL)
    end = time.time() + 60
    while time.time() < end and rundir.read_status(d).state in rundir.LIVE_STATES:
        time.sleep(0.2)
    st = rundir.read_status(d)
    assert st.state == "failed"
    assert "another rank of this run stopped" in st.error and "workbench resume r" in st.error
    last = rundir.list_checkpoints(d)[-1]["step"]
    psutil.wait_procs(first, timeout=60)  # torchrun reports the dead rank in the log as it exits
    assert not any(p.is_running() for p in first)
    failed_log = len((d / "train.log").read_text())

    wb("resume", "r", "--runs-dir", root, "--detach", env=fresh, check=True)
    st = wait_running(d, last + 3)
    assert st.state == "running" and st.step >= last + 3, st
    rank0 = psutil.Process(st.pid)
    group = [rank0.parent(), *rank0.parent().children()]
    out = wb("stop", "r", "--runs-dir", root, check=True).stdout
    assert "stopped at step" in out
    psutil.wait_procs(group, timeout=60)
    assert not any(p.is_running() for p in group)  # torchrun and both ranks are gone
    resumed_log = (d / "train.log").read_text()[failed_log:]
    assert "ChildFailedError" not in resumed_log and "terminate called" not in resumed_log, resumed_log
    assert rundir.read_status(d).state == "stopped"
    assert rundir.list_checkpoints(d)[-1]["step"] == rundir.read_status(d).step


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _on_two_nodes(tmp_path, *args: str) -> None:
    """One workbench command per node (node0/ and node1/ runs dirs), rendezvous on localhost, one process each."""
    port = str(_free_port())
    procs, logs = [], []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "workbench", *args, "--runs-dir", str(tmp_path / f"node{node}"),
               "--nnodes", "2", "--node-rank", str(node), "--nproc", "1", "--master-addr", "127.0.0.1",
               "--master-port", port]
        logs.append(tmp_path / f"node{node}.out")
        with logs[-1].open("w") as out:  # forked from the spawn server, as the TUI's commands are: no torch import
            procs.append(cli_client.popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0, 0], [log.read_text() for log in logs]


def test_two_nodes_on_one_machine(tmp_path):
    """--nnodes 2 with a localhost rendezvous, one process per node (each node has its own runs dir), and a
    resume across the two nodes (resume's --nnodes, --node-rank, --master-addr and --master-port)."""
    _on_two_nodes(tmp_path, "train", "cpu-small", "--name", "n", *tiny(*COMMON, "train.batch_size=4"))
    wb("train", "cpu-small", "--name", "one", "--runs-dir", str(tmp_path), *tiny(*COMMON, "train.batch_size=4"),
       check=True)
    node0, one = losses(tmp_path / "node0" / "n"), losses(tmp_path / "one")
    assert sorted(one) == sorted(node0) == list(range(1, 9))
    for s in one:
        assert node0[s] == pytest.approx(one[s], rel=1e-5, abs=1e-6)
    # Only global rank 0 writes metrics and checkpoints.
    assert not (tmp_path / "node1" / "n" / "metrics.jsonl").exists()
    assert rundir.list_checkpoints(tmp_path / "node1" / "n") == []
    # resumed on both nodes from rank 0's checkpoint (copied to node 1, as a shared runs directory would give
    # it): the two more steps are one process's resumed steps
    shutil.rmtree(tmp_path / "node1" / "n")
    shutil.copytree(tmp_path / "node0" / "n", tmp_path / "node1" / "n")
    _on_two_nodes(tmp_path, "resume", "n", "--more", "2")
    wb("resume", "one", "--more", "2", "--runs-dir", str(tmp_path), check=True)
    node0, one = losses(tmp_path / "node0" / "n"), losses(tmp_path / "one")
    assert sorted(one) == sorted(node0) == list(range(1, 11))
    for s in (9, 10):
        assert node0[s] == pytest.approx(one[s], rel=1e-5, abs=1e-6)


def test_auto_layout_and_a_batch_that_does_not_split(tmp_path):
    """hardware.nproc = 0 picks one process per physical core here; 3 processes cannot share batch 4."""
    root = str(tmp_path)
    cp = wb("train", "cpu-small", "--name", "a", "--runs-dir", root,
            *tiny("train.max_iters=3", "train.eval_interval=100", "train.ckpt_interval=100", "hardware.nproc=0"),
            check=True)
    cores = psutil.cpu_count(logical=False)
    want = max(n for n in range(1, min(8, cores) + 1) if 4 % n == 0)
    assert f"process layout: {want} process" in cp.stdout
    start = next(r for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if r.get("event") == "start")
    assert start["world_size"] == want
    bad = wb("train", "cpu-small", "--name", "b", "--runs-dir", root, "--nproc", "3", *tiny("train.max_iters=3"))
    assert bad.returncode == 2
    assert "train.batch_size = 4 does not split over 3 processes (--nproc)" in bad.stderr
    assert not (tmp_path / "b").exists()
