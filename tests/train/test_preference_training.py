"""Preference objectives in the trainer (workbench/train/objective.py), on real tiny runs: a chat-tuned run, then
DPO on pairs of its task (full and LoRA, from a base and from a LoRA run), KTO, SimPO; the step-0 check (ln 2 and
zero rewards) and the reference check (TRL #1107: the reference is the policy itself) catching a broken
reference; LoRA's reference costing no second copy of the weights; kill -9 and resume, bitwise; export and chat."""

from __future__ import annotations

import math
import signal

import pytest
import torch

from tests.support.chat import conversations, pair_records, write_jsonl
from tests.support.cli import tiny, wb
from tests.support.runs import losses, read_jsonl
from workbench import rundir

LN2 = math.log(2)
STEPS = ["model.seq_len=64", "train.eval_interval=4", "train.ckpt_interval=4", "train.eval_iters=1"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A runs directory with a chat-tuned run (sft), a LoRA chat fine-tune of it (sft-lora), and the data."""
    root = tmp_path_factory.mktemp("pref-runs")
    chats = write_jsonl(root.parent / "chats.jsonl", conversations(200, seed=2))
    pairs = write_jsonl(root.parent / "pairs.jsonl", pair_records(120))
    kto = write_jsonl(root.parent / "kto.jsonl", [
        {"prompt": r["prompt"], "completion": r["chosen"] if i % 2 else r["rejected"], "label": bool(i % 2)}
        for i, r in enumerate(pair_records(120))])
    wb("train", "cpu-small", "--name", "sft", "--corpus", str(chats), "--runs-dir", str(root),
       *tiny(*STEPS, "train.max_iters=24", "train.eval_interval=24", "train.ckpt_interval=24", "train.lr=3e-3"),
       check=True)
    wb("train", "cpu-small", "--init-from", "sft", "--name", "sft-lora", "--corpus", str(chats), "--runs-dir",
       str(root), *tiny(*STEPS, "train.max_iters=8", "train.finetune=lora", "train.lr=1e-2"), check=True)
    return {"root": root, "chats": chats, "pairs": pairs, "kto": kto}


def train(base, name, source, corpus, *sets, env=None):
    return wb("train", "cpu-small", "--init-from", source, "--name", name, "--corpus", str(base[corpus]),
              "--runs-dir", str(base["root"]), *tiny(*STEPS, *sets), env=env)


def prefs(run_dir, split="train"):
    return [r for r in read_jsonl(run_dir / rundir.METRICS_FILE) if r.get("kind") == "pref" and r["split"] == split]


def first_eval(run_dir):
    return next(r for r in read_jsonl(run_dir / rundir.METRICS_FILE) if r.get("kind") == "eval")


def test_dpo_starts_at_ln2_with_zero_rewards_and_learns(base):
    cp = train(base, "dpo", "sft", "pairs", "train.objective=dpo", "train.max_iters=8", "train.lr=3e-3",
               "train.pref_reference=live")  # the frozen copy (precomputed: tests/train/test_preference_reference.py)
    assert cp.returncode == 0, cp.stderr
    d = base["root"] / "dpo"
    assert "reference: frozen copy" in cp.stdout
    ev = first_eval(d)
    assert ev["step"] == 0 and ev["train_loss"] == pytest.approx(LN2, abs=1e-6) and \
        ev["val_loss"] == pytest.approx(LN2, abs=1e-6)
    first = prefs(d)[0]
    assert first["step"] == 1 and first["loss"] == pytest.approx(LN2, abs=1e-6)
    assert first["chosen_reward"] == 0 and first["rejected_reward"] == 0 and first["margin"] == 0
    assert first["chosen_drift"] == 0 and first["rejected_drift"] == 0
    last = prefs(d)[-1]
    assert last["margin"] > 0 and last["loss"] < LN2  # the pairs are learnable: the margin opens
    val = prefs(d, "val")
    assert [r["step"] for r in val] == [0, 4, 8] and val[-1]["accuracy"] is not None
    start = next(r for r in read_jsonl(d / rundir.METRICS_FILE) if r.get("event") == "start")
    assert start["objective"]["reference"] == "frozen copy" and start["objective"]["beta"] == 0.1
    assert start["preference"]["items"] == 120
    # a DPO-tuned model chats and exports like any other
    chat = wb("chat", "dpo", "--runs-dir", str(base["root"]), "--message", "Sort: 3 1 2", "--max-new-tokens", "4")
    assert chat.returncode == 0, chat.stderr
    out = base["root"].parent / "dpo-hf"
    assert wb("export", "dpo", str(out), "--runs-dir", str(base["root"])).returncode == 0
    assert (out / "config.json").exists()


def test_a_reference_that_moves_with_the_policy_is_caught(base):
    """TRL #1107: the reference is the policy itself. Step 0 passes (they are equal), the first batch after an
    update has every reward exactly 0: the run stops, exit 1, one line."""
    cp = train(base, "same", "sft", "pairs", "train.objective=dpo", "train.max_iters=6",
               env={"WORKBENCH_TEST_REFERENCE_IS_POLICY": "1"})
    assert cp.returncode == 1, (cp.stdout, cp.stderr)
    err = cp.stderr.strip()
    assert "\n" not in err and "reference check failed" in err and "TRL #1107" in err
    st = rundir.read_status(base["root"] / "same")
    assert st.state == "failed" and st.step <= 3


def test_lora_dpo_from_a_lora_run_compares_with_that_adapter(base):
    """From a chat-tuned LoRA run the reference is that run's model (its adapter merged into the new run's frozen
    weights): step 0 is ln 2. Its base without the adapter, as the reference, is caught by the step-0 check."""
    cp = train(base, "lora-dpo", "sft-lora", "pairs", "train.objective=dpo", "train.finetune=lora",
               "train.max_iters=4")
    assert cp.returncode == 0, cp.stderr
    d = base["root"] / "lora-dpo"
    assert "sft-lora step 8's own adapter, merged into the frozen weights" in cp.stdout
    assert first_eval(d)["val_loss"] == pytest.approx(LN2, abs=1e-6)
    assert prefs(d)[0]["loss"] == pytest.approx(LN2, abs=1e-6)

    # the reference TRL's "disable the adapters" would give here: the source's base, under its adapter
    from workbench.config import load_preset_file
    from workbench.data.preset_data import prepare_data
    from workbench.plan.recipe.objective_plan import objective_plan
    from workbench.train.checkpoint import load_init_weights
    from workbench.train.model import GPT
    from workbench.train.objective import Objective, ObjectiveCheckError, Reference
    p = load_preset_file(d / rundir.PRESET_FILE)
    policy, under = GPT(p.model), GPT(p.model)
    policy.load_state_dict(load_init_weights(d))           # sft-lora's model (its adapter merged)
    under.load_state_dict(load_init_weights(base["root"] / "sft-lora"))  # sft: the weights under the adapter
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: None, run_dir=d,
                        objective="dpo")
    batch = data.sampler("train", p, 1).next_batch().map(torch.from_numpy)
    good = Objective(objective_plan(p), p.train, policy, Reference("frozen copy", policy, policy))
    good.at_step(0, 0.0, fresh=True)
    assert good.loss(policy, batch, None).item() == pytest.approx(LN2, abs=1e-6)
    wrong = Objective(objective_plan(p), p.train, policy, Reference("adapters off", policy, under))
    wrong.reference.kind = "frozen copy"
    wrong.at_step(0, 0.0, fresh=True)
    with pytest.raises(ObjectiveCheckError, match="step-0 check failed.*DPO loss 0\\.\\d+ \\(ln 2"):
        wrong.loss(policy, batch, None)


def test_lora_dpo_from_a_base_holds_no_second_copy_of_the_weights(base):
    """Estimate and measured peak of LoRA DPO (4 pairs: 8 rows) within 10 % of LoRA SFT of the same shape (8
    conversations a row, unpacked); a full fine-tune's DPO estimate with a live reference counts a frozen copy."""
    from workbench.config import resolve_preset
    from workbench.plan.fit.memory import estimate_memory
    shape = ["model.seq_len=64", "train.finetune=lora", "train.max_iters=4"]
    cp = train(base, "lora-dpo-base", "sft", "pairs", "train.objective=dpo", "train.batch_size=4", *shape)
    assert cp.returncode == 0, cp.stderr
    assert "reference: adapters off (run sft step 24 itself" in cp.stdout
    cp = train(base, "lora-sft", "sft", "chats", "train.batch_size=8", "data.packing=false", *shape)
    assert cp.returncode == 0, cp.stderr
    peaks = {}
    for run in ("lora-dpo-base", "lora-sft"):
        recs = [r for r in read_jsonl(base["root"] / run / rundir.METRICS_FILE) if r.get("kind") == "train"]
        peaks[run] = max(r["mem_peak_rss_mb"] for r in recs)
    assert abs(peaks["lora-dpo-base"] / peaks["lora-sft"] - 1) < 0.10, peaks
    est = {}
    for run in ("lora-dpo-base", "lora-sft"):
        p = resolve_preset(str(base["root"] / run / rundir.PRESET_FILE), [])
        est[run] = estimate_memory(p)
    assert est["lora-dpo-base"].reference == "adapters off" and est["lora-dpo-base"].components["reference"] == 0
    assert abs(est["lora-dpo-base"].total / est["lora-sft"].total - 1) < 0.10
    full = resolve_preset(str(base["root"] / "lora-dpo-base" / rundir.PRESET_FILE), ["train.finetune=full",
                                                                                     "train.pref_reference=live"])
    m = estimate_memory(full)
    assert m.reference == "frozen copy" and m.components["reference"] == 4 * m.params


