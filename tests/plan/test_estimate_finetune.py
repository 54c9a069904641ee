"""Memory of fine-tuning by method: the estimate models LoRA (frozen weights in the training precision,
adapters and their AdamW states, what autograd keeps), agrees with what autograd saves and what a run
measures, and `workbench estimate --init-from` recommends the method that fits this machine."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest
import torch

from tests.support.cli import wb
from tests.support.hf import FT, VOCAB, cli
from tests.support.saved import saved_bytes
from workbench.config import HardwareConfig, ModelConfig, Preset, TrainConfig, load_preset_file
from workbench.machine.detect import Machine
from workbench.plan.fit.activations import layer_activation_bytes, lora_layer_activation_bytes
from workbench.plan.fit.flops import lora_params
from workbench.plan.fit.memory import estimate_memory
from workbench.plan.recipe.finetune import compare_methods
from workbench.train.lora import apply_lora, cast_frozen
from workbench.train.model import GPT

CFG = ModelConfig(vocab_size=512, dim=128, n_layers=1, n_heads=4, n_kv_heads=2, seq_len=128)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("targets", ["attention,mlp", "wq,wv", "mlp"])
def test_lora_activations_match_what_autograd_keeps(precision, targets):
    """The per-block count against saved-tensor hooks on CPU (flash attention, no dropout): within 3 %;
    LoRA keeps less than full training (no normalised tensors, no inputs of projections without adapters)."""
    t = TrainConfig(finetune="lora", lora_rank=8, lora_targets=targets)
    dtype = torch.bfloat16 if precision == "bf16" else None
    torch.manual_seed(0)
    model = GPT(CFG)
    apply_lora(model, t)
    if dtype is not None:
        cast_frozen(model, dtype)  # as the trainer does (weight casts are counted apart from activations)
    x = torch.randn(2, CFG.seq_len, CFG.dim, requires_grad=True)
    got = saved_bytes(model.layers[0], x, model.rope_cos, model.rope_sin, dtype)
    want = lora_layer_activation_bytes(CFG, t, 2, precision, "flash", "cpu")
    assert abs(got - want) / got < 0.03, (got, want)
    assert want < layer_activation_bytes(CFG, 2, precision, "flash", "cpu")


def test_lora_parameters_and_memory_by_component():
    p = Preset(model=CFG, train=TrainConfig(finetune="lora", lora_rank=8))
    model = GPT(CFG)
    assert apply_lora(model, p.train) == lora_params(CFG, p.train)
    n = sum(q.numel() for q in model.parameters() if not q.requires_grad)
    machine = Machine.assumed("cuda")
    lora = estimate_memory(p, "bf16", "cuda", machine=machine)
    full = estimate_memory(dataclasses.replace(p, train=TrainConfig()), "bf16", "cuda", machine=machine)
    a = lora_params(CFG, p.train)
    assert lora.trainable_params == a and full.trainable_params == n
    # frozen projections in bf16, embedding and norms fp32, adapters fp32; gradients and AdamW for adapters only
    assert lora.components["weights"] == 2 * (n - 512 * 128 - 3 * 128) + 4 * (512 * 128 + 3 * 128) + 4 * a
    assert lora.components["optimizer"] == 8 * a and lora.checkpoint_bytes == 12 * a
    assert lora.total < full.total


def test_methods_recommend_what_fits():
    """With memory for full fine-tuning it is recommended; with less, LoRA; with less still, LoRA with
    activation checkpointing; with less than that, nothing (computed from the estimate, not tabulated). Full
    fine-tuning is the preset's own checkpointing: off here (under auto it would turn on where needed)."""
    p = Preset(model=dataclasses.replace(CFG, n_layers=8, dim=512, n_heads=8, n_kv_heads=4, vocab_size=32000,
                                         seq_len=1024), train=TrainConfig(batch_size=16),
               hardware=HardwareConfig(activation_checkpointing="false"))

    def machine(ram: int) -> Machine:
        return dataclasses.replace(Machine.assumed("cpu"), ram_available=ram, ram_total=ram)

    r = compare_methods(p, machine(256 * 2**30))
    totals = {x["method"]: x["total"] for x in r["rows"]}
    assert r["recommended"] == "full" and totals["full"] > totals["lora"] > totals["lora+ac"]
    for want in ("lora", "lora+ac"):
        r = compare_methods(p, machine(int(totals[want] / 0.9) + 2**20))  # just enough for it
        assert r["recommended"] == want, r
    r = compare_methods(p, machine(int(totals["lora+ac"] / 0.9) - 2**20))
    assert r["recommended"] is None and "none fits" in r["why"]


def test_estimate_init_from_prints_the_methods(imported, capsys):
    rc, out, err = cli(capsys, "estimate", "cpu-small", "--init-from", "llama-gqa-tied", "--runs-dir", str(imported),
                       "--no-calibrate")
    assert rc == 0, err
    assert "fine-tuning" in out and "full fine-tuning" in out and "LoRA + activation checkpointing" in out
    assert "recommended: full fine-tuning (--set train.finetune=full)" in out
    rc, out, _ = cli(capsys, "estimate", "--init-from", "llama-gqa-tied", "--runs-dir", str(imported), "--json",
                     "--no-calibrate", "--set", "train.finetune=lora")
    r = json.loads(out)
    assert r["memory"]["finetune"] == "lora" and r["init"] == {"run": "llama-gqa-tied", "step": 0}
    assert [x["method"] for x in r["methods"]["rows"]] == ["full", "lora", "lora+ac"]


