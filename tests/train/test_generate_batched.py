"""The batched sampler (workbench/train/generate.py ``sample_prompts``) and the left-padded cached forward under it
(workbench/train/model.py, ``KVCache.pad``).

What is compared, on tiny random GPTs (GQA; and with QK-norm, the other attention path):
* the padded forward: prompts of different lengths left-padded into one cache give, at every real position and
  over decode steps, each prompt's own un-padded forward's hidden states / logits to 1e-5 (fp32; measured worst
  ~1e-6), and nothing is NaN (a pad query that saw no key would be);
* greedy: the batched completions are each prompt's own greedy completions, the same ids;
* sampled: prompt i's rows are ``sample_rows(prompt i, seed_i)``'s (its own generator; the rounding of a padded batch
  could flip a draw at a near-tie, ~1e-6 a draw: on these fixed models and seeds the runs are the same computation
  every time), whatever the order or company of the prompts, cut at their own stops, and when a prompt whose rows
  have all stopped leaves the batch;
* the one-prompt behaviour unchanged: ``sample_rows`` and ``generate`` give bit for bit what the loop before batching
  gave (copied below as it was, commit ccaa432), through a full cache's rebuild, with top-k and top-p.
"""

from __future__ import annotations

import pytest
import torch

from workbench.config import ModelConfig
from workbench.plan.sampling import TEXT, Sampling
from workbench.train.generate import generate, sample_prompts, sample_rows
from workbench.train.model import GPT

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [3], [20, 21, 22, 23, 24, 25], [30, 31, 32]]
SEEDS = [11, 12, 13, 14, 15]
TOL = 1e-5


def tiny(qk_norm: bool = False, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=32,
                           qk_norm=qk_norm)).eval()


@pytest.fixture(scope="module")
def model() -> GPT:
    return tiny()


@pytest.mark.parametrize("qk_norm", [False, True])
@torch.no_grad()
def test_the_padded_cached_forward_is_each_prompts_own(qk_norm):
    m = tiny(qk_norm)
    width = max(map(len, PROMPTS))
    pad = torch.tensor([width - len(p) for p in PROMPTS])
    cache = m.new_cache(len(PROMPTS), "cpu", torch.float32, pad)
    h = m.hidden(torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS]), cache)
    assert torch.isfinite(h).all()
    alone = [m.new_cache(1, "cpu", torch.float32) for _ in PROMPTS]
    worst = 0.0
    for b, p in enumerate(PROMPTS):
        own = m.hidden(torch.tensor([p]), alone[b])
        worst = max(worst, float((h[b, int(pad[b]):] - own[0]).abs().max()))
    # decode steps: each row fed the same next tokens as its own cache; the last position's logits compared
    for t in (40, 41, 42, 43):
        logits, _ = m(torch.full((len(PROMPTS), 1), t), cache=cache)
        for b in range(len(PROMPTS)):
            own, _ = m(torch.tensor([[t]]), cache=alone[b])
            worst = max(worst, float((logits[b] - own[0]).abs().max()))
    assert worst < TOL, worst
    # the tolerance is not vacuous: without the per-row positions the short prompts' logits are off
    shifted = m.new_cache(len(PROMPTS), "cpu", torch.float32)
    h_plain = m.hidden(torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS]), shifted)
    assert float((h_plain[0, int(pad[0]):] - m.hidden(torch.tensor([PROMPTS[0]]), m.new_cache(1, "cpu",
                                                                                             torch.float32))[0]
                  ).abs().max()) > 100 * TOL


def test_greedy_batched_completions_are_each_prompts_own(model):
    s = TEXT.replace(temperature=0.0, max_new_tokens=20)
    batched = sample_prompts(model, PROMPTS, 2, s, SEEDS, frozenset())
    for p, rows in zip(PROMPTS, batched):
        own = list(generate(model, p, 20, temperature=0.0))
        assert rows == [own, own]
    assert len({tuple(r[0]) for r in batched}) > 1        # not one completion for every prompt


def test_sampled_rows_are_each_prompts_own_stream_whatever_the_batch(model):
    s = TEXT.replace(temperature=1.2, max_new_tokens=16)
    alone = [sample_rows(model, p, 3, s, seed, frozenset()) for p, seed in zip(PROMPTS, SEEDS)]
    assert sample_prompts(model, PROMPTS, 3, s, SEEDS, frozenset()) == alone
    order = [3, 0, 4, 2, 1]
    again = sample_prompts(model, [PROMPTS[i] for i in order], 3, s, [SEEDS[i] for i in order], frozenset())
    assert again == [alone[i] for i in order]
    # prompts of one length: no padding, the plain path, the same streams
    same = [PROMPTS[0], PROMPTS[4]]
    assert sample_prompts(model, same, 3, s, [SEEDS[0], SEEDS[4]], frozenset()) == [alone[0], alone[4]]
    # stops per row: each row cut at its own first stop (kept with keep_stop), the batch as each prompt alone
    stop = alone[1][0][4]
    cut = sample_prompts(model, PROMPTS, 3, s, SEEDS, frozenset({stop}), keep_stop=True)
    assert cut == [[r[:r.index(stop) + 1] if stop in r else r for r in rows] for rows in alone]
    assert any(len(r) < 16 for rows in cut for r in rows)


