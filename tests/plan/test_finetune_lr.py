"""A fine-tune's learning rate (workbench/plan/recipe/finetune.py, FINETUNE_RATES): a full SFT fine-tune from
--init-from takes a fine-tuning rate, not the preset's from-scratch one (cpu-small's 3e-3; issue 53, "Fine-tuning
defaults"), says so in its first line and keeps it in the run's preset.toml; --set train.lr wins; a lower preset rate is
kept; LoRA takes its own; preference fine-tunes keep their 3e-5 cap. Real fine-tunes of a tiny run."""

from __future__ import annotations

import pytest

from tests.support.chat import conversations, pair_records, write_jsonl
from tests.support.cli import REPO, tiny, wb
from tests.support.runs import read_jsonl
from workbench import rundir
from workbench.config import load_preset_file, resolve_preset
from workbench.plan.recipe.finetune import (
    GRPO_MAX_LR,
    LORA_SFT_MAX_LR,
    PREFERENCE_MAX_LR,
    SFT_MAX_LR,
    finetune_lr_note,
    finetune_lr_rule,
)
from workbench.plan.run_plan import NewRun, plan_new_run

STEPS = ["model.seq_len=64", "train.max_iters=6", "train.eval_interval=6", "train.ckpt_interval=6",
         "train.eval_iters=1"]
