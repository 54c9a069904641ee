"""Trustworthy runs: bitwise resume, SIGTERM, kill -9 at random moments, NaN guard, retention, safety."""

from __future__ import annotations

import os
import pickle
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.support.cli import tiny, wb
from tests.support.runs import losses, read_jsonl, wait_until
from workbench import rundir
from workbench.fs import read_json
from workbench.train.checkpoint import load_model_state, load_training_state

N = 16
# dropout > 0 so that the torch RNG state matters; checkpoints every 5 steps; a fixed
# decay horizon so that stopping early does not change the schedule.
EXACT = tiny(f"train.max_iters={N}", "train.lr_decay_iters=16", "train.ckpt_interval=5",
             "train.eval_interval=8", "model.dropout=0.1", "train.sample_prompt='def '",
             "train.sample_tokens=8", "train.patience=0")


def has_nonfinite(sd: dict) -> bool:
    """A saved state dict holds a NaN or an infinity (a checkpoint must never)."""
    return any(t.is_floating_point() and not torch.isfinite(t).all() for t in sd.values())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, float]:
    root = tmp_path_factory.mktemp("straight")
    wb("train", "cpu-small", "--name", "straight", "--runs-dir", str(root), *EXACT, check=True)
    got = losses(root / "straight")
    assert sorted(got) == list(range(1, N + 1))
    return got


@pytest.mark.parametrize("k,how", [(7, "kill"), (10, "sigterm"), (12, "kill")])
def test_resume_is_bitwise_identical(tmp_path, uninterrupted, k, how):
    """k=7 and k=12 are SIGKILLs between checkpoints (resume goes back to steps 5 and 10);
    k=10 is a SIGTERM, which saves at step 10."""
    root = str(tmp_path)
    env = {"WORKBENCH_TEST_KILL_AT_STEP" if how == "kill" else "WORKBENCH_TEST_SIGTERM_AT_STEP": str(k)}
    cp = wb("train", "cpu-small", "--name", "r", "--runs-dir", root, *EXACT, env=env)
    d = tmp_path / "r"
    if how == "kill":
        assert cp.returncode == -signal.SIGKILL
        assert rundir.read_status(d).state == "crashed"
    else:
        assert cp.returncode == 0 and rundir.read_status(d).state == "stopped"
    before = losses(d)
    assert max(before) == k
    last_ckpt = rundir.list_checkpoints(d)[-1]["step"]
    assert last_ckpt == (k if how == "sigterm" else k // 5 * 5)
    res = wb("resume", "r", "--runs-dir", root, check=True)  # a fresh process
    assert f"resumed from checkpoint step_{last_ckpt:07d}" in res.stdout
    after = losses(d)
    assert after == uninterrupted  # every logged loss, bit for bit
    assert {s: v for s, v in before.items()} == {s: uninterrupted[s] for s in before}


def test_sigterm_saves_and_stale_lock_does_not_block(tmp_path):
    root = str(tmp_path)
    wb("train", "cpu-small", "--name", "s", "--runs-dir", root, *EXACT,
       env={"WORKBENCH_TEST_SIGTERM_AT_STEP": "3"}, check=True)
    d = tmp_path / "s"
    st = rundir.read_status(d)
    assert st.state == "stopped" and st.step == 3
    assert [c["step"] for c in rundir.list_checkpoints(d)] == [3]
    assert (d / "lock").exists()  # the lock file stays; only a live flock counts
    wb("resume", "s", "--runs-dir", root, check=True)
    assert rundir.read_status(d).state == "finished"


@pytest.mark.slow
def test_kill_minus_nine_at_random_moments_always_resumes(tmp_path):
    """9 SIGKILLs: 6 at random times, 3 paused inside a save (after model.pt, before the rename)."""
    root = str(tmp_path)
    rng = random.Random(1234)
    long = tiny("train.max_iters=100000", "train.ckpt_interval=3", "train.eval_interval=1000",
                "train.log_interval=1", "train.keep_last=2")
    d = tmp_path / "k"
    marker = tmp_path / "paused"
    loaded_steps = []  # the newest complete checkpoint after each kill
    for trial in range(9):
        env = {}
        if trial % 3 == 2:
            env = {"WORKBENCH_TEST_PAUSE_IN_SAVE": "after_model" if trial % 2 else "before_rename",
                   "WORKBENCH_TEST_PAUSE_MARKER": str(marker), "WORKBENCH_TEST_PAUSE_SECONDS": "60"}
        if marker.exists():
            marker.unlink()
        if trial == 0:
            wb("train", "cpu-small", "--name", "k", "--runs-dir", root, "--detach", *long, env=env, check=True)
        else:
            cp = wb("resume", "k", "--runs-dir", root, "--detach", env=env)
            assert cp.returncode == 0, cp.stderr
        pid = wait_until(lambda: (s := read_json(d / "status.json")) and s.get("state") == "running"
                    and s.get("pid"))
        if trial:  # each resume starts from the newest checkpoint the last kill left
            resumes = [r for r in read_jsonl(d / "metrics.jsonl") if r.get("event") == "resume"]
            assert len(resumes) == trial and resumes[-1]["step"] == (loaded_steps[-1] if loaded_steps else 0), \
                (trial, resumes[-1], loaded_steps)
        if env:
            wait_until(marker.exists)
        else:
            if trial == 0:  # a run killed before its first checkpoint has nothing to resume (resume says so)
                wait_until(lambda: rundir.list_checkpoints(d))
            time.sleep(rng.uniform(0.2, 2.5))
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not rundir.pid_alive(pid))
        assert rundir.read_status(d).state == "crashed"
        # Every checkpoint that counts is complete and loads.
        for c in rundir.list_checkpoints(d):
            sd = load_model_state(c["path"])
            state, ts = load_training_state(c["path"])
            assert ts["step"] == c["step"] and not has_nonfinite(sd)
        ck = rundir.list_checkpoints(d)
        if ck:
            loaded_steps.append(ck[-1]["step"])
    assert loaded_steps, "no checkpoint was ever written"
    # Progress was kept across the kills: the newest checkpoint never went back, and it moved on.
    assert loaded_steps == sorted(loaded_steps) and loaded_steps[-1] > loaded_steps[0], loaded_steps
    # A last resume finishes cleanly.
    last = rundir.list_checkpoints(d)[-1]["step"]
    cp = wb("resume", "k", "--runs-dir", root, "--set", f"train.max_iters={last + 4}")
    assert cp.returncode == 0, cp.stderr
    assert rundir.read_status(d).state == "finished"
    leftovers = [p.name for p in (d / "checkpoints").iterdir() if p.name.startswith(".tmp_")]
    assert leftovers == []