@pytest.mark.parametrize("temperature", [0.0, 1.2])
def test_a_prompt_whose_rows_have_all_stopped_leaves_the_batch_and_the_others_go_on_as_alone(model, temperature):
    s = TEXT.replace(temperature=temperature, max_new_tokens=16)
    free = [sample_rows(model, p, 3, s, seed, frozenset()) for p, seed in zip(PROMPTS, SEEDS)]
    stops = frozenset(r[0] for r in free[2])        # prompt 2's rows all stop at their first token
    alone = [sample_rows(model, p, 3, s, seed, stops, keep_stop=True) for p, seed in zip(PROMPTS, SEEDS)]
    assert sample_prompts(model, PROMPTS, 3, s, SEEDS, stops, keep_stop=True) == alone
    assert all(len(r) == 1 for r in alone[2]) and max(len(r) for rows in alone for r in rows) > 4


def test_a_prompt_that_would_fill_the_cache_is_sampled_alone(model):
    """40 new tokens past a 32-token context: the batch's long prompt is rebuilt at its own length, as alone."""
    s = TEXT.replace(temperature=1.0, max_new_tokens=12)
    long = list(range(1, 30))
    got = sample_prompts(model, [PROMPTS[0], long, PROMPTS[1]], 2, s, [1, 2, 3], frozenset())
    assert got == [sample_rows(model, p, 2, s, seed, frozenset()) for p, seed in ((PROMPTS[0], 1), (long, 2),
                                                                                   (PROMPTS[1], 3))]
    assert all(len(r) == 12 for rows in got for r in rows)


def _old_sample_next(logits, temperature, top_k, top_p, generator):
    """sample_next before batching (ccaa432), verbatim."""
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k:
        k = min(top_k, logits.size(-1))
        kth = torch.topk(logits, k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        cum = probs.cumsum(-1)
        drop = cum - probs > top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)


@torch.no_grad()
def _old_sample_rows(model, prompt_ids, k, sampling: Sampling, seed, stops, keep_stop=False):
    """sample_rows before batching (ccaa432), verbatim but for its docstring."""
    args = sampling.replace(seed=seed).generate_args()
    model.eval()
    device = next(model.parameters()).device
    ctx = model.cfg.seq_len
    gen = torch.Generator(device=device)
    gen.manual_seed(args["seed"])
    ids = list(prompt_ids)[-(ctx - 1):] if prompt_ids else [0]
    rows = [list(ids) for _ in range(k)]
    out: list[list[int]] = [[] for _ in range(k)]
    done = [False] * k
    dtype = next(model.parameters()).dtype
    with torch.autocast(device.type, enabled=False):
        cache = model.new_cache(k, device, dtype)
        logits, _ = model(torch.tensor(rows, device=device), cache=cache)
        for _ in range(sampling.max_new_tokens):
            nxt = _old_sample_next(logits[:, -1], args["temperature"], args["top_k"], args["top_p"], gen)
            for r, t in enumerate(nxt[:, 0].tolist()):
                rows[r].append(t)
                if not done[r]:
                    if t in stops:
                        done[r] = True
                        if keep_stop:
                            out[r].append(t)
                    else:
                        out[r].append(t)
            if all(done):
                break
            if cache.pos >= ctx:
                cache = model.new_cache(k, device, dtype)
                logits, _ = model(torch.tensor([r[-(ctx // 2):] for r in rows], device=device), cache=cache)
            else:
                logits, _ = model(nxt, cache=cache)
    return out


@pytest.mark.parametrize("settings", [dict(temperature=1.2), dict(temperature=0.8, top_k=10, top_p=0.9),
                                      dict(temperature=0.0)])
def test_one_prompts_sampler_and_generate_are_unchanged_bit_for_bit(model, settings):
    s = Sampling(**{**dict(top_k=0, top_p=1.0), **settings, "max_new_tokens": 40})   # 40 > 32: a cache rebuild
    prompt = [5, 9, 12]
    for k in (1, 4):
        assert sample_rows(model, prompt, k, s, 11, frozenset()) == _old_sample_rows(model, prompt, k, s, 11,
                                                                                      frozenset())
    rows = _old_sample_rows(model, prompt, 4, s, 11, frozenset())
    stop = rows[-1][3]
    assert sample_rows(model, prompt, 4, s, 11, frozenset({stop}), keep_stop=True) == \
        _old_sample_rows(model, prompt, 4, s, 11, frozenset({stop}), keep_stop=True)
    assert list(generate(model, prompt, 40, **s.replace(seed=11).generate_args())) == \
        _old_sample_rows(model, prompt, 1, s, 11, frozenset())[0]
