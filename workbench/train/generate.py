"""Text generation with a KV cache: the prompt is processed once, then one token a step.

A prompt longer than the context is cropped from the left. When the cache is
full, it is rebuilt from the last half of the context (one recomputation per
seq_len/2 new tokens), so generation can run past seq_len. ``sample_prompts`` is the batched case: K
completions of each of many prompts as rows of one cache, left-padded (``workbench pairs``, ``eval --reward``,
GRPO's rollouts); ``sample_rows`` its one-prompt case.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import torch

from workbench.plan.sampling import TEXT, Sampling
from workbench.train.model import GPT


def sample_next(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
                generator: torch.Generator | None) -> torch.Tensor:
    """logits [B, V] -> next ids [B, 1]. temperature 0 = greedy."""
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    return torch.multinomial(next_probs(logits, temperature, top_k, top_p), 1, generator=generator)


def next_probs(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """logits [B, V] -> the distribution each row samples from (temperature > 0): row by row, so rows computed
    together give each row's own numbers."""
    logits = logits.float() / temperature
    if top_k:
        k = min(top_k, logits.size(-1))
        kth = torch.topk(logits, k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        cum = probs.cumsum(-1)
        drop = cum - probs > top_p  # keep the smallest set whose mass reaches top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)
    return logits.softmax(-1)


@torch.no_grad()
def generate(model: GPT, prompt_ids: list[int], max_new_tokens: int, temperature: float = TEXT.temperature,
             top_k: int | None = TEXT.top_k, top_p: float | None = TEXT.top_p, seed: int | None = TEXT.seed,
             autocast_dtype: torch.dtype | None = None) -> Iterator[int]:
    """Yield new token ids one at a time (the settings' defaults: plan.sampling's, every front's). Checked against
    recomputing the whole context for each token (tests/support/oracles.py)."""
    model.eval()
    device = next(model.parameters()).device
    ctx = model.cfg.seq_len
    gen = None
    if seed is not None:
        gen = torch.Generator(device=device if device.type != "mps" else "cpu")
        gen.manual_seed(seed)
    ids = list(prompt_ids)[-(ctx - 1):] if prompt_ids else [0]
    amp = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype
           else torch.autocast(device.type, enabled=False))
    with amp:
        dtype = next(model.parameters()).dtype if autocast_dtype is None else autocast_dtype
        cache = model.new_cache(1, device, dtype)
        logits, _ = model(torch.tensor([ids], device=device), cache=cache)
        for _ in range(max_new_tokens):
            nxt = int(sample_next(logits[:, -1], temperature, top_k, top_p, gen))
            ids.append(nxt)
            yield nxt
            if cache.pos >= ctx:
                keep = ids[-(ctx // 2):]
                cache = model.new_cache(1, device, dtype)
                logits, _ = model(torch.tensor([keep], device=device), cache=cache)
            else:
                logits, _ = model(torch.tensor([[nxt]], device=device), cache=cache)


def sample_rows(model: GPT, prompt_ids: list[int], k: int, sampling: Sampling, seed: int, stops: frozenset[int],
                keep_stop: bool = False) -> list[list[int]]:
    """``k`` completions of one prompt as ids, each cut before its first stop id (``keep_stop``: after it, the stop
    id kept, as a trainer that must learn to stop needs it): :func:`generate`'s loop (a prompt cropped from the left
    to the context, the KV cache rebuilt from the last half of the context when full) over a batch of ``k`` rows,
    one generator seeded ``seed`` for the batch. One row gives ``generate``'s tokens for the same seed. The one-prompt
    case of :func:`sample_prompts`."""
    return sample_prompts(model, [prompt_ids], k, sampling, [seed], stops, keep_stop)[0]


# The most KV cache one batch of :func:`sample_prompts` holds (its rows' caches are seq_len long): more prompts
# are sampled a batch of them at a time. A prompt's k rows always go together.
CACHE_BYTES = 2 << 30


@torch.no_grad()
def sample_prompts(model: GPT, prompts: list[list[int]], k: int, sampling: Sampling, seeds: list[int],
                   stops: frozenset[int], keep_stop: bool = False) -> list[list[list[int]]]:
    """``k`` completions of each prompt (as :func:`sample_rows` gives them, cut at stops the same way), the prompts'
    rows sampled together in one KV cache: ``workbench pairs``, ``workbench eval --reward`` and GRPO's rollouts.

    * **Padding**: prompts of different lengths are padded on the left and the cache told each row's pad
      (:class:`workbench.train.model.KVCache`): per-row RoPE positions, pad keys masked, so each row's logits are
      its own un-padded forward's to fp32 rounding (tests/train/test_generate_batched.py states the tolerance);
      greedy completions are the same ids. Prompts of one length need no padding and take the plain causal path.
    * **Seeds**: prompt i's rows draw from their own generator seeded ``seeds[i]``, as ``sample_rows(prompt i, k,
      seed=seeds[i])`` would: which prompts share a batch changes no prompt's random stream, only the rounding of
      its logits (a padded batch's matmuls and masked attention are not bitwise a lone prompt's), so a completion
      drawn at a near-tie may differ from the one-prompt sampler's; a batch of one prompt is ``sample_rows``,
      bitwise.
    * **The context**: a prompt that, with ``sampling.max_new_tokens``, does not fit the context (its cache would
      be rebuilt mid-way, at its own length) is sampled alone, as ``sample_rows`` does it. The others are sorted by
      length (less padding) and batched up to :data:`CACHE_BYTES` of cache, a prompt's k rows together.
    * **Stops**: per row; a prompt whose k rows have all stopped leaves the batch (its rows dropped from the cache:
      the others' steps get cheaper, no stream changes), and the batch ends when every row has stopped or has
      ``max_new_tokens``."""
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts and {len(seeds)} seeds")
    ctx = model.cfg.seq_len
    cropped = [list(p)[-(ctx - 1):] if p else [0] for p in prompts]
    new = sampling.max_new_tokens
    fit = sorted((i for i, p in enumerate(cropped) if len(p) + new <= ctx), key=lambda i: len(cropped[i]))
    c = model.cfg
    row_bytes = 2 * c.n_layers * c.n_kv_heads * c.seq_len * c.head_dim * next(model.parameters()).element_size()
    per_batch = max(1, CACHE_BYTES // (row_bytes * max(k, 1)))
    batches = [fit[a:a + per_batch] for a in range(0, len(fit), per_batch)]
    batches += [[i] for i in range(len(cropped)) if len(cropped[i]) + new > ctx]
    out: list[list[list[int]]] = [[] for _ in prompts]
    for b in batches:
        for i, rows in zip(b, _sample_batch(model, [cropped[i] for i in b], k, sampling, [seeds[i] for i in b],
                                            stops, keep_stop)):
            out[i] = rows
    return out


def _sample_batch(model: GPT, prompts: list[list[int]], k: int, sampling: Sampling, seeds: list[int],
                  stops: frozenset[int], keep_stop: bool) -> list[list[list[int]]]:
    """One cache of ``len(prompts) x k`` rows, left-padded when the (cropped) prompts' lengths differ; a rebuilt
    cache only for one prompt (:func:`sample_prompts` batches only prompts that fit). A prompt whose k rows have all
    stopped leaves the batch (its rows taken out of the cache), as it would end its loop alone: the others' steps
    stop paying for it, and no generator's stream changes."""
    args = sampling.generate_args()
    model.eval()
    device = next(model.parameters()).device
    ctx = model.cfg.seq_len
    gens = []
    for seed in seeds:
        gen = torch.Generator(device=device if device.type != "mps" else "cpu")
        gen.manual_seed(seed)
        gens.append(gen)
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts for _ in range(k)]
    rows = [[0] * (width - len(p)) + list(p) for p in prompts for _ in range(k)]
    pad = torch.tensor(pads) if any(pads) else None
    n = len(rows)
    out: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    live = list(range(len(prompts)))     # the prompts still in the batch, in its order
    dtype = next(model.parameters()).dtype
    with torch.autocast(device.type, enabled=False):
        cache = model.new_cache(n, device, dtype, pad)
        logits, _ = model(torch.tensor(rows, device=device), cache=cache)
        for step in range(sampling.max_new_tokens):
            last = logits[:, -1]
            if len(prompts) == 1:
                nxt = sample_next(last, args["temperature"], args["top_k"], args["top_p"], gens[0])
            elif args["temperature"] <= 0:
                nxt = last.argmax(-1, keepdim=True)
            else:   # every row's distribution at once, each prompt's k rows drawn from its own generator
                probs = next_probs(last, args["temperature"], args["top_k"], args["top_p"])
                nxt = torch.cat([torch.multinomial(probs[i * k:(i + 1) * k], 1, generator=gens[g])
                                 for i, g in enumerate(live)])
            for r, t in zip((g * k + j for g in live for j in range(k)), nxt[:, 0].tolist()):
                rows[r].append(t)
                if not done[r]:
                    if t in stops:
                        done[r] = True
                        if keep_stop:
                            out[r].append(t)
                    else:
                        out[r].append(t)
            if all(done) or step == sampling.max_new_tokens - 1:
                break
            ended = [i for i, g in enumerate(live) if all(done[g * k:(g + 1) * k])]
            if ended:   # only in a batch of several prompts: one prompt's loop ends with all(done)
                stay = torch.tensor([i * k + j for i in range(len(live)) if i not in ended for j in range(k)],
                                    device=device)
                cache.k = [t.index_select(0, stay) for t in cache.k]
                cache.v = [t.index_select(0, stay) for t in cache.v]
                cache.pad = None if cache.pad is None else cache.pad.index_select(0, stay)
                nxt = nxt.index_select(0, stay)
                live = [g for i, g in enumerate(live) if i not in ended]
            if cache.pos >= ctx:
                assert pad is None and len(prompts) == 1, "a batch of several prompts never fills its cache"
                cache = model.new_cache(n, device, dtype)
                logits, _ = model(torch.tensor([r[-(ctx // 2):] for r in rows], device=device), cache=cache)
            else:
                logits, _ = model(nxt, cache=cache)
    return [out[g * k:(g + 1) * k] for g in range(len(prompts))]


def generate_text(model: GPT, tokenizer, prompt: str, max_new_tokens: int,
                  on_text: Callable[[str], None] | None = None, **kw) -> str:
    """The text generated after ``prompt``, streamed to ``on_text``."""
    return stream_text(tokenizer, generate(model, tokenizer.encode(prompt), max_new_tokens, **kw), on_text)[0]


def stream_text(tokenizer, ids: Iterable[int], on_text: Callable[[str], None] | None = None
                ) -> tuple[str, list[int]]:
    """Decode ``ids`` as they come, so that multi-byte characters split across tokens print whole; the text
    and the ids."""
    out_ids: list[int] = []
    shown = ""
    for tid in ids:
        out_ids.append(tid)
        text = tokenizer.decode(out_ids)
        if on_text and not text.endswith("\ufffd"):
            on_text(text[len(shown):])
            shown = text
    text = tokenizer.decode(out_ids)
    if on_text and len(text) > len(shown):
        on_text(text[len(shown):])
    return text, out_ids