def test_kill_minus_nine_during_dpo_resumes_bitwise(base):
    sets = ["train.objective=dpo", "train.max_iters=10", "train.lr_decay_iters=10", "train.ckpt_interval=4",
            "train.eval_interval=10", "train.pref_reference=live"]  # precomputed: test_preference_reference.py
    assert train(base, "straight", "sft", "pairs", *sets).returncode == 0
    want = losses(base["root"] / "straight")
    cp = train(base, "killed", "sft", "pairs", *sets, env={"WORKBENCH_TEST_KILL_AT_STEP": "6"})
    assert cp.returncode == -signal.SIGKILL
    d = base["root"] / "killed"
    res = wb("resume", "killed", "--runs-dir", str(base["root"]), check=True)
    assert "resumed from checkpoint step_0000004" in res.stdout
    assert losses(d) == want and len(want) == 10  # every step's loss, bit for bit
    assert "step-0" not in (d / rundir.LOG_FILE).read_text()


@pytest.mark.parametrize("objective,corpus,start", [("kto", "kto", 0.5), ("simpo", "pairs", None)])
def test_kto_and_simpo_train(base, objective, corpus, start):
    cp = train(base, objective, "sft", corpus, f"train.objective={objective}", "train.max_iters=4")
    assert cp.returncode == 0, cp.stderr
    d = base["root"] / objective
    if start is not None:  # KTO at step 0: every reward 0, so each answer's loss is 1 - sigmoid(0)
        assert first_eval(d)["val_loss"] == pytest.approx(start, abs=1e-6)
        assert "reference: frozen copy" in cp.stdout
    else:
        assert "no reference" in cp.stdout
    assert len(prefs(d)) == 4 and all(math.isfinite(r["loss"]) for r in prefs(d))


