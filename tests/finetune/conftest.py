"""Shared fixtures for fine-tuning: tiny random Hugging Face models built locally with transformers (nothing
is downloaded), a small byte-level BPE tokenizer, their imports, a corpus, and one LoRA run.

Everything here is built once per session: the models take a second, an import a fraction of one, the LoRA
run a few seconds on two CPU cores."""

from __future__ import annotations

import dataclasses
import inspect
import json
import signal
import string
import textwrap
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers builds the test models (pip install "
                                                          "'.[dev]'); CI installs it")

# Text the tokenizer learns from and the models are fine-tuned on: Python's own sources (no network).
TEXT_MODULES = (json.decoder, textwrap, string, inspect)

# name -> (config class, model class, what makes it that kind)
KINDS = {
    "llama-gqa-tied": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "llama-mha-untied": ("LlamaConfig", "LlamaForCausalLM",
                         dict(num_key_value_heads=4, tie_word_embeddings=False, rope_theta=500000.0,
                              rms_norm_eps=1e-5)),
    "qwen2-bias": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "qwen3-qknorm": ("Qwen3Config", "Qwen3ForCausalLM",
                     dict(num_key_value_heads=2, head_dim=32, tie_word_embeddings=True)),
    "llama3-scaled": ("LlamaConfig", "LlamaForCausalLM",
                      dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=500000.0,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
}
VOCAB = 416       # the embedding's rows: more than the tokenizer's 400 ids, as real models pad theirs
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=128)

# Small-run settings for fine-tuning the tiny models (the model itself comes from the source run).
FT = ["model.seq_len=32", "train.batch_size=4", "train.warmup_iters=2", "train.eval_iters=2", "train.log_interval=1",
      "hardware.nproc=1", "hardware.compile=false", "data.val_fraction=0.1"]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI in this process (torch is imported already: no second of start-up per call):
    (exit status, stdout, stderr)."""
    from workbench.cli import main
    capsys.readouterr()
    rc = main(list(args))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def corpus_text() -> str:
    return "\n\n".join(inspect.getsource(m) for m in TEXT_MODULES)


@pytest.fixture(scope="session")
def hf_tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer (GPT-2 / Llama 3 / Qwen style) of 400 ids with two special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    out = tmp_path_factory.mktemp("hf-tok")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([corpus_text()], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>")
    fast.save_pretrained(out)
    return out


def build_hf_model(out: Path, kind: str, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A random model of ``kind`` saved with save_pretrained, with the test tokenizer; biases and norms away
    from their initial 0 and 1, so a lost or swapped one would show in the logits."""
    cfg_cls, model_cls, extra = KINDS[kind]
    cfg = getattr(transformers, cfg_cls)(**COMMON, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory, hf_tokenizer_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-models")
    return {kind: build_hf_model(root / kind, kind, hf_tokenizer_dir) for kind in KINDS}


@pytest.fixture(scope="session")
def imported(tmp_path_factory, hf_models) -> Path:
    """A runs directory with each model imported under its kind's name (in this process: the CLI is tested
    on its own)."""
    from workbench.interop.hf_import import import_model
    root = tmp_path_factory.mktemp("ft-runs")
    for kind, d in hf_models.items():
        import_model(d, root, kind, log=lambda m: None)
    return root


@pytest.fixture(scope="session")
def ft_corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ft-corpus") / "python.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


@dataclasses.dataclass
class LoraRun:
    root: Path
    run_dir: Path
    trained_state: dict     # the trainer's model state dict when it finished (frozen weights and adapters)
    log: str


@pytest.fixture(scope="session")
def lora_run(imported, ft_corpus) -> LoraRun:
    """A LoRA run of 30 steps on llama-gqa-tied, trained in this process by the CLI's own code path, with the
    trainer's model kept for inspection."""
    from workbench.cli import main
    from workbench.train.loop import Trainer
    kept: dict = {}
    original = Trainer.train

    def keep(self):
        state = original(self)
        kept["sd"] = {k: v.detach().clone() for k, v in self.built.model.state_dict().items()}
        return state

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "train", keep)
        rc = main(["train", "cpu-small", "--init-from", "llama-gqa-tied", "--corpus", str(ft_corpus), "--name", "lora",
                   "--runs-dir", str(imported), "--set", *FT, "train.finetune=lora", "train.max_iters=30",
                   "train.eval_interval=10", "train.ckpt_interval=10", "train.lr=3e-3", "train.lora_rank=4"])
    for s, h in handlers.items():
        signal.signal(s, h)
    torch.set_num_threads(threads)
    assert rc == 0
    run_dir = imported / "lora"
    return LoraRun(imported, run_dir, kept["sd"], (run_dir / "train.log").read_text())
