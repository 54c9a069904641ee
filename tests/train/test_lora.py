"""Fine-tuning from a checkpoint (`train --init-from`), fully or with LoRA: only adapters train and are saved,
the base weights stay bit for bit, resume is bitwise, sampling works; bad input gets one line."""

from __future__ import annotations

import signal

import pytest
import torch

from tests.support.cli import wb
from tests.support.hf import FT, cli
from tests.support.runs import losses, read_jsonl
from workbench import rundir
from workbench.config import ModelConfig, TrainConfig, load_preset_file
from workbench.train.checkpoint import load_model_state, load_run_model
from workbench.train.lora import LoRALinear, adapter_state_dict, apply_lora, merge_adapters
from workbench.train.model import GPT

LORA = TrainConfig(finetune="lora", lora_rank=4, lora_alpha=8.0)


def test_fresh_adapters_change_nothing_and_merge_exactly():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=128, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=16)
    model = GPT(cfg).eval()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        before = model(ids, targets=ids)[0]
        n = apply_lora(model, LORA)
        assert torch.equal(model(ids, targets=ids)[0], before)  # lora_b starts at zero
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_b.normal_()
        adapted = model(ids, targets=ids)[0]
    assert n == sum(p.numel() for p in model.parameters() if p.requires_grad) == 2 * 4 * (
        (64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 192))
    assert set(adapter_state_dict(model)) == {f"layers.{i}.{m}.lora_{x}" for i in range(2) for x in "ab"
                                              for m in ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w1",
                                                        "mlp.w2", "mlp.w3")}
    merged = GPT(cfg).eval()
    merged.load_state_dict(merge_adapters(base, adapter_state_dict(model), LORA))
    with torch.no_grad():
        assert (merged(ids, targets=ids)[0] - adapted).abs().max().item() < 1e-4


