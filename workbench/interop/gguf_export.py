"""``workbench export RUN OUT --format gguf``: one GGUF file (the ``gguf`` package) that llama.cpp-family
runtimes (llama.cpp, Ollama, LM Studio) and transformers' GGUF loader read, with the tokenizer embedded.

Layout, as llama.cpp's own convert_hf_to_gguf.py writes it:

* architecture ``llama`` for a Llama-layout model, ``qwen2`` with attention biases, ``qwen3`` with QK-norm;
* tensors ``token_embd``, ``blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
  ffn_up, ffn_down}`` (+ ``attn_q/k/v.bias``, ``attn_q_norm``, ``attn_k_norm``), ``output_norm``,
  ``output`` (absent when tied: the runtime reuses ``token_embd``), ``rope_freqs`` for llama3 RoPE
  scaling; matrices in f16 (or f32), vectors in f32;
* RoPE row order: llama.cpp's ``llama`` rotates consecutive pairs, as workbench does, so q/k go as they
  are; ``qwen2``/``qwen3`` rotate halves (NeoX), so their rows are permuted as for transformers;
* the tokenizer: workbench's sentencepiece model as ``llama`` (pieces, scores, types, no space prefix);
  a Hugging Face byte-level BPE (Llama 3, Qwen, SmolLM) as ``gpt2`` with its merges and the
  pre-tokenizer named as llama.cpp knows it; a sentencepiece-style BPE tokenizer.json (byte fallback,
  "▁" for spaces) as ``llama`` with scores falling with the id. The vocabulary is padded to the
  embedding's rows with unused tokens.

What GGUF cannot hold is refused before anything is written (``check_gguf``): a pre-tokenizer llama.cpp
has no name for, a tokenizer that is not BPE, llama3 RoPE scaling on a Qwen layout, weights beyond
f16's range in an f16 file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from workbench.data.text.tokenizer import AnyTokenizer, Tokenizer
from workbench.data.text.tokenizer_formats import spm_pieces
from workbench.errors import WorkbenchError
from workbench.interop.hf_layout import LayoutError, architecture, rope_permute
from workbench.train.model import rope_inv_freq

GGUF_TYPES = ("f16", "f32")
F16_MAX = 65504.0

# Pre-tokenizer regexes of tokenizer.json -> llama.cpp's name for them (tokenizer.ggml.pre).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
KNOWN_SPLITS = {LLAMA3_REGEX: "llama-bpe", QWEN2_REGEX: "qwen2"}

# sentencepiece piece types = GGUF token types (normal 1, unknown 2, control 3, user-defined 4, unused 5, byte 6)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


class GGUFError(WorkbenchError):
    pass


# ----------------------------------------------------------------------------- the tokenizer

def _pre_name(pre: dict | None) -> str | None:
    """llama.cpp's name for a byte-level BPE tokenizer.json's pre-tokenizer, or None if it has none."""
    if not isinstance(pre, dict):
        return None
    kind = pre.get("type")
    if kind == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"):
        return "gpt-2"
    if kind == "Sequence":
        parts = pre.get("pretokenizers") or []
        types = [p.get("type") for p in parts]
        if types == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
            return "smollm"
        if types == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
            return KNOWN_SPLITS.get((parts[0].get("pattern") or {}).get("Regex"))
    return None


def _merges(model: dict) -> list[str]:
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]


def tokenizer_fields(tok: AnyTokenizer, vocab_size: int) -> dict:
    """Everything the GGUF tokenizer keys hold: model, pre, tokens, scores, types, merges, special ids."""
    if isinstance(tok, Tokenizer):
        pieces = spm_pieces(tok.proto)
        eod = tok.eod_id if tok.eod_id is not None else 0
        return {"model": "llama", "pre": None, "tokens": [p for p, _s, _t in pieces],
                "scores": [float(s) for _p, s, _t in pieces], "types": [int(t) for _p, _s, t in pieces],
                "merges": None, "bos": eod, "eos": eod, "unk": 0, "add_bos": False, "add_space_prefix": False}
    raw = tok.raw
    model = raw.get("model") or {}
    if model.get("type") != "BPE":
        raise GGUFError(f"the tokenizer is a {model.get('type')} model; GGUF export writes BPE tokenizers only "
                        "(export --format hf and convert it with llama.cpp's convert_hf_to_gguf.py)")
    by_id = {i: p for p, i in tok.vocab.items()}
    added = tok.tk.get_added_tokens_decoder()
    special = {i for i, t in added.items() if t.special}
    byte_level = "ByteLevel" in json.dumps(raw.get("decoder")) or "ByteLevel" in json.dumps(raw.get("pre_tokenizer"))
    tokens, types, scores = [], [], []
    for i in range(vocab_size):
        piece = by_id.get(i)
        if piece is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        else:
            tokens.append(piece)
            if i in special:
                types.append(CONTROL)
            elif i in added:
                types.append(USER_DEFINED)
            elif model.get("byte_fallback") and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                types.append(BYTE)
            elif piece == model.get("unk_token"):
                types.append(UNKNOWN)
            else:
                types.append(NORMAL)
        scores.append(-float(i))  # sentencepiece-style BPE: the score falls with the id
    out = {"tokens": tokens, "types": types, "bos": tok.bos_id, "eos": tok.eod_id,
           "unk": tok.token_id(model.get("unk_token")), "add_bos": bool(tok.config.get("add_bos_token", False))}
    if byte_level:
        pre = _pre_name(raw.get("pre_tokenizer"))
        if pre is None:
            raise GGUFError("the tokenizer's pre-tokenizer is not one llama.cpp knows by name (GPT-2, Llama 3, "
                            "Qwen2, SmolLM); export --format hf and convert it with llama.cpp's "
                            "convert_hf_to_gguf.py")
        out.update(model="gpt2", pre=pre, scores=None, merges=_merges(model), add_space_prefix=False)
        return out
    meta = json.dumps(raw.get("pre_tokenizer")) + json.dumps(raw.get("normalizer"))
    if "\u2581" not in meta and "Metaspace" not in meta:
        raise GGUFError("the tokenizer is neither byte-level BPE nor sentencepiece-style BPE; GGUF export cannot "
                        "embed it (export --format hf)")
    prefix = '"Prepend"' in meta or any(k in meta for k in ('"always"', '"first"'))
    out.update(model="llama", pre=None, scores=scores, merges=None, add_space_prefix=prefix)
    return out


# ----------------------------------------------------------------------------- the tensors

def gguf_tensors(sd: dict, cfg, gguf_type: str) -> dict[str, np.ndarray]:
    """GGUF tensor name -> array (matrices f16 or f32, vectors f32), in llama.cpp's RoPE order."""
    _arch, model_type = architecture(cfg)
    neox = model_type != "llama"

    def rope(t, heads):
        return rope_permute(t, heads) if neox else t

    names = {"tok_emb.weight": ("token_embd.weight", None), "norm.weight": ("output_norm.weight", None)}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = ("output.weight", None)
    for i in range(cfg.n_layers):
        s, d = f"layers.{i}.", f"blk.{i}."
        names.update({
            s + "attn_norm.weight": (d + "attn_norm.weight", None),
            s + "attn.wq.weight": (d + "attn_q.weight", cfg.n_heads),
            s + "attn.wk.weight": (d + "attn_k.weight", cfg.n_kv_heads),
            s + "attn.wv.weight": (d + "attn_v.weight", None),
            s + "attn.wo.weight": (d + "attn_output.weight", None),
            s + "mlp_norm.weight": (d + "ffn_norm.weight", None),
            s + "mlp.w1.weight": (d + "ffn_gate.weight", None),
            s + "mlp.w3.weight": (d + "ffn_up.weight", None),
            s + "mlp.w2.weight": (d + "ffn_down.weight", None),
        })
        if cfg.attn_bias:
            names.update({s + "attn.wq.bias": (d + "attn_q.bias", cfg.n_heads),
                          s + "attn.wk.bias": (d + "attn_k.bias", cfg.n_kv_heads),
                          s + "attn.wv.bias": (d + "attn_v.bias", None)})
        if cfg.qk_norm:
            names.update({s + "attn.q_norm.weight": (d + "attn_q_norm.weight", 1),
                          s + "attn.k_norm.weight": (d + "attn_k_norm.weight", 1)})
    out = {}
    for ours, (theirs, heads) in names.items():
        t = sd[ours].detach().to("cpu", torch.float32)
        if heads:
            t = rope(t, heads)
        dtype = np.float16 if gguf_type == "f16" and t.dim() >= 2 else np.float32
        out[theirs] = t.numpy().astype(dtype)
    if cfg.rope_scaling == "llama3":
        base = rope_inv_freq(cfg.head_dim, cfg.rope_theta)
        out["rope_freqs.weight"] = (base / rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg)).numpy().astype(np.float32)
    return out


