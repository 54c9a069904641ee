"""Fine-tuning's test material: tiny random Hugging Face models built locally with transformers (nothing is
downloaded) in the kinds workbench imports, the small-run settings, and the CLI in this process. The
session fixtures built from them (the tokenizer, the models, their imports, a corpus, a LoRA run) are in
tests/conftest.py."""

from __future__ import annotations

import inspect
import json
import string
import textwrap
from pathlib import Path

import torch
import transformers  # a dev dependency (pip install -e '.[dev]'): its absence fails, never skips

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


# A ChatML template as instruct models ship it, with the tokenizer's BOS first (so it is told apart from
# workbench's built-in ChatML, and the tokenizer's named tokens are seen to reach it).
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOL_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}<|im_end|>{% endfor %}"
# The forms a model directory carries its chat template in: transformers 5's save_pretrained (chat_template.jinja,
# named ones in additional_chat_templates/), its save_jinja_files=False (tokenizer_config.json: a string, or a list
# of {name, template}), and older processors' chat_template.json.
TEMPLATE_FORMS = ("jinja", "jinja-named", "config", "config-named", "processor")


def chat_tokenizer(tokenizer_dir: Path, template: str | dict | None = CHAT_TEMPLATE):
    """The test tokenizer with ChatML's end-of-turn token added as a special token (401 ids) and ``template``."""
    from tokenizers import AddedToken
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.add_tokens([AddedToken("<|im_end|>", special=True, normalized=False)], special_tokens=True)
    tok.chat_template = template
    return tok


def build_chat_model(out: Path, model_dir: Path, tokenizer_dir: Path, form: str = "jinja") -> Path:
    """``model_dir``'s weights with the chat tokenizer, its template saved in ``form`` (TEMPLATE_FORMS)."""
    import shutil
    shutil.copytree(model_dir, out)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (out / f).unlink(missing_ok=True)
    named = {"default": CHAT_TEMPLATE, "tool_use": TOOL_TEMPLATE}
    if form == "jinja":
        chat_tokenizer(tokenizer_dir).save_pretrained(out)
    elif form == "jinja-named":
        chat_tokenizer(tokenizer_dir, named).save_pretrained(out)
    elif form == "config":
        chat_tokenizer(tokenizer_dir).save_pretrained(out, save_jinja_files=False)
    elif form == "config-named":
        chat_tokenizer(tokenizer_dir, named).save_pretrained(out, save_jinja_files=False)
    elif form == "processor":
        chat_tokenizer(tokenizer_dir, None).save_pretrained(out)
        (out / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}), encoding="utf-8")
    else:
        raise ValueError(form)
    return out
