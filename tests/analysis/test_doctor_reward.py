"""The run doctor on GRPO runs (workbench/analysis/doctor/reward.py), from reward records hand-written as the
trainer writes them: reward hacking through the KL and through the completion length, most groups without signal
(too easy and too hard, told from the mean), a reward that never moves; a healthy run has none of them."""

from __future__ import annotations

from tests.support.rundirs import RunDir
from workbench.analysis.doctor import diagnose, read_run
from workbench.config import preset_to_toml, resolve_preset
from workbench.machine.activity import HardwareSnapshot

CPU = {"cpu": {"physical_cores": 2, "logical_cores": 2, "ram_total": 16 * 2**30, "ram_available": 12 * 2**30,
               "native_bf16": False}, "nvidia": [], "mps": False, "cxx": True, "calibration": {"cpu:fp32": 2e10}}


def run(tmp_path, rid, *sets, steps=20, tokens=(10**4, 10**3), kind="reward", **curve):
    """A GRPO run whose train reward record at step s has each ``curve[name](s)``, its prompts ``tokens`` (train,
    val) long; the findings of ``kind``."""
    p = resolve_preset("cpu-small", ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
                                     "model.vocab_size=512", "model.seq_len=64", "train.max_iters=20",
                                     "train.warmup_iters=2", "train.objective=grpo", "train.reward=exact:answer",
                                     "model.dropout=0", *sets])
    p.init = {"run": "sft", "step": 100}
    with RunDir(tmp_path, rid, preset_to_toml(p)) as r:
        r.event("start", 0, device="cpu", precision="fp32", params=131_392, train_tokens=tokens[0],
                val_tokens=tokens[1], tokens_per_step=p.tokens_per_step(), corpus="prompts.jsonl", pid=1, world_size=1)
        for s in range(1, steps + 1):
            vals = {k: f(s) for k, f in curve.items()}
            r.train(s, 0.01, tokens_per_s=5000.0 if s > 1 else None, tokens_seen=s * 512,
                    memory={"mem_rss_mb": 300.0, "mem_peak_rss_mb": 300.0}, mem_mb=300.0)
            r.reward(s, **vals)
            if s % 5 == 0:
                r.reward(s, "val", reward=vals["reward"], reward_std=vals["reward_std"], no_signal=vals["no_signal"],
                         completion_len=vals["completion_len"])
        r.status(state="finished", step=steps, max_iters=20, pid=1)
    return [f for f in diagnose(read_run(r.path), HardwareSnapshot(info=CPU)) if f.kind == kind]


def learning(s):  # a healthy GRPO run: the reward climbs, half the groups keep a signal, KL small, length steady
    return {"reward": 0.2 + 0.02 * s, "reward_std": 0.4, "no_signal": 0.3 + 0.01 * s, "kl": 0.002 * s,
            "completion_len": 12.0 + 0.1 * s}


def curves(**over):
    return {k: (over[k] if k in over else (lambda s, k=k: learning(s)[k])) for k in learning(1)}


def test_a_healthy_grpo_run_has_no_reward_findings(tmp_path):
    assert run(tmp_path, "ok", **curves()) == []


def test_reward_rising_while_the_kl_explodes_is_reward_hacking(tmp_path):
    found = run(tmp_path, "kl", "train.grpo_beta=0.04", **curves(kl=lambda s: 0.05 * s))
    f = next(f for f in found if f.code == "reward.hacking_kl")
    assert f.severity == "high" and "reward hacking" in f.title and "nats a token" in f.title
    assert "rose from 0.250 to 0.570" in f.evidence[0] and f.set == {"train.grpo_beta": 0.1}


def test_reward_rising_while_completions_grow_is_reward_hacking(tmp_path):
    found = run(tmp_path, "len", "train.grpo_loss=grpo", **curves(completion_len=lambda s: 4.0 * s))
    f = next(f for f in found if f.code == "reward.hacking_length")
    assert f.severity == "high" and "longer" in f.title and f.set == {"train.grpo_loss": "dapo"}
    assert "from 10.0 to 74.0 tokens" in f.evidence[0]
    # the same growth with the reward flat is not hacking (and a steady length with a rising reward is learning)
    assert not any(f.code.startswith("reward.hacking")
                   for f in run(tmp_path, "len-flat", **curves(completion_len=lambda s: 4.0 * s,
                                                               reward=lambda s: 0.3)))