def check_gguf(sd: dict, cfg, tokenizer: AnyTokenizer | None, gguf_type: str) -> None:
    """Refuse, in one line, what a GGUF file cannot hold (before anything is written)."""
    if gguf_type not in GGUF_TYPES:
        raise GGUFError(f"--gguf-type {gguf_type!r}: choose f16 or f32")
    try:
        _arch, model_type = architecture(cfg)
    except LayoutError as e:
        raise GGUFError(f"GGUF cannot hold this model: {e}") from None
    if cfg.rope_scaling == "llama3" and model_type != "llama":
        raise GGUFError(f"llama3 RoPE scaling on a {model_type} model: llama.cpp applies it to the llama "
                        "architecture only")
    if tokenizer is None:
        raise GGUFError("GGUF export embeds the tokenizer, and this run has none")
    tokenizer_fields(tokenizer, cfg.vocab_size)
    if gguf_type == "f16":
        for name, t in sd.items():
            if t.dim() >= 2 and t.is_floating_point() and t.abs().max().item() > F16_MAX:
                raise GGUFError(f"{name} holds values beyond f16's range (max {t.abs().max().item():.3g}); "
                                "export with --gguf-type f32")


@dataclass(frozen=True)
class ChatExport:
    """What a chat-tuned model's export carries so that other runtimes chat as it was trained: its template
    and the token that ends an assistant turn (where generation stops). An imported model's template that
    workbench cannot mask (its turns end with no one special token) travels without an end-of-turn token.
    ``named``: the model's other named templates (tool use, RAG, ...: an imported model's
    additional_chat_templates/), which travel beside the default."""
    template: str
    end_piece: str | None
    end_id: int | None
    named: tuple[tuple[str, str], ...] = ()

    def gguf_templates(self) -> str | list[dict[str, str]]:
        """The templates as gguf's add_chat_template takes them: the default alone, or every one by name
        (tokenizer.chat_template, tokenizer.chat_template.NAME and the tokenizer.chat_templates list)."""
        if not self.named:
            return self.template
        keys: dict[str, str] = {}
        for name, _t in self.named:  # gguf writes each name's characters outside [A-Za-z0-9] as _
            key = "".join(c if c.isascii() and c.isalnum() else "_" for c in name)
            if key in keys:
                raise GGUFError(f"the chat templates named {keys[key]!r} and {name!r} would both be "
                                f"tokenizer.chat_template.{key} in GGUF; rename one in the run's "
                                "additional_chat_templates/")
            keys[key] = name
        return [{"name": "default", "template": self.template}] + [{"name": n, "template": t} for n, t in self.named]


