"""The run doctor on preference runs (workbench/analysis/doctor/preference.py), hand-written as the trainer writes
them: a DPO loss that never leaves ln 2, a reward accuracy stuck from the start, the chosen answers collapsing,
and both rewards falling (expected under DPO: explained, with the SFT term as the knob); a healthy run has none."""

from __future__ import annotations

import math

from tests.support.rundirs import RunDir
from workbench.analysis.doctor import diagnose, read_run
from workbench.config import preset_to_toml, resolve_preset
from workbench.machine.activity import HardwareSnapshot

LN2 = math.log(2)
CPU = {"cpu": {"physical_cores": 2, "logical_cores": 2, "ram_total": 16 * 2**30, "ram_available": 12 * 2**30,
               "native_bf16": False}, "nvidia": [], "mps": False, "cxx": True, "calibration": {"cpu:fp32": 2e10}}


def run(tmp_path, rid, objective="dpo", steps=20, **curve):
    """A preference run whose records at step s are each ``curve[name](s)``."""
    p = resolve_preset("cpu-small", ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
                                     "model.vocab_size=512", "model.seq_len=64", "train.max_iters=20",
                                     "train.warmup_iters=2", f"train.objective={objective}"])
    p.init = {"run": "sft", "step": 100}
    with RunDir(tmp_path, rid, preset_to_toml(p)) as r:
        r.event("start", 0, device="cpu", precision="fp32", params=131_392, train_tokens=10**6, val_tokens=10**5,
                tokens_per_step=p.tokens_per_step(), corpus="prefs.jsonl", pid=1, world_size=1)
        for s in range(1, steps + 1):
            vals = {k: f(s) for k, f in curve.items()}
            r.train(s, vals.get("loss"), tokens_per_s=5000.0 if s > 1 else None, tokens_seen=s * 512,
                    memory={"mem_rss_mb": 300.0, "mem_peak_rss_mb": 300.0}, mem_mb=300.0)
            r.pref(s, **vals)
        r.status(state="finished", step=steps, max_iters=20, pid=1)
    return [f for f in diagnose(read_run(r.path), HardwareSnapshot(info=CPU)) if f.kind == "preference"]


def learning(s):  # a healthy DPO run: the margin opens, the chosen answers hold
    return {"loss": LN2 - 0.02 * s, "chosen_reward": 0.01 * s, "rejected_reward": -0.02 * s, "margin": 0.03 * s,
            "accuracy": 0.0 if s == 1 else min(1.0, 0.5 + 0.02 * s), "chosen_drift": 0.1 * s,
            "rejected_drift": -0.2 * s}


def curves(**over):
    keys = learning(1).keys()
    return {k: (over[k] if k in over else (lambda s, k=k: learning(s)[k])) for k in keys}


def test_a_healthy_preference_run_has_no_preference_findings(tmp_path):
    assert run(tmp_path, "ok", **curves()) == []


def test_a_dpo_loss_that_never_leaves_ln2(tmp_path):
    found = run(tmp_path, "flat", **curves(loss=lambda s: LN2 + 1e-4, margin=lambda s: 0.0))
    f = next(f for f in found if f.code == "preference.stuck_ln2")
    assert f.severity == "high" and "20 logged steps" in f.evidence[0] and "train.lr" in f.set


def test_reward_accuracy_stuck_at_one_or_zero_from_the_start(tmp_path):
    for v in (1.0, 0.0):
        found = run(tmp_path, f"acc{v:g}", **curves(accuracy=lambda s, v=v: 0.0 if s == 1 else v))
        f = next(f for f in found if f.code == "preference.accuracy_stuck")
        assert f"stuck at {v:.0%}" in f.title and "data inspect" in f.change


def test_chosen_log_probs_collapsing_asks_for_the_sft_term(tmp_path):
    found = run(tmp_path, "collapse", **curves(chosen_drift=lambda s: -1.0 * s, chosen_reward=lambda s: -0.1 * s))
    f = next(f for f in found if f.code == "preference.chosen_collapse")
    assert f.set == {"train.pref_sft_weight": 1.0} and "-20.00 nats" in f.evidence[0]


def test_both_rewards_falling_under_dpo_is_explained(tmp_path):
    found = run(tmp_path, "both", **curves(chosen_reward=lambda s: -0.01 * s, rejected_reward=lambda s: -0.04 * s,
                                           chosen_drift=lambda s: -0.1 * s))
    assert [f.code for f in found] == ["preference.both_rewards_fall"]
    f = found[0]
    assert f.severity == "low" and "expected under DPO" in f.title and f.set == {"train.pref_sft_weight": 0.5}