def test_reward_falling_while_completions_grow_is_a_collapse_not_a_hard_reward(tmp_path):
    """A walk's GRPO run at too high a rate: the reward 0.23 -> 0, completions 5 -> 60 tokens, then every group
    all wrong. The doctor said "too hard" and suggested more completions; it is the steps: a smaller rate."""
    found = run(tmp_path, "fall", "train.lr=3e-3", **curves(reward=lambda s: max(0.0, 0.25 - 0.02 * s),
                                                           completion_len=lambda s: 5.0 + 3.0 * s,
                                                           no_signal=lambda s: 0.9))
    assert [f.code for f in found] == ["reward.collapse"], [f.code for f in found]
    f = found[0]
    assert f.severity == "high" and "the reward fell from 0.200 to 0.000" in f.title and "grew" in f.title
    assert f.set == {"train.lr": 1e-3}


def test_most_groups_without_signal_and_a_high_mean_is_too_easy(tmp_path):
    found = run(tmp_path, "easy", **curves(no_signal=lambda s: 0.95, reward=lambda s: 0.97, reward_std=lambda s: 0.1))
    assert [f.code for f in found] == ["reward.too_easy"]   # not also "never moves": the no-signal line explains it
    f = found[0]
    assert f.severity == "low" and "too easy" in f.title and "95 %" in f.title and "stop it here" in f.change


def test_most_groups_without_signal_and_a_low_mean_is_too_hard(tmp_path):
    found = run(tmp_path, "hard", "train.grpo_group=4",
                **curves(no_signal=lambda s: 0.9, reward=lambda s: 0.02, reward_std=lambda s: 0.1))
    f = next(f for f in found if f.code == "reward.too_hard")
    assert f.severity == "medium" and "too hard" in f.title and f.set == {"train.grpo_group": 8}
    assert any("graded reward" in a for a in f.also)


def test_no_signal_in_only_some_of_the_last_steps_is_not_flagged(tmp_path):
    found = run(tmp_path, "dip", **curves(no_signal=lambda s: 0.9 if s % 2 else 0.5))
    assert not any(f.code.startswith("reward.too") for f in found)


def test_a_reward_that_never_moves(tmp_path):
    found = run(tmp_path, "flat", **curves(reward=lambda s: 0.31 + (0.002 if s % 2 else 0.0)))
    f = next(f for f in found if f.code == "reward.flat")
    assert f.severity == "medium" and "never moves" in f.title and "train.lr" in f.set
    assert f.step == 20 and "sd 0.400" in f.evidence[0]


def test_a_grpo_runs_few_prompts_are_not_a_corpus_too_small(tmp_path):
    """A GRPO run draws its prompts again every epoch by design and has no val loss: the data findings a text run
    with 45 tokens of corpus gets (read 68 times, a tiny val split; seen on a walk's 12-prompt run) are not its."""
    assert run(tmp_path, "few", tokens=(45, 5), kind="data", **curves()) == []
    p = resolve_preset("cpu-small", ["model.vocab_size=512", "train.max_iters=20", "train.warmup_iters=2"])
    with RunDir(tmp_path, "text", preset_to_toml(p)) as r:   # the same sizes on a text run: both findings
        r.event("start", 0, device="cpu", precision="fp32", params=131_392, train_tokens=45, val_tokens=5,
                tokens_per_step=p.tokens_per_step(), corpus="tiny.txt", pid=1, world_size=1)
        r.status(state="finished", step=20, max_iters=20, pid=1)
    found = [f for f in diagnose(read_run(r.path), HardwareSnapshot(info=CPU)) if f.kind == "data"]
    assert any("read its training text" in f.title for f in found) and any("tiny" in f.title for f in found), found