def test_nan_step_is_skipped_and_counted(tmp_path):
    root = str(tmp_path)
    wb("train", "cpu-small", "--name", "n", "--runs-dir", root, *tiny("train.max_iters=12", "train.ckpt_interval=4",
       "train.eval_interval=4"), env={"WORKBENCH_TEST_NAN_STEPS": "6"}, check=True)
    d = tmp_path / "n"
    recs = read_jsonl(d / "metrics.jsonl")
    skips = [r for r in recs if r.get("event") == "nonfinite_skip"]
    assert [s["step"] for s in skips] == [6]
    train = {r["step"]: r for r in recs if r["kind"] == "train"}
    assert train[6]["loss"] is None and train[5]["skipped"] == 0 and train[12]["skipped"] == 1
    assert rundir.read_status(d).state == "finished"
    for c in rundir.list_checkpoints(d):
        assert not has_nonfinite(load_model_state(c["path"]))
        state, _ = load_training_state(c["path"])
        for s in state["optimizer"]["state"].values():
            assert torch.isfinite(s["exp_avg"]).all()


def test_repeated_nan_rolls_back_to_the_checkpoint_with_half_the_learning_rate(tmp_path):
    """3 non-finite steps in a row (6, 7, 8; max_skips 3): back to checkpoint step 4, then steps 5.. again
    at half the learning rate of the same steps of an undisturbed run, to the end."""
    root = str(tmp_path)
    args = tiny("train.max_iters=14", "train.ckpt_interval=4", "train.eval_interval=100", "train.max_skips=3")
    wb("train", "cpu-small", "--name", "straight", "--runs-dir", root, *args, check=True)
    wb("train", "cpu-small", "--name", "rb", "--runs-dir", root, *args, env={"WORKBENCH_TEST_NAN_STEPS": "6,7,8"},
       check=True)
    straight = {r["step"]: r for r in read_jsonl(tmp_path / "straight" / "metrics.jsonl") if r["kind"] == "train"}
    d = tmp_path / "rb"
    recs = read_jsonl(d / "metrics.jsonl")
    at = [i for i, r in enumerate(recs) if r.get("event") == "rollback"]
    assert len(at) == 1, at
    ev = recs[at[0]]
    assert (ev["to"], ev["from_step"], ev["step"], ev["lr_scale"]) == ("step_0000004", 8, 4, 0.5)
    before = {r["step"]: r for r in recs[:at[0]] if r["kind"] == "train"}
    after = {r["step"]: r for r in recs[at[0]:] if r["kind"] == "train"}
    # the third bad step (8) rolls back before it is logged
    assert sorted(before) == list(range(1, 8)) and [before[s]["loss"] for s in (6, 7)] == [None] * 2
    assert sorted(after) == list(range(5, 15))  # rewound to step 4: steps 5.. run again, to max_iters
    # Step 5's loss is computed before its update: the same weights and batch as step 4 left them.
    assert after[5]["loss"] == before[5]["loss"] == straight[5]["loss"]
    for s in range(1, 8):
        assert before[s]["lr"] == straight[s]["lr"], s
    for s in range(5, 15):
        assert after[s]["lr"] == 0.5 * straight[s]["lr"], (s, after[s]["lr"], straight[s]["lr"])
        assert after[s]["loss"] is not None and after[s]["skipped"] == 3
    assert rundir.read_status(d).state == "finished"


