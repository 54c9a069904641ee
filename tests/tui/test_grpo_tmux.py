"""A real tiny GRPO run (the facts run tuned on its own samples, as tests/train/test_grpo_training.py makes one)
seen in the TUI in tmux, as a user sees it: the Loss curves pane's reward curve (r) and the Train pane's reward
numbers, read back by `tmux capture-pane` against the run's own reward records."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.support.cli import FACTS, TINY, wb
from tests.support.runs import read_jsonl
from tests.support.tmux import Tmux, tui_env
from workbench import rundir

pytestmark = pytest.mark.slow

GRPO = [*(s for s in TINY if not s.startswith("model.")), "model.seq_len=32", "model.dropout=0",
        "train.objective=grpo", "train.reward=exact:answer", "train.grpo_group=4", "train.grpo_max_new_tokens=6",
        "train.batch_size=3", "train.warmup_iters=1", "train.eval_interval=2", "train.ckpt_interval=4",
        "train.lr=1e-3", "train.grpo_beta=0.04", "train.max_iters=4"]


def test_a_grpo_runs_reward_curves_and_numbers_in_tmux(tmp_path, facts_run):
    env = tui_env(tmp_path)
    runs = tmp_path / "runs"
    shutil.copytree(facts_run, runs / "facts")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": q, "answer": f"{a}."}) + "\n"
                                                    for q, a in FACTS))
    cp = wb("train", "cpu-small", "--init-from", "facts", "--name", "grpo", "--corpus", str(tmp_path / "prompts.jsonl"),
            "--runs-dir", str(runs), "--set", *GRPO, env=env)
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    recs = [r for r in read_jsonl(runs / "grpo" / rundir.METRICS_FILE) if r.get("kind") == "reward"]
    train = [r for r in recs if r["split"] == "train"]
    held = [r for r in recs if r["split"] == "val"]
    assert len(train) == 4 and held

    tm = Tmux(f"wbgrpo-{os.getpid()}", tmp_path, env)
    shots = {}
    try:
        tm.open_tui(runs)
        tm.wait_screen(r"grpo\s.*finished", 30)
        tm.keys("4")                                  # Loss curves
        tm.wait_screen(r"ancestors:", 10)
        tm.wait_screen(r"✓▌ grpo", 10)                # the newest run is ticked for the user
        tm.keys("r")
        tm.wait_screen(r"GRPO: mean reward", 15)
        shots["curves"] = tm.screen()
        assert "held-out" in shots["curves"] and "y: linear, mean reward" in shots["curves"]
        tm.keys("3")                                  # the Train pane, on the grpo run
        last, last_val = train[-1], held[-1]
        tm.wait_screen(r"held-out reward", 20)
        shots["train"] = tm.screen()
        text = shots["train"]
        assert f"{last['reward']:.3f} ± {last['reward_std']:.3f}" in text, text
        assert f"{last_val['reward']:.3f}" in text and f"{100 * last['no_signal']:.0f}% of groups" in text
        assert f"{last['kl']:.4f}" in text and f"{last['completion_len']:.1f}" in text
        tm.wait_screen(r"health", 10)
    finally:
        tm.kill_server()
        for name, text in shots.items():
            print(f"----- {name}\n{text}")