def test_dpop_holds_up_the_chosen_answers_dpo_pushes_down(base):
    """train.dpop_lambda reaches the loss: the same seed, data and steps as plain DPO; step 1 is DPO's to the bit
    (policy = reference: no penalty, and the hinge's gradient there is 0), and once plain DPO has pushed the chosen
    answers below the reference, DPOP's stay higher."""
    sets = ["train.objective=dpo", "train.max_iters=8", "train.lr=3e-3"]
    assert train(base, "dpo-plain", "sft", "pairs", *sets).returncode == 0
    cp = train(base, "dpop", "sft", "pairs", *sets, "train.dpop_lambda=50")
    assert cp.returncode == 0, cp.stderr
    plain, dpop = prefs(base["root"] / "dpo-plain"), prefs(base["root"] / "dpop")
    assert dpop[0]["loss"] == pytest.approx(LN2, abs=1e-6) and dpop[0]["chosen_reward"] == 0
    assert dpop[0]["loss"] == plain[0]["loss"]
    # the first update was DPO's: step 2 starts from the same weights (its loss may differ: the penalty)
    assert [(r["chosen_drift"], r["rejected_drift"]) for r in dpop[:2]] == \
        [(r["chosen_drift"], r["rejected_drift"]) for r in plain[:2]]
    assert plain[-1]["chosen_drift"] < 0
    assert dpop[-1]["chosen_drift"] > plain[-1]["chosen_drift"]


