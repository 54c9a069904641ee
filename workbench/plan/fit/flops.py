"""Parameter counts and training FLOPs per token, exactly as ``workbench.train.model.GPT`` is built.

The MFU convention, stated once
-------------------------------
``flops_per_token(cfg) = 6 * N_matmul + 12 * L * H * Q * T``  (training: forward + backward)

* ``N_matmul`` counts the weights that take part in a matrix multiply: every
  Linear weight (wq, wk, wv, wo, w1, w2, w3 in each block) plus the output
  projection (vocab x dim). With tied embeddings that output projection *is*
  the embedding, so it is counted once; an untied input embedding is a table
  lookup (no FLOPs) and is left out. RMSNorm weights are left out (elementwise).
  Each such weight costs 2 FLOPs per token forward and 4 backward, hence 6.
* ``12 * L * H * Q * T`` is attention's score and weighted-sum matmuls
  (L layers, H query heads, Q head dim, T = seq_len), counted for the full
  T x T square as in PaLM (appendix B) and nanoGPT, although causal kernels skip
  about half of it. GQA does not change it: the key/value heads are shared, the
  dot products are not.

MFU = tokens_per_s * flops_per_token(cfg) / peak FLOP/s (see ``workbench.machine.peaks``).
"""

from __future__ import annotations

from workbench.config import ModelConfig, TrainConfig, lora_projections


def param_breakdown(model_cfg: ModelConfig) -> dict[str, int]:
    """Parameter count by part, exactly as ``workbench.train.model.GPT`` builds it."""
    c = model_cfg
    D, V, L, F = c.dim, c.vocab_size, c.n_layers, c.hidden_dim
    hd = c.head_dim
    attn = D * (c.n_heads * hd) + 2 * D * (c.n_kv_heads * hd) + (c.n_heads * hd) * D
    if c.attn_bias:
        attn += (c.n_heads + 2 * c.n_kv_heads) * hd
    mlp = 3 * D * F
    norms = 2 * D + (2 * hd if c.qk_norm else 0)
    return {
        "embedding": V * D,
        "attention": L * attn,
        "mlp": L * mlp,
        "norms": L * norms + D,  # two per block and the final one
        "lm_head": 0 if c.tie_embeddings else V * D,
    }


def count_params(model_cfg: ModelConfig) -> int:
    """Exact number of parameters of ``GPT(model_cfg)`` (equal to ``GPT(cfg).num_params()``)."""
    return sum(param_breakdown(model_cfg).values())


def matmul_params(model_cfg: ModelConfig) -> int:
    """N_matmul of the MFU formula (see the module docstring)."""
    b = param_breakdown(model_cfg)
    output_projection = model_cfg.vocab_size * model_cfg.dim
    return b["attention"] + b["mlp"] + output_projection


def flops_per_token(model_cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6 * N_matmul + 12 * L * H * Q * T (module docstring)."""
    c = model_cfg
    return 6.0 * matmul_params(c) + 12.0 * c.n_layers * c.n_heads * c.head_dim * c.seq_len


def projection_shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of a block."""
    c = model_cfg
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    return {"wq": (c.dim, q), "wk": (c.dim, kv), "wv": (c.dim, kv), "wo": (q, c.dim),
            "w1": (c.dim, c.hidden_dim), "w3": (c.dim, c.hidden_dim), "w2": (c.hidden_dim, c.dim)}


def lora_params(model_cfg: ModelConfig, train_cfg: TrainConfig) -> int:
    """Parameters of the LoRA adapters ``train_cfg`` asks for (rank r: r x (in + out) per target per block)."""
    shapes = projection_shapes(model_cfg)
    r = train_cfg.lora_rank
    return model_cfg.n_layers * sum(r * sum(shapes[n]) for n in lora_projections(train_cfg.lora_targets))


def param_tensors(model_cfg: ModelConfig, train_cfg: TrainConfig | None = None) -> list[tuple[str, int]]:
    """(kind, values) of every tensor the optimizer updates (one per parameter of ``GPT``): kinds are
    embedding, attention, mlp, norm, bias, lm_head; with LoRA (``train_cfg.finetune = lora``) the adapters
    alone (kind lora). Their sum is :func:`count_params` (or :func:`lora_params`)."""
    c = model_cfg
    shapes = projection_shapes(c)
    if train_cfg is not None and train_cfg.finetune == "lora":
        r = train_cfg.lora_rank
        return [("lora", r * dim) for _ in range(c.n_layers)
                for n in lora_projections(train_cfg.lora_targets) for dim in shapes[n]]
    out = [("embedding", c.vocab_size * c.dim)]
    for _ in range(c.n_layers):
        out.append(("norm", c.dim))
        for n in ("wq", "wk", "wv"):
            out.append(("attention", shapes[n][0] * shapes[n][1]))
            if c.attn_bias:
                out.append(("bias", shapes[n][1]))
        out.append(("attention", shapes["wo"][0] * shapes["wo"][1]))
        if c.qk_norm:
            out += [("norm", c.head_dim), ("norm", c.head_dim)]
        out.append(("norm", c.dim))
        out += [("mlp", shapes[n][0] * shapes[n][1]) for n in ("w1", "w3", "w2")]
    out.append(("norm", c.dim))
    if not c.tie_embeddings:
        out.append(("lm_head", c.vocab_size * c.dim))
    return out
