"""A small Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Self-contained (torch only). Attention goes through
``F.scaled_dot_product_attention`` so CUDA picks the flash / memory-efficient
kernels. Parameter names follow one simple layout that `workbench export`
(and the estimator's exact parameter count) rely on:

    tok_emb.weight                     [vocab, dim]
    layers.{i}.attn_norm.weight        [dim]
    layers.{i}.attn.wq.weight          [n_heads*hd, dim]
    layers.{i}.attn.wk.weight          [n_kv*hd, dim]
    layers.{i}.attn.wv.weight          [n_kv*hd, dim]
    layers.{i}.attn.wq / wk / wv .bias [n_heads*hd] / [n_kv*hd]   (only with attn_bias: Qwen2)
    layers.{i}.attn.q_norm / k_norm .weight  [hd]                 (only with qk_norm: Qwen3)
    layers.{i}.attn.wo.weight          [dim, n_heads*hd]
    layers.{i}.mlp_norm.weight         [dim]
    layers.{i}.mlp.w1 / w3 .weight     [hidden, dim]   (gate / up)
    layers.{i}.mlp.w2.weight           [dim, hidden]   (down)
    norm.weight                        [dim]
    lm_head.weight                     [vocab, dim]    (absent when tied)

hd is model.head_dim (dim / n_heads unless model.head_size says otherwise). RoPE rotates consecutive
pairs of each head's dims; imported Hugging Face weights have their q/k rows reordered on the way in
(``workbench.interop.export.rope_permute`` and its inverse). LoRA adapters (``workbench.train.lora``)
add ``<projection>.lora_a`` / ``.lora_b`` beside a projection's weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as activation_checkpoint

from workbench.config import ModelConfig
from workbench.data.train_data import IGNORE  # a target left out of the loss (F.cross_entropy's ignore_index)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 for stability under autocast, return in the input dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rope_inv_freq(head_dim: int, theta: float, cfg: ModelConfig | None = None, device=None) -> torch.Tensor:
    """The head_dim/2 rotation frequencies, scaled as ``cfg.rope_scaling`` says (linear: all divided by
    the factor; llama3: Llama 3.1's rule, the same as transformers' ``_compute_llama3_parameters``)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.int64).float() / head_dim))
    kind = cfg.rope_scaling if cfg is not None else "none"
    if kind == "linear":
        inv = inv / cfg.rope_factor
    elif kind == "llama3":
        factor, low, high, old = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, \
            cfg.rope_original_context
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def rope_tables(head_dim: int, seq_len: int, theta: float, device=None,
                cfg: ModelConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [seq_len, head_dim/2] (the interleaved-pair convention)."""
    inv = rope_inv_freq(head_dim, theta, cfg, device)
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, hd]; rotates consecutive pairs (x0, x1), (x2, x3), ..."""
    xf = x.float().reshape(*x.shape[:-1], -1, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


@dataclass
class KVCache:
    """Per-layer key/value tensors [B, n_kv, T_max, hd] filled up to `pos`.

    ``pad`` (left-padded rows of different lengths, :func:`workbench.train.generate.sample_prompts`): [B] the
    number of pad tokens each row starts with. Row b's token at cache position j then has RoPE position j - pad[b]
    and its pad keys are hidden from every query, so each row computes what it would alone (to rounding: other
    shapes, an explicit mask). None: no padding, the plain causal path."""
    k: list[torch.Tensor] = field(default_factory=list)
    v: list[torch.Tensor] = field(default_factory=list)
    pos: int = 0
    pad: torch.Tensor | None = None

    def padded(self, start: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE positions [B, T] of the next ``T`` tokens from cache position ``start`` and their attention
        mask [B, 1, T, start + T] (True: may attend): causal, no pad key, and a pad query sees itself (a query
        with every key masked would make NaN, which the pad's value would carry into the real rows' sums)."""
        pad = self.pad
        q = torch.arange(start, start + T, device=pad.device)
        keys = torch.arange(start + T, device=pad.device)
        positions = (q[None, :] - pad[:, None]).clamp_min(0)
        mask = (keys[None, None, :] >= pad[:, None, None]) & (keys[None, None, :] <= q[None, :, None])
        mask = mask | (keys[None, None, :] == q[None, :, None])
        return positions, mask.unsqueeze(1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, self.n_heads * self.hd, bias=cfg.attn_bias)
        self.wk = nn.Linear(cfg.dim, self.n_kv * self.hd, bias=cfg.attn_bias)
        self.wv = nn.Linear(cfg.dim, self.n_kv * self.hd, bias=cfg.attn_bias)
        self.wo = nn.Linear(self.n_heads * self.hd, cfg.dim, bias=False)
        # Qwen3: each head's queries and keys RMS-normalised before RoPE.
        self.q_norm = RMSNorm(self.hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.hd, cfg.norm_eps) if cfg.qk_norm else None
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin, cache: KVCache | None = None, layer: int = 0, mask=None):
        """``mask``: [B, 1, T, T] bool, True where a query may attend (packed rows: causal within each
        conversation), or the same as flex attention's BlockMask (:func:`document_mask`); None: causal."""
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.hd)
        k = self.wk(x).view(B, T, self.n_kv, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # QK-norm and RoPE in the projections' layout [B, T, heads, hd], then [B, heads, T, hd] as a view for
        # attention: the fused norm + RoPE kernel reads and writes whole rows (on an H200, +5.7 % tokens/s at
        # ~110 M with QK-norm against rotating after the transpose; README, GPU numbers). cos / sin come as
        # [T, hd/2], or [B, 1, T, hd/2] for packed rows: both broadcast over the heads once moved.
        c, s = (cos.unsqueeze(-2), sin.unsqueeze(-2)) if cos.dim() == 2 else (cos.transpose(1, 2), sin.transpose(1, 2))
        q, k = apply_rope(q, c, s).transpose(1, 2), apply_rope(k, c, s).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        causal = True
        if cache is not None:
            p = cache.pos
            if p > 0 and T > 1:
                raise ValueError("a KV-cache step after the prompt takes one token at a time")
            cache.k[layer][:, :, p:p + T] = k
            cache.v[layer][:, :, p:p + T] = v
            k, v = cache.k[layer][:, :, :p + T], cache.v[layer][:, :, :p + T]
            causal = p == 0  # a one-token step after the prompt sees the whole cache
        if mask is not None and not isinstance(mask, torch.Tensor):  # a BlockMask: flex attention, GQA inside
            y = flex_attention()(q, k, v, block_mask=mask, enable_gqa=self.n_kv != self.n_heads)
            y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd)
            return self.resid_drop(self.wo(y))
        if self.n_kv != self.n_heads:
            # GQA: each KV head serves n_heads / n_kv query heads.
            rep = self.n_heads // self.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd)
        return self.resid_drop(self.wo(y))


_FLEX = None


def flex_attention():
    """torch's flex_attention, compiled once per process (eager, it materialises every score; inside a
    compiled block the call is traced into that graph)."""
    global _FLEX
    if _FLEX is None:
        # lazily: flex attention (torch >= 2.5) only for packed rows with attention_kernel = flex
        from torch.nn.attention.flex_attention import flex_attention as flex
        _FLEX = torch.compile(flex, dynamic=False)
    return _FLEX


def document_mask(segments: torch.Tensor):
    """Packed rows' attention as flex attention's BlockMask: causal within each conversation (``segments``
    [B, T]: which conversation each token belongs to). Blocks of 128 x 128 wholly across conversations are
    skipped, not computed and masked (hardware.attention_kernel = flex). Made outside compiled code, once
    a micro-batch, and passed to the model in place of the segments."""
    from torch.nn.attention.flex_attention import create_block_mask  # lazily, as in flex_attention
    B, T = segments.shape

    def doc_causal(b, h, q, k):
        return (segments[b, q] == segments[b, k]) & (q >= k)

    return create_block_mask(doc_causal, B, None, T, T, device=segments.device)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_dim
        self.w1 = nn.Linear(cfg.dim, h, bias=False)
        self.w3 = nn.Linear(cfg.dim, h, bias=False)
        self.w2 = nn.Linear(h, cfg.dim, bias=False)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin, cache=None, layer=0, mask=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, layer, mask)
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, activation_checkpointing: bool = False, loss_chunk_tokens: int = 0):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        # > 0: compute the loss and its gradients this many tokens at a time, never holding all
        # logits (see FusedLinearCrossEntropy).
        self.loss_chunk_tokens = loss_chunk_tokens
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta, cfg=cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)
        # GPT-2 style: scale the residual output projections by depth.
        for name, p in self.named_parameters():
            if name.endswith("wo.weight") or name.endswith("w2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))
                if cfg.zero_init_out:  # after the draw: every other weight is what it would have been
                    nn.init.zeros_(p)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def output_weight(self) -> torch.Tensor:
        return self.tok_emb.weight if self.lm_head is None else self.lm_head.weight

    def hidden(self, idx: torch.Tensor, cache: KVCache | None = None, positions: torch.Tensor | None = None,
               segments: torch.Tensor | None = None) -> torch.Tensor:
        """The final normalised hidden states [B, T, dim]: everything but the output layer.
        Packed rows (several conversations in one): ``positions`` [B, T], each token's position in its own
        conversation (RoPE restarts in each), and ``segments`` [B, T], which conversation it belongs to
        (attention stays inside one: a block-diagonal causal mask)."""
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.cfg.seq_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds seq_len {self.cfg.seq_len}")
        mask = None
        if cache is not None and cache.pad is not None:   # left-padded rows: per-row positions, pad keys hidden
            positions, mask = cache.padded(start, T)
        if positions is not None:
            cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)
        else:
            cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        if segments is not None and not isinstance(segments, torch.Tensor):
            mask = segments  # flex attention's BlockMask, made from the segments (document_mask)
        elif segments is not None:
            causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
            mask = (segments[:, None, :, None] == segments[:, None, None, :]) & causal
        x = self.drop(self.tok_emb(idx))
        for i, block in enumerate(self.layers):
            if cache is not None:
                # Generation runs the blocks eagerly: a per-block compile (block.compile()) would compile a graph
                # for every layer index and cache position and hit dynamo's recompile limit, and in a run with a
                # time budget spend it (a 60 s budget on an H100 ended at 78 s, its samples recompiling). The
                # module's call (its hooks: FSDP's gathers) is kept.
                with torch.compiler.set_stance("force_eager"):
                    x = block(x, cos, sin, cache, i, mask)
            elif self.activation_checkpointing and self.training:
                x = activation_checkpoint(block, x, cos, sin, None, 0, mask, use_reentrant=False)
            else:
                x = block(x, cos, sin, None, 0, mask)  # the layer index is the cache's: 0 keeps one graph
        if cache is not None:
            cache.pos += T
        return self.norm(x)

    def compile_hidden(self, **compile_kwargs) -> None:
        """torch.compile everything but the output layer and loss, for calls without a KV cache
        (the fused loss is its own hand-written pass; generation stays eager). The compiled
        function is not a submodule, so the state dict keeps its plain names."""
        self._hidden_compiled = torch.compile(self.hidden, **compile_kwargs)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                cache: KVCache | None = None, positions: torch.Tensor | None = None,
                segments: torch.Tensor | None = None, loss_tokens: float | None = None, logps: bool = False):
        """Returns (logits, loss). With targets, logits are those of every position (None with
        the fused loss, which never builds them). ``loss_tokens`` (chat): the loss is the sum over the targets
        that are not ``IGNORE`` (-100) divided by this (the trained targets of the whole optimizer step, so
        micro-batches of ragged masks weigh each token alike); None: the mean over every target.
        ``logps`` (preference objectives): (None, each target's log-probability [B, T] in fp32, 0 where the
        target is ``IGNORE``), the logits made only at the trained targets (an answer is a small part of a row)."""
        compiled = self.__dict__.get("_hidden_compiled")
        if compiled is not None and cache is None and torch.is_grad_enabled():
            # training steps only: evals and sampling stay eager (one graph to compile). An inference graph for
            # the evals took cpu-small 14 s more to compile cold for 16 % off each eval forward: it would pay back
            # after ~19 evals, and the 2000 steps that compile have 11 (bench/eval_compile.py --device cpu)
            x = compiled(idx, None, positions, segments)
        else:
            x = self.hidden(idx, cache, positions, segments)
        if targets is None:
            # Generation needs only the last position's logits.
            return F.linear(x[:, -1:, :], self.output_weight()), None
        if logps:
            keep = targets != IGNORE
            z = F.linear(x[keep], self.output_weight()).float()
            picked = z.log_softmax(-1).gather(-1, targets[keep].unsqueeze(-1)).squeeze(-1)
            out = torch.zeros(targets.shape, dtype=torch.float32, device=x.device)
            out[keep] = picked
            return None, out
        n_tok = x.shape[0] * x.shape[1]
        if self.loss_chunk_tokens:
            return None, fused_cross_entropy(x.reshape(n_tok, -1), self.output_weight(), targets.reshape(-1),
                                             self.loss_chunk_tokens, loss_tokens)
        logits = F.linear(x, self.output_weight())
        flat = logits.float().view(-1, logits.size(-1))
        if loss_tokens is None:
            return logits, F.cross_entropy(flat, targets.reshape(-1))
        return logits, F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE, reduction="sum") / loss_tokens

    def new_cache(self, batch: int, device, dtype, pad: torch.Tensor | None = None) -> KVCache:
        """An empty cache for ``batch`` rows; ``pad`` [B]: the left pad of each row (see :class:`KVCache`)."""
        c = self.cfg
        shape = (batch, c.n_kv_heads, c.seq_len, c.head_dim)
        return KVCache(k=[torch.zeros(shape, device=device, dtype=dtype) for _ in range(c.n_layers)],
                       v=[torch.zeros(shape, device=device, dtype=dtype) for _ in range(c.n_layers)],
                       pad=None if pad is None else pad.to(device))


class FusedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``x @ w.T`` against ``targets``, a chunk of rows at a time, with
    the gradients computed in the same pass.

    The loss of a scalar has a known gradient: d loss / d logits = (softmax - onehot) / N.
    So each chunk's logits are turned into that gradient in place (exp, subtract one at the
    target, divide) and multiplied out into grad x and grad w right away; the backward pass
    only scales them by the incoming gradient. The full [tokens, vocab] logits never exist,
    nothing is recomputed (unlike checkpointed chunks), and F.cross_entropy's separate
    log-softmax, its backward and the zero-filled one-hot pass are gone: +8 % tokens/s for
    cpu-small on a 2-core CPU, measured against the plain loss in the same process.
    Under autocast the matmuls run in the autocast dtype and the softmax in fp32, as
    F.linear + F.cross_entropy(logits.float()) would.

    With ``denom`` (chat) the loss is the sum over the targets that are not IGNORE divided by ``denom``, and
    an ignored row has no loss and no gradient; without it every target counts and the loss is the mean.
    """

    @staticmethod
    def forward(ctx, x, w, targets, chunk: int, denom: float | None = None):
        n = x.shape[0] if denom is None else denom
        masked = denom is not None
        dev = x.device.type
        cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with torch.autocast(dev, enabled=False):
            wc = w.to(cdt)
            gx = torch.empty_like(x) if need_x else None
            gw = torch.zeros_like(w, dtype=torch.float32) if need_w else None
            total = torch.zeros((), dtype=torch.float32, device=x.device)
            for i in range(0, x.shape[0], chunk):
                xs, ts = x[i:i + chunk].to(cdt), targets[i:i + chunk, None]
                if masked:
                    keep = ts != IGNORE
                    ts = ts.clamp_min(0)
                z = (xs @ wc.t()).float()
                # log-sum-exp in place (torch.logsumexp would allocate another chunk of logits)
                target_logit = z.gather(1, ts)
                m = z.amax(dim=-1, keepdim=True)
                z.sub_(m).exp_()
                s = z.sum(dim=-1, keepdim=True)
                row_loss = m + s.log() - target_logit
                total += (row_loss * keep).sum() if masked else row_loss.sum()
                if gx is None and gw is None:
                    continue
                z.div_(s * n)                                            # softmax / N
                z.scatter_add_(1, ts, z.new_full(ts.shape, -1.0 / n))    # - onehot / N
                if masked:
                    z.mul_(keep)                                         # ignored rows: no gradient
                zc = z.to(cdt)
                if gx is not None:
                    if gx.dtype == cdt:
                        torch.mm(zc, wc, out=gx[i:i + chunk])
                    else:
                        gx[i:i + chunk] = zc @ wc
                if gw is not None:
                    if cdt == torch.float32:
                        gw.addmm_(zc.t(), xs)  # no [vocab, dim] temporary
                    else:
                        gw += zc.t() @ xs
        ctx.save_for_backward(gx, gw)
        ctx.w_dtype = w.dtype
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        gx, gw = ctx.saved_tensors
        return (None if gx is None else gx * grad_out.to(gx.dtype),
                None if gw is None else (gw * grad_out).to(ctx.w_dtype),
                None, None, None)


def fused_cross_entropy(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, chunk: int,
                        denom: float | None = None) -> torch.Tensor:
    """Cross-entropy of (x @ w.T) against targets, ``chunk`` rows at a time: the mean, or with ``denom`` the
    sum over targets that are not IGNORE divided by it (see FusedLinearCrossEntropy)."""
    if not torch.is_grad_enabled():
        # An eval: inside the Function grad mode is always off, and it would see only that w requires grad
        # and compute grad w for nothing (as much work as the logits; cpu-small's eval forward 1.3x slower).
        w = w.detach()
    return FusedLinearCrossEntropy.apply(x, w, targets, chunk, denom)