def test_persistent_nan_fails_with_advice(tmp_path):
    root = str(tmp_path)
    cp = wb("train", "cpu-small", "--name", "f", "--runs-dir", root,
            *tiny("train.max_iters=40", "train.ckpt_interval=2", "train.eval_interval=100", "train.max_skips=2"),
            env={"WORKBENCH_TEST_NAN_STEPS": ",".join(str(i) for i in range(3, 41)),
                 "WORKBENCH_TEST_NAN_ALWAYS": "1"})
    assert cp.returncode == 1
    d = tmp_path / "f"
    st = rundir.read_status(d)
    assert st.state == "failed"
    assert "consecutive non-finite steps" in st.error and "lower train.lr" in st.error
    assert "2 rollbacks did not help" in st.error
    assert cp.stderr.strip().splitlines()[-1].startswith("workbench: error: 2 consecutive non-finite steps")
    # At most two rollbacks, each to the last checkpoint (step 2), each halving the learning rate again.
    recs = read_jsonl(d / "metrics.jsonl")
    rb = [(r["from_step"], r["to"], r["lr_scale"]) for r in recs if r.get("event") == "rollback"]
    assert rb == [(4, "step_0000002", 0.5), (4, "step_0000002", 0.25)]
    lr3 = [r["lr"] for r in recs if r["kind"] == "train" and r["step"] == 3]  # step 3 ran three times
    assert lr3 == [lr3[0], lr3[0] * 0.5, lr3[0] * 0.25]
    for c in rundir.list_checkpoints(d):
        assert not has_nonfinite(load_model_state(c["path"]))


def test_retention_keeps_last_k_best_and_milestones(tmp_path):
    """The learning rate warms up to 1.0, so val loss improves at the first evals and then gets worse: the best
    checkpoint is an early one, outside keep_last, at a step that is no checkpoint interval (saved only because it
    was the best). A retention that drops the best, or a trainer that never saves a new best, loses it."""
    root = str(tmp_path)
    wb("train", "cpu-small", "--name", "ret", "--runs-dir", root,
       *tiny("train.max_iters=20", "train.ckpt_interval=4", "train.eval_interval=3", "train.keep_last=2",
             "train.milestone_interval=8", "train.lr=1.0", "train.min_lr=1.0", "train.warmup_iters=12",
             "train.patience=0"), check=True)
    d = tmp_path / "ret"
    evals = [r for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "eval" and r["step"] > 0]
    best = min(evals, key=lambda r: (r["val_loss"], -r["step"]))["step"]
    assert best % 4 != 0 and best < 16, best  # not an interval step, and older than the last two
    steps = {c["step"] for c in rundir.list_checkpoints(d)}
    assert steps == {16, 20, 8, best}
    on_disk = {p.name for p in (d / "checkpoints").iterdir()}
    assert on_disk == {f"step_{s:07d}" for s in steps}


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_malicious_checkpoint_is_refused_without_running(trained_run, tmp_path):
    import shutil
    run = tmp_path / "evil"
    shutil.copytree(trained_run, run)
    pwned = tmp_path / "pwned"
    ck = rundir.list_checkpoints(run)[-1]
    with open(Path(ck["path"]) / "model.pt", "wb") as f:
        pickle.dump({"tok_emb.weight": _Evil(pwned)}, f)
    cp = wb("sample", str(run), "--prompt", "x", "--max-new-tokens", "3")
    assert cp.returncode == 2
    assert "not a valid workbench checkpoint file" in cp.stderr and "unsafe pickle" in cp.stderr
    assert not pwned.exists()
    # The torch.save flavour of the same attack is refused too.
    torch.save({"tok_emb.weight": _Evil(pwned)}, Path(ck["path"]) / "model.pt")
    cp = wb("sample", str(run), "--prompt", "x", "--max-new-tokens", "3")
    assert cp.returncode == 2 and not pwned.exists()


def test_out_of_memory_stops_cleanly_with_advice(tmp_path):
    root = str(tmp_path)
    cp = wb("train", "cpu-small", "--name", "oom", "--runs-dir", root,
            *tiny("train.max_iters=10", "train.ckpt_interval=2", "train.eval_interval=100"),
            env={"WORKBENCH_TEST_OOM_AT_STEP": "3"})
    assert cp.returncode == 1
    last = cp.stderr.strip().splitlines()[-1]
    assert last.startswith("workbench: error: out of memory on cpu at batch_size 4 x seq_len 32; lower "
                           "train.batch_size (raise train.grad_accum to keep the tokens per step) (estimated ")
    assert "GiB at batch_size 2), lower model.seq_len, or set hardware.activation_checkpointing = true" in last
    d = tmp_path / "oom"
    st = rundir.read_status(d)
    assert st.state == "failed" and st.error in last
    assert [p.name for p in (d / "checkpoints").iterdir()] == ["step_0000002"]
