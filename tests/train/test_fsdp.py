"""Sharded data-parallel training (hardware.shard, FSDP2) under torchrun on CPU (gloo): the same curve as
one process, checkpoints in the plain single-process layout, stop/resume, and resumes across layouts."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.support.cli import tiny, wb
from tests.support.runs import evals, losses, read_jsonl, records_since_last_start
from workbench import rundir

pytestmark = pytest.mark.slow

# grad_accum 2: the first micro-batch of each step skips the gradient reduce-scatter.
COMMON = ("train.max_iters=8", "train.eval_interval=4", "train.ckpt_interval=4", "train.lr_decay_iters=8",
          "train.grad_accum=2")
SHARD = ("--nproc", "2", *tiny(*COMMON, "hardware.shard=true"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One single-process run and the same run sharded over two processes (same global batch)."""
    root = tmp_path_factory.mktemp("fsdp")
    wb("train", "cpu-small", "--name", "one", "--runs-dir", str(root), *tiny(*COMMON), check=True)
    wb("train", "cpu-small", "--name", "fsdp", "--runs-dir", str(root), *SHARD, check=True)
    return root


def test_sharded_run_follows_the_single_process_curve(runs):
    one, fsdp = losses(runs / "one"), losses(runs / "fsdp")
    assert sorted(one) == sorted(fsdp) == list(range(1, 9))  # rank 0 alone writes
    for s in one:
        assert fsdp[s] == pytest.approx(one[s], rel=1e-5, abs=1e-6), s
    assert sorted(evals(runs / "one")) == sorted(evals(runs / "fsdp")) == [0, 4, 8]
    for s, v in evals(runs / "one").items():
        assert evals(runs / "fsdp")[s] == pytest.approx(v, rel=1e-5)
    assert [c["step"] for c in rundir.list_checkpoints(runs / "fsdp")] == [4, 8]
    assert len(read_jsonl(runs / "fsdp" / "samples.jsonl")) == 2  # every rank samples, rank 0 writes once
    assert rundir.read_status(runs / "fsdp").state == "finished"


def test_start_event_and_log_say_how_the_run_is_parallel(runs):
    start = next(r for r in read_jsonl(runs / "fsdp" / "metrics.jsonl") if r.get("event") == "start")
    assert start["parallel"] == "fsdp" and start["world_size"] == 2
    first = next(line for line in (runs / "fsdp" / "train.log").read_text().splitlines() if " run fsdp:" in line)
    assert "2 processes, sharded (FSDP2)" in first
    solo = next(r for r in read_jsonl(runs / "one" / "metrics.jsonl") if r.get("event") == "start")
    assert solo["parallel"] == "none"
    assert "FSDP" not in (runs / "one" / "train.log").read_text()


def test_sharded_checkpoint_has_the_single_process_layout(runs):
    """model.pt and the optimizer's state dict (numbered params, decay / no_decay groups) match one process's."""
    a, b = (runs / name / "checkpoints" / "step_0000004" for name in ("one", "fsdp"))
    ma, mb = (torch.load(d / "model.pt", weights_only=True) for d in (a, b))
    assert list(ma) == list(mb)
    for k in ma:
        assert type(mb[k]) is torch.Tensor and mb[k].shape == ma[k].shape, k
        # atol 1e-5: AdamW divides by sqrt(v) ~ |g|, so a last-bit difference in a gradient reduced in another
        # order moves a weight by up to ~2e-6 on some CPUs (1 of 12,288 elements here); a wrong layout or shard
        # is off by the weights' own scale (~1e-2)
        assert torch.allclose(mb[k], ma[k], rtol=1e-4, atol=1e-5), k
    oa, ob = (torch.load(d / "state.pt", weights_only=True)["optimizer"] for d in (a, b))
    assert len(ob["param_groups"]) == 2 and ob["param_groups"] == oa["param_groups"]
    assert sorted(ob["state"]) == sorted(oa["state"]) == list(range(sum(len(g["params"]) for g in oa["param_groups"])))
    for i, st in oa["state"].items():
        assert set(ob["state"][i]) == set(st)
        for name, v in st.items():
            assert type(ob["state"][i][name]) is torch.Tensor and ob["state"][i][name].shape == v.shape
            assert torch.allclose(ob["state"][i][name], v, rtol=1e-4, atol=1e-7), (i, name)


def test_stop_and_resume_under_fsdp_continues_the_curve(runs, tmp_path):
    cp = wb("train", "cpu-small", "--name", "stopped", "--runs-dir", str(tmp_path), *SHARD,
            env={"WORKBENCH_TEST_SIGTERM_AT_STEP": "4"})
    assert cp.returncode == 0, cp.stderr
    d = tmp_path / "stopped"
    st = rundir.read_status(d)
    assert st.state == "stopped" and st.step in (4, 5)
    wb("resume", "stopped", "--runs-dir", str(tmp_path), check=True)  # nproc 2 and shard from the run's preset
    assert rundir.read_status(d).state == "finished"
    resumed = records_since_last_start(d)
    assert resumed[0]["event"] == "resume" and resumed[0]["parallel"] == "fsdp"
    assert sorted(losses(d)) == list(range(1, 9))
    assert losses(d) == losses(runs / "fsdp")  # exact: sharded optimizer state and data stream restored


def _copy_up_to(src, dst, step: int) -> None:
    """A copy of run ``src`` whose latest checkpoint is ``step`` (the later ones removed), so a resume
    continues it in place from there."""
    shutil.copytree(src, dst)
    for c in rundir.list_checkpoints(dst):
        if c["step"] > step:
            shutil.rmtree(c["path"])
    assert rundir.list_checkpoints(dst)[-1]["step"] == step


def test_a_sharded_checkpoint_resumes_in_one_process(runs, tmp_path):
    _copy_up_to(runs / "fsdp", tmp_path / "solo", 4)
    wb("resume", "solo", "--runs-dir", str(tmp_path), "--nproc", "1", check=True)
    resumed = records_since_last_start(tmp_path / "solo")
    assert resumed[0]["event"] == "resume" and resumed[0]["world_size"] == 1 and resumed[0]["parallel"] == "none"
    got, one = losses(tmp_path / "solo", since_last_start=True), losses(runs / "one")
    assert sorted(got) == [5, 6, 7, 8]
    for s in got:
        assert got[s] == pytest.approx(one[s], rel=1e-5, abs=1e-6), s


def test_a_single_process_checkpoint_resumes_sharded(runs, tmp_path):
    _copy_up_to(runs / "one", tmp_path / "wide", 4)
    wb("resume", "wide", "--runs-dir", str(tmp_path), "--nproc", "2", "--set", "hardware.shard=true", check=True)
    resumed = records_since_last_start(tmp_path / "wide")
    assert resumed[0]["event"] == "resume" and resumed[0]["parallel"] == "fsdp"
    got, one = losses(tmp_path / "wide", since_last_start=True), losses(runs / "one")
    assert sorted(got) == [5, 6, 7, 8]
    for s in got:
        assert got[s] == pytest.approx(one[s], rel=1e-5, abs=1e-6), s