def test_a_lora_run_measured_beside_its_estimate(imported, ft_corpus, capsys):
    """`workbench runs` sets the run's peak RSS beside the estimate for the same preset (CPU, fp32): LoRA's
    estimate covers what the trainer measured (the torch runtime dominates a model this small). The run is
    its own process (the CLI, as a user starts it): a peak RSS read inside pytest's process would count
    whatever the tests before it left there."""
    cp = wb("train", "cpu-small", "--init-from", "llama-gqa-tied", "--corpus", str(ft_corpus), "--name", "lora-rss",
            "--runs-dir", str(imported), "--set", *FT, "train.finetune=lora", "train.max_iters=10",
            "train.eval_interval=5", "train.lora_rank=4",
            fresh=True)  # a fresh interpreter: a forked child's RSS leaves out the library pages it never touched
    assert cp.returncode == 0, cp.stderr
    rc, out, _ = cli(capsys, "runs", "--json", "--runs-dir", str(imported))
    r = next(x for x in json.loads(out) if x["id"] == "lora-rss")
    assert r["finetune"] == "lora" and r["init"] == "llama-gqa-tied@0"
    # Measured in a fresh CI clone: +29 % to +35 % (the trainer's own peak RSS; 488 vs 360 MB), where a plain
    # run of the same size measures -4 to -10 %: a fine-tune's start holds ~120 MB more than the estimate
    # counts (README, Fine-tuning). In a working tree with warm caches the same run measured -7.8 % (332 vs
    # 360 MB, 2026-11-24). The bound spans what was measured, -8 % to +35 %, with a margin (was +-50 %).
    assert r["est_mem_mb"] and r["mem_mb"] and -20 < r["mem_err_pct"] < 45, r["mem_err_pct"]
    assert load_preset_file(imported / "lora-rss" / "preset.toml").train.finetune == "lora"


def test_a_fine_tune_is_estimated_from_the_imported_model_and_its_measured_speed(hf_models, ft_corpus, tmp_path,
                                                                                   capsys):
    """`estimate --init-from` of a model saved by transformers: the parameters are the model's own (not the
    preset's [model]), and once a fine-tune of it has run, its speed is that run's measurement under any preset's
    name (the model and the batch are what a step costs; the name is the recipe's), never a LoRA run's for full
    fine-tuning or the other way round."""
    from tests.support.hf import transformers
    from workbench.interop.hf_import import import_model
    import_model(hf_models["llama-gqa-tied"], tmp_path, "base", log=lambda m: None)
    hf_params = transformers.AutoModelForCausalLM.from_pretrained(hf_models["llama-gqa-tied"]).num_parameters()
    sets = [x for kv in FT + ["train.max_iters=12", "train.eval_interval=12"] for x in ("--set", kv)]

    def estimate(preset: str, *extra: str) -> dict:
        rc, out, err = cli(capsys, "estimate", preset, "--init-from", "base", "--runs-dir", str(tmp_path), "--json",
                           "--no-calibrate", *sets, *extra)
        assert rc == 0, err
        return json.loads(out)

    before = estimate("cpu-small")
    assert before["params"]["total"] == hf_params and before["previous_run"] is None
    assert not str(before["tokens_per_s_basis"]).startswith("measured")
    cp = wb("train", "cpu-small", "--init-from", "base", "--corpus", str(ft_corpus), "--name", "ft",
            "--runs-dir", str(tmp_path), *sets)
    assert cp.returncode == 0, cp.stderr
    records = [json.loads(x) for x in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in records if r.get("event") == "start")
    tps = [r["tokens_per_s"] for r in records if r["kind"] == "train" and r["tokens_per_s"] is not None]
    for preset in ("cpu-small", "medium"):  # medium: another preset's name, with the same hardware settings here
        r = estimate(preset)
        assert r["params"]["total"] == start["params"] == hf_params
        assert r["memory"]["seq_len"] * r["memory"]["batch_size"] == start["tokens_per_step"]  # (medium: accum 2)
        assert r["tokens_per_s_basis"].startswith("measured") and r["previous_run"]["run"] == "ft", preset
        assert r["tokens_per_s"] == pytest.approx(statistics.median(tps[1:]))
    assert ("preset cpu-small: the same model, batch, method and hardware settings"
            in r["tokens_per_s_source"])
    lora = estimate("cpu-small", "--set", "train.finetune=lora")
    assert lora["previous_run"] is None and not str(lora["tokens_per_s_basis"]).startswith("measured")
    rc, out, err = cli(capsys, "estimate", "medium", "--init-from", "base", "--runs-dir", str(tmp_path),
                       "--no-calibrate", *sets)
    assert rc == 0, err
    assert out.startswith(f"medium with base's model (dim 64, 2 layers, 4/2 heads of 16, MLP 96, vocab {VOCAB}): "
                          "0.09 M parameters")
