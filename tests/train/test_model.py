"""The model: GQA equals explicitly repeated K/V heads; KV-cache decoding equals recomputation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.support.oracles import generate_recomputed
from workbench.config import ModelConfig
from workbench.train.checkpoint import strip_compile_prefix
from workbench.train.generate import generate
from workbench.train.model import GPT, apply_rope


def cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=97, dim=64, n_layers=2, n_heads=8, n_kv_heads=4, seq_len=32, dropout=0.0)
    base.update(kw)
    return ModelConfig(**base)


def reference_attention(attn, x, cos, sin):
    """Attention written out by hand with K/V heads repeated explicitly (no SDPA, no GQA path)."""
    B, T, _ = x.shape
    q = attn.wq(x).view(B, T, attn.n_heads, attn.hd).transpose(1, 2)
    k = attn.wk(x).view(B, T, attn.n_kv, attn.hd).transpose(1, 2)
    v = attn.wv(x).view(B, T, attn.n_kv, attn.hd).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rep = attn.n_heads // attn.n_kv
    k = torch.cat([k[:, i:i + 1].expand(B, rep, T, attn.hd) for i in range(attn.n_kv)], dim=1)
    v = torch.cat([v[:, i:i + 1].expand(B, rep, T, attn.hd) for i in range(attn.n_kv)], dim=1)
    att = (q @ k.transpose(-2, -1)) / attn.hd ** 0.5
    att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = F.softmax(att, dim=-1) @ v
    return attn.wo(y.transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("n_kv", [8, 4, 1], ids=["MHA", "GQA", "MQA"])
def test_gqa_equals_explicitly_repeated_kv_heads(n_kv):
    torch.manual_seed(0)
    m = GPT(cfg(n_kv_heads=n_kv)).eval()
    attn = m.layers[0].attn
    x = torch.randn(2, 16, 64)
    cos, sin = m.rope_cos[:16], m.rope_sin[:16]
    got = attn(x, cos, sin)
    want = reference_attention(attn, x, cos, sin)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert attn.wk.weight.shape == (n_kv * 8, 64)


@pytest.mark.parametrize("n_kv", [8, 2, 1])
def test_kv_cache_generation_equals_full_recomputation(n_kv):
    torch.manual_seed(1)
    m = GPT(cfg(n_kv_heads=n_kv))
    prompt = [5, 17, 3, 44, 2]
    # 40 new tokens with seq_len 32 also exercises the cache rebuild past the context.
    fast = list(generate(m, prompt, 20, temperature=0))
    slow = list(generate_recomputed(m, prompt, 20, temperature=0))
    assert fast == slow
    # Sampling with the same seed agrees too.
    a = list(generate(m, prompt, 15, temperature=1.0, top_k=10, top_p=0.9, seed=3))
    b = list(generate_recomputed(m, prompt, 15, temperature=1.0, top_k=10, top_p=0.9, seed=3))
    assert a == b


def test_a_per_block_compile_traces_one_graph_and_generation_runs_eagerly():
    """hardware.compile's per-block mode (CUDA's default) compiles each block: the blocks share one graph (the
    layer index, only the KV cache's, is not passed as a new constant per layer), and generating with a KV cache
    compiles nothing (each layer and cache position was a new graph: on an H100 a run's samples hit dynamo's
    recompile limit and took a 60 s time budget to 78 s). Dynamo's eager backend: the tracing is what counts."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(1)
    m = GPT(cfg(n_layers=3))
    reference = list(generate(m, [5, 17, 3], 12, temperature=0))
    for block in m.layers:
        block.compile(backend="eager")
    m.train()
    x = torch.randint(0, 97, (2, 16))
    m(x, x)[1].backward()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert list(generate(m, [5, 17, 3], 12, temperature=0)) == reference
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    torch._dynamo.reset()


def test_param_count_and_tied_embeddings():
    m = GPT(cfg())
    assert m.lm_head is None and m.output_weight() is m.tok_emb.weight
    untied = GPT(cfg(tie_embeddings=False))
    assert untied.num_params() == m.num_params() + 97 * 64


def test_compiled_state_dict_loads_into_uncompiled_model():
    m = GPT(cfg())
    compiled = torch.compile(m)  # wrapping adds the _orig_mod. prefix; no compilation happens here
    sd = compiled.state_dict()
    assert all(k.startswith("_orig_mod.") for k in sd)
    fresh = GPT(cfg())
    fresh.load_state_dict(strip_compile_prefix(sd))
    for (k, a), b in zip(m.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k


def test_loss_is_finite_and_near_log_vocab_at_init():
    torch.manual_seed(0)
    m = GPT(cfg())
    x, y = torch.randint(0, 97, (4, 32)), torch.randint(0, 97, (4, 32))
    _, loss = m(x, y)
    assert abs(loss.item() - torch.log(torch.tensor(97.0)).item()) < 0.5


def _loss_and_grads(model, x, y, accum=1):
    total = 0.0
    for i in range(accum):
        b = x.shape[0] // accum
        _, loss = model(x[i * b:(i + 1) * b], y[i * b:(i + 1) * b])
        (loss / accum).backward()
        total += loss.item() / accum
    return total, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("accum", [1, 2])
def test_fused_loss_equals_plain_loss_and_gradients(accum):
    torch.manual_seed(0)
    plain = GPT(cfg())
    fused = GPT(cfg(), loss_chunk_tokens=24)  # 2 x 32 tokens in chunks of 24 (uneven last chunk)
    fused.load_state_dict(plain.state_dict())
    x, y = torch.randint(0, 97, (4, 32)), torch.randint(0, 97, (4, 32))
    logits, _ = fused(x, y)
    assert logits is None  # the fused loss never builds the full logits
    fused.zero_grad(set_to_none=True)
    a, ga = _loss_and_grads(plain, x, y, accum)
    b, gb = _loss_and_grads(fused, x, y, accum)
    assert abs(a - b) < 1e-5
    assert ga["tok_emb.weight"].abs().sum() > 0  # tied: embedding and output gradients both land here
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], atol=1e-5, rtol=1e-4, msg=n)