def test_a_frozen_copy_under_bf16_autocast_starts_at_ln2(base):
    """The frozen copy kept in the compute dtype must compute what the policy computes under autocast: an
    all-bf16 copy (its embedding and norms too) gave rewards of up to 9e-3 at step 0 on CUDA, over the step-0
    check's tolerance, and every live-reference DPO run on a GPU refused to start. CPU bf16 autocast shows it."""
    cp = train(base, "dpo-bf16", "sft", "pairs", "train.objective=dpo", "train.max_iters=4", "train.eval_interval=4",
               "train.pref_reference=live", "hardware.precision=bf16")
    assert cp.returncode == 0, cp.stderr
    first = prefs(base["root"] / "dpo-bf16")[0]
    assert first["step"] == 1 and first["chosen_reward"] == 0 and first["rejected_reward"] == 0
    # and the estimate counts the copy as it is built: bf16 matrices, fp32 embedding and norms
    import dataclasses

    from workbench.config import resolve_preset
    from workbench.faults import Faults
    from workbench.plan.fit.memory import estimate_memory
    from workbench.plan.recipe.objective_plan import objective_plan
    from workbench.train.checkpoint import load_run_model
    from workbench.train.objective import build_objective
    p = dataclasses.replace(resolve_preset(str(base["root"] / "sft" / rundir.PRESET_FILE), [
        "train.objective=dpo", "train.pref_reference=live", "hardware.precision=bf16"]),
        init={"run": "sft", "step": 24})
    model = load_run_model(base["root"] / "sft").model
    ref = build_objective(p, objective_plan(p), model, torch.device("cpu"), model.state_dict(), torch.bfloat16,
                          Faults()).reference
    held = sum(t.numel() * t.element_size() for t in ref.frozen.parameters())
    assert {t.dtype for t in ref.frozen.parameters()} == {torch.bfloat16, torch.float32}
    assert estimate_memory(p).components["reference"] == held


def test_a_full_preference_fine_tune_starts_at_a_fine_tuning_learning_rate(base):
    """The presets' rates are for training from scratch: a full DPO (KTO, SimPO, ORPO) fine-tune takes lr and min_lr
    of at most 3e-5 unless --set says otherwise; a LoRA one keeps the preset's; SFT takes its own fine-tuning rate
    (tests/plan/test_finetune_lr.py); the start line says which."""
    from workbench.plan.recipe.finetune import PREFERENCE_MAX_LR, SFT_MAX_LR
    from workbench.plan.run_plan import NewRun, plan_new_run

    def planned(*sets):
        return plan_new_run(NewRun("cpu-small", tuple(sets), (str(base["pairs"]),), "sft"), base["root"]).preset.train
    preset_lr = plan_new_run(NewRun("cpu-small", (), (str(base["chats"]),)), base["root"]).preset.train.lr
    assert preset_lr > PREFERENCE_MAX_LR  # else this test shows nothing
    for objective in ("dpo", "kto", "simpo", "orpo"):
        t = planned(f"train.objective={objective}")
        assert (t.lr, t.min_lr) == (PREFERENCE_MAX_LR, PREFERENCE_MAX_LR), objective
    asked = planned("train.objective=dpo", "train.lr=1e-3")
    assert asked.lr == 1e-3 and asked.min_lr <= 1e-3
    lower = planned("train.objective=dpo", "train.lr=1e-6", "train.min_lr=1e-7")
    assert (lower.lr, lower.min_lr) == (1e-6, 1e-7)
    assert planned("train.objective=dpo", "train.finetune=lora").lr == preset_lr
    sft = plan_new_run(NewRun("cpu-small", (), (str(base["chats"]),), "sft"), base["root"]).preset.train
    assert sft.lr == SFT_MAX_LR  # was the preset's from-scratch rate: issue 53's "Fine-tuning defaults"
    cp = train(base, "dpo-lr", "sft", "pairs", "train.objective=dpo", "train.max_iters=4")
    assert cp.returncode == 0, cp.stderr
    assert "adamw lr 3e-05 (a full preference fine-tune's at most; --set train.lr to change)" in cp.stdout
    from workbench.config import load_preset_file
    saved = load_preset_file(base["root"] / "dpo-lr" / rundir.PRESET_FILE).train  # what a resume will use
    assert saved.lr == PREFERENCE_MAX_LR
