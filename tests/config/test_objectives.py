"""The table of objectives (workbench/config/objectives.py) is the one source of an objective's facts: every
objective the schema accepts has a row, a loss in the trainer's registry, corpus kinds the data layer knows and a
help line; the help that names their defaults agrees with it; an unknown name is one line (issue 55)."""

from __future__ import annotations

import pytest

from workbench.config import PresetError, TrainConfig, resolve_preset
from workbench.config.objectives import (
    CHAT,
    KTO,
    OBJECTIVE_NAMES,
    OBJECTIVES,
    PAIRS,
    PROMPTS,
    SFT,
    TEXT,
    UnknownObjectiveError,
    key_readers,
    objective_spec,
    objectives_on,
)
from workbench.data.corpus.kinds import DESCRIBE, KINDS, OBJECTIVE_FOR
from workbench.data.preference.preference_records import PreferenceError, check_corpus_kind
from workbench.plan.recipe.objective_plan import objective_plan
from workbench.train.objective import ANSWER_LOSSES, PAIR_LOSSES


def test_the_schema_takes_its_choices_and_defaults_from_the_table():
    train = {f.name: f for f in TrainConfig.__dataclass_fields__.values()}
    assert train["objective"].metadata["choices"] == OBJECTIVE_NAMES == ("sft", "dpo", "simpo", "orpo", "kto", "grpo")
    assert TrainConfig().objective == SFT
    doc = train["objective"].metadata["doc"]
    for name, spec in OBJECTIVES.items():
        assert spec.summary and "\n" not in spec.summary, name
        assert name in doc, name
    # pref_beta's help names each preference objective's default: it must say what the table says
    beta_doc = train["pref_beta"].metadata["doc"]
    for name, spec in OBJECTIVES.items():
        if spec.preference:
            assert f"{name} {spec.default_beta:.1f}" in beta_doc, name
    # every key an objective calls its own is a train key whose help names the objective
    for name, spec in OBJECTIVES.items():
        for key in spec.keys:
            assert key in train, (name, key)
            if key != "pref_beta":   # the family's key ("Preference objectives: ...")
                assert name in train[key].metadata["doc"], (name, key)


def test_every_objective_has_a_loss_data_and_a_reference_rule():
    losses = set(PAIR_LOSSES) | set(ANSWER_LOSSES)
    assert not set(PAIR_LOSSES) & set(ANSWER_LOSSES)
    assert losses == {n for n, s in OBJECTIVES.items() if s.preference}, "a preference objective without a loss"
    for name, spec in OBJECTIVES.items():
        assert spec.data and set(spec.data) <= set(DESCRIBE), name   # kinds the data layer can describe
        if spec.samples:                         # GRPO: prompts, a reward, its own samples (train/grpo_run.py)
            assert spec.data == (PROMPTS,) and spec.takes_reward and not spec.reference, name
            continue
        if not spec.preference:                  # the model's own loss (train/batches.py) on text or chat
            assert set(spec.data) == {TEXT, CHAT} and not spec.reference and spec.default_beta == 0, name
            continue
        assert spec.default_beta > 0, name
        assert set(spec.data) <= set(KINDS), name
        paired = spec.data == (PAIRS,)
        assert (name in PAIR_LOSSES) == paired and spec.rows_per_item == (2 if paired else 1), name
        assert not spec.reference_margin or spec.reference, name       # DPO's ln 2 needs the reference
    for kind in KINDS:
        assert OBJECTIVE_FOR[kind] == objectives_on(kind)[0]
    assert key_readers("dpop_lambda") == ("dpo",)


def test_an_unknown_objective_is_one_line():
    with pytest.raises(UnknownObjectiveError) as e:
        objective_spec("ppo")
    assert str(e.value) == "train.objective = 'ppo' is not one of sft, dpo, simpo, orpo, kto, grpo"
    with pytest.raises(PresetError) as e2:
        resolve_preset("cpu-small", ["train.objective=ppo"])
    assert "\n" not in str(e2.value) and "is not one of sft, dpo, simpo, orpo, kto, grpo" in str(e2.value)


@pytest.mark.parametrize("name", OBJECTIVE_NAMES)
def test_the_plan_and_the_data_check_follow_the_row(name):
    spec = OBJECTIVES[name]
    reward = ["train.reward=exact:answer"] if spec.takes_reward else []   # grpo refuses to start without one
    p = resolve_preset("cpu-small", [f"train.objective={name}", "model.dropout=0", *reward])
    p.init = {"run": "base", "step": 10}   # a reference objective compares with the model it started from
    plan = objective_plan(p)
    assert plan.preference == spec.preference and plan.rows_per_item == spec.rows_per_item
    assert plan.averaged == spec.averaged
    assert (plan.reference != "none") == spec.reference
    if spec.preference:
        assert plan.beta == spec.default_beta
    assert p.tokens_per_step() == spec.rows_per_item * p.train.batch_size * p.train.grad_accum * p.model.seq_len
    for kind in spec.data:
        check_corpus_kind(name, kind, "corpus")
    for kind in set(DESCRIBE) - set(spec.data):
        if spec.preference or kind in KINDS:
            with pytest.raises(PreferenceError):
                check_corpus_kind(name, kind, "corpus")


def test_the_hints_name_the_objectives_on_each_kind():
    with pytest.raises(PreferenceError) as e:
        check_corpus_kind("sft", PAIRS, "pairs.jsonl")
    assert str(e.value) == ("pairs.jsonl holds preference pairs (prompt, chosen, rejected), which train.objective = "
                            "sft cannot train on; set train.objective = dpo (or simpo, orpo) (--set "
                            "train.objective=dpo)")
    with pytest.raises(PreferenceError) as e:
        check_corpus_kind("dpo", KTO, "rated.jsonl")
    assert str(e.value) == ("train.objective = dpo trains on preference pairs (prompt, chosen, rejected), but "
                            "rated.jsonl holds labelled answers (prompt, completion, label); set train.objective = kto")


def test_grpo_takes_a_reward_and_its_reference_only_with_a_kl_term():
    with pytest.raises(PresetError) as e:
        resolve_preset("cpu-small", ["train.objective=grpo", "model.dropout=0"])
    assert "\n" not in str(e.value) and "train.reward is not set" in str(e.value)
    with pytest.raises(PresetError) as e:
        resolve_preset("cpu-small", ["train.reward=exact:answer"])
    assert "train.objective = sft trains on given data; set train.objective = grpo" in str(e.value)
    p = resolve_preset("cpu-small", ["train.objective=grpo", "model.dropout=0", "train.reward=exact:answer"])
    with pytest.raises(PresetError) as e:
        objective_plan(p)   # it samples from a trained model
    assert "--init-from RUN" in str(e.value)
    p.init = {"run": "base", "step": 10}
    assert objective_plan(p).reference == "none"
    p.train.grpo_beta = 0.04
    assert objective_plan(p).reference == "frozen copy"
    p.train.finetune = "lora"
    assert objective_plan(p).reference == "adapters off"