def write_gguf(path: Path, sd: dict, cfg, tokenizer: AnyTokenizer, gguf_type: str, metadata: dict,
               max_positions: int | None = None, chat: ChatExport | None = None) -> None:
    _arch, model_type = architecture(cfg)
    tf = tokenizer_fields(tokenizer, cfg.vocab_size)
    w = gguf.GGUFWriter(str(path), model_type)
    w.add_name(str(metadata.get("run") or "workbench model"))
    if metadata.get("source"):
        w.add_string("general.source.url", str(metadata["source"]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if gguf_type == "f16" else gguf.LlamaFileType.ALL_F32)
    w.add_context_length(max(cfg.seq_len, max_positions or 0))
    w.add_embedding_length(cfg.dim)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.hidden_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if cfg.rope_scaling == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg.rope_factor)
    w.add_tokenizer_model(tf["model"])
    if tf.get("pre"):
        w.add_tokenizer_pre(tf["pre"])
    w.add_token_list(tf["tokens"])
    if tf.get("scores") is not None:
        w.add_token_scores(tf["scores"])
    w.add_token_types(tf["types"])
    if tf.get("merges"):
        w.add_token_merges(tf["merges"])
    if chat is not None:  # llama.cpp stops at the end-of-turn token and applies the template
        if chat.end_id is not None:
            tf = {**tf, "eos": chat.end_id}
            w.add_eot_token_id(chat.end_id)
        w.add_chat_template(chat.gguf_templates())
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unk", w.add_unk_token_id)):
        if tf.get(key) is not None:
            add(int(tf[key]))
    w.add_add_bos_token(bool(tf["add_bos"]))
    w.add_add_eos_token(False)
    if tf["model"] == "llama":
        w.add_add_space_prefix(bool(tf["add_space_prefix"]))
    for name, arr in gguf_tensors(sd, cfg, gguf_type).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