def test_fused_loss_under_bf16_autocast_and_without_grad():
    torch.manual_seed(0)
    plain, fused = GPT(cfg()), GPT(cfg(), loss_chunk_tokens=16)
    fused.load_state_dict(plain.state_dict())
    x, y = torch.randint(0, 97, (2, 32)), torch.randint(0, 97, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, ga = _loss_and_grads(plain, x, y)
        b, gb = _loss_and_grads(fused, x, y)
    assert abs(a - b) < 2e-2
    for n in ga:
        assert ga[n].dtype == gb[n].dtype == torch.float32
        torch.testing.assert_close(ga[n], gb[n], atol=2e-3, rtol=5e-2, msg=n)
    with torch.no_grad():
        torch.testing.assert_close(plain(x, y)[1], fused(x, y)[1], atol=1e-5, rtol=1e-5)


def test_auto_loss_chunk_on_cpu_always_on_gpus_for_big_logits():
    from workbench.plan.fit.savers import auto_loss_chunk
    assert auto_loss_chunk(8, 256, 8192, "auto", "cuda") == 0            # cpu-small: 64 MiB of logits
    assert auto_loss_chunk(24, 1024, 32768, "auto", "cuda") == 2048      # gpu-8gb: 3 GiB -> 256 MiB chunks
    assert auto_loss_chunk(24, 1024, 32768, "false", "cuda") == 0
    assert auto_loss_chunk(8, 256, 8192, "true", "cuda") == 2048
    # CPU: always fused, 512 tokens a chunk, at most 64 MiB of fp32 logits
    assert auto_loss_chunk(8, 256, 8192, "auto", "cpu") == 512
    assert auto_loss_chunk(8, 512, 16384, "auto", "cpu") == 512
    assert auto_loss_chunk(8, 512, 65536, "auto", "cpu") == 256
    assert auto_loss_chunk(2, 16, 8192, "auto", "cpu") == 32
    assert auto_loss_chunk(8, 256, 8192, "false", "cpu") == 0


def test_zero_init_out_starts_every_block_as_the_identity():
    """model.zero_init_out: wo and w2 start at zero, every other weight is the one the default draws (same
    seed), so the blocks add nothing at first: the logits are the final norm of the embedding's."""
    torch.manual_seed(0)
    plain = GPT(cfg())
    torch.manual_seed(0)
    zero = GPT(cfg(zero_init_out=True))
    for (name, a), (_, b) in zip(plain.named_parameters(), zero.named_parameters()):
        if name.endswith(("wo.weight", "w2.weight")):
            assert not b.any() and a.any(), name
        else:
            assert torch.equal(a, b), name
    x = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        want = F.linear(zero.norm(zero.tok_emb(x)), zero.output_weight())
        got = zero(x)[0]  # without targets: the last position's logits
        assert got.shape == want[:, -1:].shape and torch.allclose(got, want[:, -1:], atol=1e-6)
