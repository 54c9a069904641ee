"""The Hugging Face layout of workbench's model, both ways: config.json keys and tensor names.

workbench's model is the Llama family's decoder (see ``workbench.train.model``): a Llama, a Qwen2 (the
same with biases on the query, key and value projections) or a Qwen3 (no biases, RMSNorm on each head's
queries and keys, heads that may be wider than dim / n_heads). One table of names serves export
(``hf_state_dict``) and import (``workbench_state_dict``).

RoPE: workbench rotates consecutive pairs (x0, x1), (x2, x3), ... of each head; transformers rotates
(x_i, x_{i + hd/2}). ``rope_permute`` reorders a q/k projection's rows (and biases, and a q/k norm's
weight) from ours to theirs, ``rope_unpermute`` back. Both are exact (a reordering).
"""

from __future__ import annotations

from typing import Any

from workbench.config import ModelConfig
from workbench.errors import WorkbenchError

# architectures[0] of config.json -> (model_type, what it adds to Llama)
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED = ", ".join(ARCHITECTURES)


class LayoutError(WorkbenchError):
    pass


# ----------------------------------------------------------------------------- RoPE row order

def rope_permute(w, n_heads: int):
    """Reorder the rows of a q/k projection (or the entries of its bias) from interleaved RoPE pairs to
    transformers' rotate_half.

    Within a head, HF row ``a * hd/2 + i`` is our row ``2 i + a`` — the same ``permute`` as
    transformers' convert_llama_weights_to_hf.
    """
    if w.dim() == 1:
        return rope_permute(w[:, None], n_heads)[:, 0]
    out_dim, in_dim = w.shape
    hd = out_dim // n_heads
    return w.view(n_heads, hd // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def rope_unpermute(w, n_heads: int):
    """The inverse of :func:`rope_permute`: transformers' row order back to workbench's."""
    if w.dim() == 1:
        return rope_unpermute(w[:, None], n_heads)[:, 0]
    out_dim, in_dim = w.shape
    hd = out_dim // n_heads
    return w.view(n_heads, 2, hd // 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


# ----------------------------------------------------------------------------- config.json

def architecture(cfg: ModelConfig) -> tuple[str, str]:
    """(architectures[0], model_type) that can hold a workbench model config."""
    if cfg.qk_norm:
        if cfg.attn_bias:
            raise LayoutError("a model with both attention biases and QK-norm has no Hugging Face architecture "
                              "(Qwen2 has the biases, Qwen3 the norms)")
        return "Qwen3ForCausalLM", "qwen3"
    if cfg.attn_bias:
        return "Qwen2ForCausalLM", "qwen2"
    return "LlamaForCausalLM", "llama"


def rope_scaling_dict(cfg: ModelConfig) -> dict | None:
    if cfg.rope_scaling == "linear":
        return {"rope_type": "linear", "factor": cfg.rope_factor}
    if cfg.rope_scaling == "llama3":
        return {"rope_type": "llama3", "factor": cfg.rope_factor, "low_freq_factor": cfg.rope_low_freq_factor,
                "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_context}
    return None


def hf_config(cfg: ModelConfig, torch_dtype: str = "float32", *, bos_id: int | None = None,
              eos_id: int | None = None, max_positions: int | None = None) -> dict:
    """config.json for a workbench ``ModelConfig`` (LlamaConfig's keys; Qwen2's or Qwen3's where the model
    has their biases or QK-norm). ``max_positions``: the context the model supports (an imported model's
    own, often longer than the seq_len it was fine-tuned at)."""
    arch, model_type = architecture(cfg)
    out = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max(cfg.seq_len, max_positions or 0),
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope_scaling_dict(cfg),
        "attention_bias": bool(cfg.attn_bias) if model_type != "qwen2" else True,
        "attention_dropout": 0.0,
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "initializer_range": 0.02,
        "use_cache": True,
        # workbench's own tokenizer has no BOS; its end-of-document piece is not named as EOS (None); an
        # imported model's tokenizer names its own.
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": None,
        "torch_dtype": torch_dtype,
        "dtype": torch_dtype,
    }
    if model_type == "llama":
        out.update(mlp_bias=False, pretraining_tp=1)
    else:
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layers)
    return out


def _rope_params(hf: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope scaling) from legacy keys (rope_theta, rope_scaling) or transformers 5's
    rope_parameters."""
    params = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    theta = hf.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    return float(theta), scaling


def model_config(hf: dict, seq_len: int | None = None) -> dict[str, Any]:
    """The [model] section (as preset data) of a Hugging Face config.json of a supported architecture;
    anything the model cannot carry is refused with one line. ``seq_len``: the training context (default:
    the model's, at most 2048)."""
    arch = (hf.get("architectures") or ["?"])[0]
    model_type = ARCHITECTURES.get(arch)
    if model_type is None:
        raise LayoutError(f"architecture {arch} is not supported; workbench imports {SUPPORTED}")

    def need(key: str):
        if not isinstance(hf.get(key), int) or isinstance(hf.get(key), bool):
            raise LayoutError(f"config.json has no integer {key!r} (a {arch} config has one)")
        return hf[key]

    dim, n_heads, n_layers, vocab = need("hidden_size"), need("num_attention_heads"), \
        need("num_hidden_layers"), need("vocab_size")
    n_kv = hf.get("num_key_value_heads") or n_heads
    head_dim = hf.get("head_dim") or dim // n_heads
    if hf.get("hidden_act", "silu") != "silu":
        raise LayoutError(f"hidden_act {hf.get('hidden_act')!r}: workbench's MLP is SwiGLU (silu)")
    if hf.get("mlp_bias"):
        raise LayoutError("mlp_bias = true: workbench's MLP has no biases")
    if model_type == "llama" and hf.get("attention_bias"):
        raise LayoutError("attention_bias = true on a Llama (biases on all four projections): workbench carries "
                          "biases on the query, key and value projections only (Qwen2's)")
    if model_type == "qwen3" and hf.get("attention_bias"):
        raise LayoutError("attention_bias = true on a Qwen3 model is not supported")
    if hf.get("use_sliding_window"):
        raise LayoutError("use_sliding_window = true: workbench's attention is full causal attention")
    if hf.get("pretraining_tp", 1) not in (None, 1):
        raise LayoutError(f"pretraining_tp = {hf['pretraining_tp']} is not supported (1 is)")
    theta, scaling = _rope_params(hf)
    rope: dict[str, Any] = {}
    if scaling:
        kind = scaling.get("rope_type") or scaling.get("type")
        if kind == "linear":
            rope = {"rope_scaling": "linear", "rope_factor": float(scaling["factor"])}
        elif kind == "llama3":
            rope = {"rope_scaling": "llama3", "rope_factor": float(scaling["factor"]),
                    "rope_low_freq_factor": float(scaling["low_freq_factor"]),
                    "rope_high_freq_factor": float(scaling["high_freq_factor"]),
                    "rope_original_context": int(scaling["original_max_position_embeddings"])}
        elif kind not in (None, "default"):
            raise LayoutError(f"rope scaling {kind!r} is not supported (linear and llama3 are)")
    max_pos = hf.get("max_position_embeddings") or 2048
    out = {"vocab_size": vocab, "dim": dim, "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_kv,
           "seq_len": int(seq_len or min(max_pos, 2048)), "ffn_hidden": need("intermediate_size"), "dropout": 0.0,
           "rope_theta": theta, "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
           "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
           "head_size": 0 if head_dim * n_heads == dim else head_dim,
           "attn_bias": model_type == "qwen2", "qk_norm": model_type == "qwen3", **rope}
    return out


# ----------------------------------------------------------------------------- tensor names

def _layer_names(cfg: ModelConfig, i: int) -> list[tuple[str, str, int | None]]:
    """(workbench name, transformers name, RoPE heads to permute or None) of block ``i``'s tensors."""
    s, d = f"layers.{i}.", f"model.layers.{i}."
    names = [
        (s + "attn.wq.weight", d + "self_attn.q_proj.weight", cfg.n_heads),
        (s + "attn.wk.weight", d + "self_attn.k_proj.weight", cfg.n_kv_heads),
        (s + "attn.wv.weight", d + "self_attn.v_proj.weight", None),
        (s + "attn.wo.weight", d + "self_attn.o_proj.weight", None),
        (s + "mlp.w1.weight", d + "mlp.gate_proj.weight", None),
        (s + "mlp.w3.weight", d + "mlp.up_proj.weight", None),
        (s + "mlp.w2.weight", d + "mlp.down_proj.weight", None),
        (s + "attn_norm.weight", d + "input_layernorm.weight", None),
        (s + "mlp_norm.weight", d + "post_attention_layernorm.weight", None),
    ]
    if cfg.attn_bias:
        names += [(s + "attn.wq.bias", d + "self_attn.q_proj.bias", cfg.n_heads),
                  (s + "attn.wk.bias", d + "self_attn.k_proj.bias", cfg.n_kv_heads),
                  (s + "attn.wv.bias", d + "self_attn.v_proj.bias", None)]
    if cfg.qk_norm:  # one head's weights: permuted as a single head
        names += [(s + "attn.q_norm.weight", d + "self_attn.q_norm.weight", 1),
                  (s + "attn.k_norm.weight", d + "self_attn.k_norm.weight", 1)]
    return names


def tensor_names(cfg: ModelConfig) -> list[tuple[str, str, int | None]]:
    """(workbench name, transformers name, RoPE heads or None) of every tensor of the model."""
    names = [("tok_emb.weight", "model.embed_tokens.weight", None), ("norm.weight", "model.norm.weight", None)]
    for i in range(cfg.n_layers):
        names += _layer_names(cfg, i)
    if not cfg.tie_embeddings:
        names.append(("lm_head.weight", "lm_head.weight", None))
    return names


def hf_state_dict(sd: dict, cfg: ModelConfig) -> dict:
    """workbench tensor names → transformers' names, q/k rows permuted for rotate_half.

    Tied embeddings: only ``model.embed_tokens.weight`` is stored, as transformers does
    (it ties ``lm_head`` to it on load because config.tie_word_embeddings is true).
    """
    out = {}
    for ours, theirs, heads in tensor_names(cfg):
        t = sd[ours]
        out[theirs] = rope_permute(t, heads) if heads else t
    # config.json says float32: a checkpoint kept in bf16/fp16 is widened (exactly).
    return {k: v.float() if v.is_floating_point() else v for k, v in out.items()}


def workbench_state_dict(hf_sd: dict, cfg: ModelConfig) -> dict:
    """transformers' tensors → workbench names and RoPE order, as fp32 (every tensor must be there)."""
    out = {}
    for ours, theirs, heads in tensor_names(cfg):
        t = hf_sd[theirs].float()
        out[ours] = rope_unpermute(t, heads) if heads else t
    return out