def test_lora_run_trains_only_adapters(lora_run, imported):
    """Base weights bit for bit, adapters changed, loss falls, checkpoints hold the adapters alone (small)."""
    init = load_model_state(lora_run.run_dir / "init")
    assert (lora_run.run_dir / "init" / "model.pt").stat().st_ino == (
        imported / "llama-gqa-tied" / "checkpoints" / "step_0000000" / "model.pt").stat().st_ino  # a hard link
    frozen = {k: v for k, v in lora_run.trained_state.items() if ".lora_" not in k}
    assert frozen.keys() == init.keys()
    assert all(torch.equal(frozen[k], init[k]) for k in init)
    adapters = {k: v for k, v in lora_run.trained_state.items() if ".lora_" in k}
    assert adapters and all(v.abs().sum() > 0 for k, v in adapters.items() if k.endswith("lora_b"))
    train = [r["loss"] for r in read_jsonl(lora_run.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    evals = [r["val_loss"] for r in read_jsonl(lora_run.run_dir / "metrics.jsonl") if r["kind"] == "eval"]
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5 and evals[-1] < evals[0]
    ck = rundir.list_checkpoints(lora_run.run_dir)[-1]
    saved = load_model_state(ck["path"])
    assert set(saved) == set(adapters) and all(torch.equal(saved[k], adapters[k]) for k in saved)
    full_bytes = (imported / "llama-gqa-tied" / "checkpoints" / "step_0000000" / "model.pt").stat().st_size
    assert ck["bytes"] < full_bytes and ck["finetune"] == "lora"
    assert "LoRA adapters trained, rank 4" in lora_run.log and "from llama-gqa-tied step 0" in lora_run.log
    p = load_preset_file(lora_run.run_dir / "preset.toml")
    assert p.init == {"run": "llama-gqa-tied", "step": 0} and p.source["architecture"] == "LlamaForCausalLM"
    assert (p.model.dim, p.model.seq_len, p.model.vocab_size) == (64, 32, 416)  # the source's, but seq_len


def test_lora_checkpoint_loads_merged_and_samples(lora_run):
    loaded = load_run_model(lora_run.run_dir)
    assert not any(".lora_" in k for k in loaded.state_dict)
    cp = wb("sample", str(lora_run.run_dir), "--prompt", "def ", "--max-new-tokens", "8", "--seed", "1",
            "--temperature", "0")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.startswith("def ") and len(cp.stdout) > len("def \n")


EXACT = [*FT, "train.finetune=lora", "train.max_iters=12", "train.lr_decay_iters=12", "train.ckpt_interval=5",
         "train.eval_interval=8", "train.lora_dropout=0.1", "train.lora_rank=4", "train.patience=0",
         "train.sample_prompt='def '", "train.sample_tokens=4"]


@pytest.mark.slow
def test_lora_kill_and_resume_is_bitwise(imported, ft_corpus, tmp_path):
    """LoRA dropout on, so the RNG matters: SIGKILL at step 7, resume from step 5, every loss equal."""
    root = tmp_path / "runs"
    root.mkdir()
    for name in ("llama-gqa-tied",):
        (root / name).symlink_to(imported / name)
    args = ["train", "cpu-small", "--init-from", "llama-gqa-tied", "--corpus", str(ft_corpus), "--runs-dir", str(root),
            "--set", *EXACT]
    wb(*args, "--name", "straight", check=True)
    cp = wb(*args, "--name", "killed", env={"WORKBENCH_TEST_KILL_AT_STEP": "7"})
    assert cp.returncode == -signal.SIGKILL
    assert [c["step"] for c in rundir.list_checkpoints(root / "killed")] == [5]
    res = wb("resume", "killed", "--runs-dir", str(root), check=True)
    assert "resumed from checkpoint step_0000005" in res.stdout
    straight, after = losses(root / "straight"), losses(root / "killed")
    assert sorted(straight) == list(range(1, 13)) and after == straight


# ----------------------------------------------------------------------------- bad input

BAD = {
    "rank_zero": (["--init-from", "llama-gqa-tied", "--set", "train.finetune=lora", "train.lora_rank=0"],
                  "train.lora_rank = 0 must be >= 1"),
    "rank_above_dim": (["--init-from", "llama-gqa-tied", "--set", "train.finetune=lora", "train.lora_rank=65"],
                       "train.lora_rank = 65 must be at most model.dim = 64"),
    "lora_without_init": (["--set", "train.finetune=lora"], "train.finetune = lora trains adapters on weights that "
                                                            "exist: start from a checkpoint with --init-from RUN"),
    "model_override_disagrees": (["--init-from", "llama-gqa-tied", "--set", "model.n_layers=3"],
                                 "--init-from llama-gqa-tied: --set model.n_layers=3 disagrees with the source run's "
                                 "model.n_layers = 2"),
    "unknown_target": (["--init-from", "llama-gqa-tied", "--set", "train.finetune=lora", "train.lora_targets=qkv"],
                       "train.lora_targets = 'qkv': qkv is not a projection"),
    "muon": (["--init-from", "llama-gqa-tied", "--set", "train.finetune=lora", "train.optimizer=muon"],
             "train.optimizer = muon does not apply to LoRA adapters"),
    "no_such_run": (["--init-from", "nope"], "no run 'nope' in"),
    "no_such_step": (["--init-from", "llama-gqa-tied:40"], "run llama-gqa-tied has no checkpoint at step 40"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_fine_tune_bad_input(name, imported, ft_corpus, capsys):
    args, message = BAD[name]
    before = sorted(p.name for p in imported.iterdir())
    rc, _out, err = cli(capsys, "train", "cpu-small", "--corpus", str(ft_corpus), "--runs-dir", str(imported),
                        *args, *(["--set", *FT] if "--set" not in args else FT))
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and message in lines[0], err
    assert sorted(p.name for p in imported.iterdir()) == before  # no run directory


def test_a_full_fine_tune_starts_from_the_source_weights(imported, ft_corpus, capsys):
    """train.finetune = full: the first eval of the new run is the source model's loss on the new corpus."""
    rc, out, err = cli(capsys, "train", "cpu-small", "--init-from", "qwen2-bias", "--corpus", str(ft_corpus),
                       "--name", "full", "--runs-dir", str(imported), "--set", *FT, "train.max_iters=3",
                       "train.eval_interval=3", "train.lr=1e-3")
    assert rc == 0, err
    assert "fine-tuning every weight of qwen2-bias step_0000000" in out
    d = imported / "full"
    # cpu-small's Muon + wsd is for training from scratch: a fine-tune takes AdamW unless asked for Muon
    # (at muon_lr 0.02 the weights below would move ~10x further than the bound)
    assert load_preset_file(d / "preset.toml").train.optimizer == "adamw"
    saved = load_model_state(rundir.list_checkpoints(d)[-1]["path"])
    assert "layers.0.attn.wq.bias" in saved and not any(".lora_" in k for k in saved)
    # 3 AdamW steps at lr 1e-3 move each weight by about 3e-3: the source's, not a fresh init (std 0.02)
    source = load_model_state(imported / "qwen2-bias" / "checkpoints" / "step_0000000")
    assert saved.keys() == source.keys()
    moved = {k: (saved[k] - source[k]).abs().max().item() for k in source}
    assert max(moved.values()) < 0.01
    # ... and every weight, biases and norms too, moved about that much: a "full" fine-tune that trained nothing,
    # or only some of the weights, fails here
    assert min(moved.values()) > 1e-4, sorted(moved.items(), key=lambda kv: kv[1])[:3]


def test_a_full_fine_tune_takes_muon_when_asked(imported, ft_corpus, capsys):
    rc, _out, err = cli(capsys, "train", "cpu-small", "--init-from", "qwen2-bias", "--corpus", str(ft_corpus),
                        "--name", "full-muon", "--runs-dir", str(imported), "--set", *FT, "train.max_iters=3",
                        "train.eval_interval=3", "train.optimizer=muon")
    assert rc == 0, err
    assert load_preset_file(imported / "full-muon" / "preset.toml").train.optimizer == "muon"
