"""Text generation with a KV cache: the prompt is processed once, then one token a step.

A prompt longer than the context is cropped from the left. When the cache is
full, it is rebuilt from the last half of the context (one recomputation per
seq_len/2 new tokens), so generation can run past seq_len. ``sample_rows`` is the batched case: K
completions of one prompt as K rows of one cache (``workbench pairs``, ``eval --reward``, GRPO's rollouts).
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
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)


@torch.no_grad()
def generate(model: GPT, prompt_ids: list[int], max_new_tokens: int, temperature: float = TEXT.temperature,
             top_k: int | None = TEXT.top_k, top_p: float | None = TEXT.top_p, seed: int | None = TEXT.seed,
             use_cache: bool = True, autocast_dtype: torch.dtype | None = None) -> Iterator[int]:
    """Yield new token ids one at a time (the settings' defaults: plan.sampling's, every front's)."""
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
        if not use_cache:
            for _ in range(max_new_tokens):
                x = torch.tensor([ids[-ctx:]], device=device)
                logits, _ = model(x)
                nxt = int(sample_next(logits[:, -1], temperature, top_k, top_p, gen))
                ids.append(nxt)
                yield nxt
            return
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


@torch.no_grad()
def sample_rows(model: GPT, prompt_ids: list[int], k: int, sampling: Sampling, seed: int, stops: frozenset[int],
                keep_stop: bool = False) -> list[list[int]]:
    """``k`` completions of one prompt as ids, each cut before its first stop id (``keep_stop``: after it, the stop
    id kept, as a trainer that must learn to stop needs it): :func:`generate`'s loop (a prompt cropped from the left
    to the context, the KV cache rebuilt from the last half of the context when full) over a batch of ``k`` rows,
    one generator seeded ``seed`` for the batch. One row gives ``generate``'s tokens for the same seed. Used by
    ``workbench pairs``, ``workbench eval --reward`` and GRPO's rollouts (:mod:`workbench.train.grpo_step`)."""
    args = sampling.replace(seed=seed).generate_args()
    model.eval()
    device = next(model.parameters()).device
    ctx = model.cfg.seq_len
    gen = torch.Generator(device=device if device.type != "mps" else "cpu")
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
            nxt = sample_next(logits[:, -1], args["temperature"], args["top_k"], args["top_p"], gen)
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
