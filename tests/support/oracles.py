"""Slow, plain implementations the product's fast ones are checked against (torch): generation that recomputes
the whole context for every new token (the KV cache's oracle), and answers' log-probabilities from full logits
(the preference losses' input, which the trainer takes from the fused loss's per-token log-probs)."""

from __future__ import annotations

from typing import Iterator

import torch

from workbench.plan.sampling import TEXT
from workbench.train.generate import sample_next
from workbench.train.model import GPT
from workbench.train.preference_losses import AnswerLogps


@torch.no_grad()
def generate_recomputed(model: GPT, prompt_ids: list[int], max_new_tokens: int,
                        temperature: float = TEXT.temperature, top_k: int | None = TEXT.top_k,
                        top_p: float | None = TEXT.top_p, seed: int | None = TEXT.seed) -> Iterator[int]:
    """``workbench.train.generate.generate`` without a cache: the last seq_len tokens through the whole model
    for every new token, sampled with the same generator, so greedy and seeded sampling give the same tokens."""
    model.eval()
    device = next(model.parameters()).device
    ctx = model.cfg.seq_len
    gen = None
    if seed is not None:
        gen = torch.Generator(device=device if device.type != "mps" else "cpu")
        gen.manual_seed(seed)
    ids = list(prompt_ids)[-(ctx - 1):] if prompt_ids else [0]
    with torch.autocast(device.type, enabled=False):
        for _ in range(max_new_tokens):
            logits, _ = model(torch.tensor([ids[-ctx:]], device=device))
            nxt = int(sample_next(logits[:, -1], temperature, top_k, top_p, gen))
            ids.append(nxt)
            yield nxt


def answer_logps(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> AnswerLogps:
    """Log-probabilities of ``targets`` [B, T] under ``logits`` [B, T, V] (computed in fp32), on ``mask``'s tokens."""
    m = mask.to(torch.float32)
    per_token = torch.gather(logits.float().log_softmax(-1), -1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * m
    return AnswerLogps(per_token, m, per_token.sum(-1), m.sum(-1))