PRESET = resolve_preset("cpu-small", []).train  # the preset's from-scratch rates


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A runs directory with a tiny pretrained run (pre), a chat corpus and preference pairs."""
    root = tmp_path_factory.mktemp("ft-lr-runs")
    chats = write_jsonl(root.parent / "chats.jsonl", conversations(120, seed=2))
    pairs = write_jsonl(root.parent / "pairs.jsonl", pair_records(60))
    wb("train", "cpu-small", "--name", "pre", "--runs-dir", str(root),
       *tiny("train.max_iters=10", "train.eval_interval=10", "train.ckpt_interval=10", "train.lr=3e-3"), check=True)
    prompts = root.parent / "prompts.jsonl"
    prompts.write_text("".join(f'{{"prompt": "what is {i}+1?", "answer": "{i + 1}"}}\n' for i in range(12)))
    return {"root": root, "chats": chats, "pairs": pairs, "prompts": prompts}


def planned(base, *sets, preset="cpu-small", corpus="chats"):
    """The train section a fine-tune of pre with these --set would take (plan_new_run: what train, estimate, fit and
    the TUI's form all ask)."""
    return plan_new_run(NewRun(preset, tuple(sets), (str(base[corpus]),), "pre"), base["root"]).preset.train


def fine_tune(base, name, *sets, corpus="chats"):
    cp = wb("train", "cpu-small", "--init-from", "pre", "--name", name, "--corpus", str(base[corpus]),
            "--runs-dir", str(base["root"]), *tiny(*STEPS, *sets))
    assert cp.returncode == 0, cp.stderr
    return cp


def peak_lr(run_dir):
    return max(r["lr"] for r in read_jsonl(run_dir / rundir.METRICS_FILE) if r.get("kind") == "train")


def test_a_full_sft_fine_tune_takes_the_fine_tuning_rate(base):
    """Red before FINETUNE_RATES had an sft row: the run took cpu-small's 3e-3 (`adamw lr 0.003` in its first line,
    preset.toml's lr 0.003) on a pretrained model."""
    assert PRESET.lr > SFT_MAX_LR  # else this test shows nothing
    cp = fine_tune(base, "sft")
    assert f"adamw lr {SFT_MAX_LR:g} (a full fine-tune's at most; --set train.lr to change)" in cp.stdout
    saved = load_preset_file(base["root"] / "sft" / rundir.PRESET_FILE).train  # what a resume will use
    factor = SFT_MAX_LR / PRESET.lr
    assert saved.lr == SFT_MAX_LR  # and min_lr scaled with it: the preset's decay, 3 significant figures
    assert saved.min_lr == pytest.approx(PRESET.min_lr * factor, rel=1e-2)
    assert saved.objective == "sft" and saved.finetune == "full"
    assert peak_lr(base["root"] / "sft") == pytest.approx(SFT_MAX_LR)  # and the trainer trained at it


def test_set_train_lr_wins(base):
    assert SFT_MAX_LR != 5e-4  # else the rule and the user's rate could not be told apart
    cp = fine_tune(base, "sft-asked", "train.lr=5e-4")
    assert "adamw lr 0.0005\n" in cp.stdout  # nothing said: the rate is the user's
    saved = load_preset_file(base["root"] / "sft-asked" / rundir.PRESET_FILE).train
    assert (saved.lr, saved.min_lr) == (5e-4, PRESET.min_lr)
    assert planned(base, "train.lr=3e-3").lr == 3e-3  # the preset's own rate too, when asked for by name


def test_a_lower_preset_rate_is_kept(base, tmp_path):
    text = (REPO / "presets" / "cpu-small.toml").read_text()
    slow = tmp_path / "slow.toml"
    slow.write_text(text.replace('name = "cpu-small"', 'name = "slow"').replace("lr = 3e-3", "lr = 1e-4")
                    .replace("min_lr = 1e-4", "min_lr = 1e-5"))
    t = planned(base, "train.optimizer=adamw", preset=str(slow))
    assert (t.lr, t.min_lr) == (1e-4, 1e-5)
    assert finetune_lr_note(t, ["train.optimizer=adamw"]) == ""  # no rule set it: nothing said
    # and a --set min_lr is the user's, under the lowered rate
    t = planned(base, "train.min_lr=2e-5")
    assert (t.lr, t.min_lr) == (SFT_MAX_LR, 2e-5)


def test_muon_asked_for_scales_with_the_rate(base):
    """A full fine-tune takes AdamW unless --set train.optimizer=muon; then the rate is the schedule's scale: Muon's
    muon_lr lowered by the same factor (unless --set chose it)."""
    t = planned(base, "train.optimizer=muon")
    factor = SFT_MAX_LR / PRESET.lr
    assert t.optimizer == "muon" and t.lr == SFT_MAX_LR
    assert t.muon_lr == pytest.approx(PRESET.muon_lr * factor, rel=1e-2)
    assert planned(base, "train.optimizer=muon", "train.muon_lr=0.01").muon_lr == 0.01
    assert planned(base).muon_lr == PRESET.muon_lr  # AdamW: muon_lr unused, left as it was


def test_lora_takes_its_own_rate_and_says_so(base):
    """LoRA's rows: a LoRA SFT fine-tune at most LORA_SFT_MAX_LR (bench/finetune_lr.py), said as the full one is; a
    LoRA preference fine-tune keeps the preset's (as it did), and says that."""
    assert PRESET.lr > LORA_SFT_MAX_LR  # else this test shows nothing
    t = planned(base, "train.finetune=lora")
    assert t.lr == LORA_SFT_MAX_LR and t.min_lr == pytest.approx(PRESET.min_lr * LORA_SFT_MAX_LR / PRESET.lr, rel=1e-2)
    cp = fine_tune(base, "lora", "train.finetune=lora")
    assert f"adamw lr {LORA_SFT_MAX_LR:g} (a LoRA fine-tune's at most; --set train.lr to change)" in cp.stdout
    assert load_preset_file(base["root"] / "lora" / rundir.PRESET_FILE).train.lr == LORA_SFT_MAX_LR
    assert planned(base, "train.finetune=lora", "train.lr=3e-3").lr == 3e-3
    dpo = planned(base, "train.finetune=lora", "train.objective=dpo", corpus="pairs")
    assert dpo.lr == PRESET.lr
    assert finetune_lr_note(dpo, []) == \
        " (the preset's: a LoRA preference fine-tune keeps it; --set train.lr to change)"


def test_preference_fine_tunes_keep_their_cap(base):
    """The one rule table serves both objectives: a full DPO (KTO, SimPO, ORPO) fine-tune is capped at 3e-5, flat
    (min_lr too), not at the SFT rate."""
    for objective in ("dpo", "kto", "simpo", "orpo"):
        t = planned(base, f"train.objective={objective}", corpus="pairs")
        assert (t.lr, t.min_lr) == (PREFERENCE_MAX_LR, PREFERENCE_MAX_LR), objective
        assert finetune_lr_rule(t, []).said == "a full preference fine-tune's at most"
    assert planned(base, "train.objective=dpo", "train.lr=1e-3", corpus="pairs").lr == 1e-3
    cp = fine_tune(base, "dpo", "train.objective=dpo", corpus="pairs")
    assert f"adamw lr {PREFERENCE_MAX_LR:g} (a full preference fine-tune's at most; --set train.lr to change)" \
        in cp.stdout
    assert load_preset_file(base["root"] / "dpo" / rundir.PRESET_FILE).train.lr == PREFERENCE_MAX_LR


def test_a_grpo_fine_tune_takes_the_fine_tuning_rate_not_the_presets(base):
    """GRPO fine-tunes a trained model too: at most GRPO_MAX_LR (full and LoRA), not cpu-small's 3e-3 from scratch
    (red before its rows: a walk's GRPO run at 3e-3 collapsed to reward 0 with 60-token completions)."""
    sets = ("train.objective=grpo", "train.reward=exact:answer")
    full = planned(base, *sets, corpus="prompts")
    assert full.lr == GRPO_MAX_LR and finetune_lr_rule(full, []).said == "a GRPO fine-tune's at most"
    lora = planned(base, *sets, "train.finetune=lora", corpus="prompts")
    assert lora.lr == GRPO_MAX_LR and finetune_lr_rule(lora, []).said == "a GRPO fine-tune's at most"
    assert planned(base, *sets, "train.lr=3e-3", corpus="prompts").lr == 3e-3   # --set wins


def test_a_run_from_scratch_keeps_the_preset_rate(base):
    p = plan_new_run(NewRun("cpu-small", (), (str(base["chats"]),)), base["root"]).preset.train
    assert (p.lr, p.min_lr) == (PRESET.lr, PRESET.min_lr)
