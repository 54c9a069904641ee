"""`train.objective = grpo` end to end through the real CLI (issue 56): a tiny model that knows twelve facts
(tests.support.cli.FACTS) tuned on its own samples scored by `exact:answer`, full (a frozen reference, beta > 0) and
LoRA; the reward records it logs (train each step, the held-out prompts' reward at each eval); kill -9 and resume,
bitwise; every bad input one line with exit 2 and no run directory, and a reward that fails mid-run one line,
exit 2."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from tests.support.cli import FACTS, TINY, wb
from tests.support.runs import losses, read_jsonl
from workbench import rundir
from workbench.config.objectives import GRPO_LOSSES
from workbench.train.grpo import LOSS_TYPES

REWARD = '''
def boom(prompt, completion, record):
    raise ValueError("no idea")
'''
# tiny()'s settings less its model (the facts run's, as --init-from takes it)
GRPO = [*(s for s in TINY if not s.startswith("model.")), "model.seq_len=32",
        "train.objective=grpo", "train.reward=exact:answer", "train.grpo_group=4",
        "train.grpo_max_new_tokens=6", "train.batch_size=3", "train.warmup_iters=1", "train.eval_interval=2",
        "train.ckpt_interval=2", "train.lr=1e-3", "model.dropout=0"]


@pytest.fixture(scope="module")
def root(tmp_path_factory, facts_run) -> Path:
    """A runs directory of its own with a copy of the facts run, a prompts file of its facts, a reward file."""
    d = tmp_path_factory.mktemp("grpo")
    shutil.copytree(facts_run, d / "runs" / "facts")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": q, "answer": f"{a}."}) + "\n" for q, a in FACTS))
    (d / "empty.jsonl").write_text("")
    (d / "reward.py").write_text(REWARD)
    return d


def grpo(root: Path, name: str, *sets: str, corpus: str = "prompts.jsonl", env: dict | None = None):
    return wb("train", "cpu-small", "--init-from", "facts", "--name", name, "--corpus", str(root / corpus),
              "--runs-dir", str(root / "runs"), "--set", *GRPO, *sets, env=env)


def rewards(run_dir: Path, split: str = "train") -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(run_dir / rundir.METRICS_FILE)
            if r.get("kind") == "reward" and r["split"] == split}


def test_the_schemas_loss_names_are_the_losses():
    assert GRPO_LOSSES == LOSS_TYPES


def test_a_full_grpo_run_logs_rewards_kl_and_the_held_out_reward(root):
    cp = grpo(root, "full", "train.max_iters=4", "train.grpo_beta=0.04", "train.grpo_clip_high=0.28",
              "train.grpo_loss=bnpo")
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    d = root / "runs" / "full"
    assert "objective grpo (KL beta 0.04); reference: frozen copy" in cp.stdout
    train, val = rewards(d), rewards(d, "val")
    assert sorted(train) == [1, 2, 3, 4] and sorted(val) == [0, 2, 4]
    for r in train.values():
        assert 0 <= r["reward"] <= 1 and r["kl"] is not None and r["kl"] >= 0 and 0 < r["completion_len"] <= 6
        assert 0 <= r["no_signal"] <= 1 and r["reward_std"] >= 0
    assert train[1]["kl"] == pytest.approx(0, abs=1e-6)  # the policy is its reference before its first update
    # the facts model knows its answers: most completions are right from the start
    assert sum(r["reward"] for r in train.values()) / 4 > 0.3
    start = next(r for r in read_jsonl(d / rundir.METRICS_FILE) if r.get("event") == "start")
    assert start["objective"]["objective"] == "grpo" and start["objective"]["reference"] == "frozen copy"
    assert "reward " in cp.stdout and "held-out reward" in cp.stdout
    assert [c["step"] for c in rundir.list_checkpoints(d)] == [2, 4]


def test_a_lora_grpo_run_trains_its_adapters_without_a_reference(root):
    cp = grpo(root, "lora", "train.max_iters=2", "train.finetune=lora", "train.lr=1e-2", "train.grpo_clip=0.3",
              "train.grpo_loss=dr_grpo", "train.grpo_scale_std=false")
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    assert "objective grpo (KL beta 0); no reference" in cp.stdout
    train = rewards(root / "runs" / "lora")
    assert sorted(train) == [1, 2] and all(r["kl"] is None for r in train.values())


def test_kill_minus_nine_and_resume_gives_the_same_steps_bit_for_bit(root):
    n = ["train.max_iters=5", "train.eval_interval=5"]
    assert grpo(root, "straight", *n).returncode == 0
    cp = grpo(root, "killed", *n, env={"WORKBENCH_TEST_KILL_AT_STEP": "3"})
    assert cp.returncode == -signal.SIGKILL
    d = root / "runs" / "killed"
    assert max(losses(d)) == 3 and rundir.list_checkpoints(d)[-1]["step"] == 2
    res = wb("resume", "killed", "--runs-dir", str(root / "runs"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    straight = root / "runs" / "straight"
    assert losses(d) == losses(straight)          # every step's loss, bit for bit
    keys = ("reward", "reward_std", "no_signal", "completion_len", "loss")
    assert {s: [r[k] for k in keys] for s, r in rewards(d).items()} == \
        {s: [r[k] for k in keys] for s, r in rewards(straight).items()}   # the same samples, the same scores


@pytest.mark.parametrize("sets,corpus,said", [
    (("train.reward=",), "prompts.jsonl", "train.reward is not set"),
    (("train.reward=nosuch",), "prompts.jsonl", "'nosuch' is neither a built-in"),
    (("train.grpo_group=1",), "prompts.jsonl", "train.grpo_group = 1 must be >= 2"),
    (("train.grpo_max_new_tokens=32",), "prompts.jsonl", "train.grpo_max_new_tokens = 32 must be < model.seq_len"),
    ((), "empty.jsonl", "has no prompts"),
    (("train.reward=exact:label",), "prompts.jsonl", "compares with the record's 'label' field"),
    (("hardware.nproc=2", "hardware.shard=true"), "prompts.jsonl", "runs on several processes with DDP, not sharded"),
])
def test_bad_input_is_one_line_and_makes_no_run(root, sets, corpus, said):
    cp = grpo(root, "bad", *sets, corpus=corpus)
    assert cp.returncode == 2 and cp.stderr.count("\n") == 1 and said in cp.stderr, cp.stderr
    assert not (root / "runs" / "bad").exists()


def test_a_reward_that_fails_mid_run_stops_it_with_one_line(root):
    cp = grpo(root, "boom", "train.max_iters=2", f"train.reward={root / 'reward.py'}:boom")
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert cp.stderr.count("\n") == 1 and "reward reward.py:boom raised ValueError: no idea on prompt" in cp.stderr
    assert rundir.read_status(root / "runs" / "boom").state == "failed"
