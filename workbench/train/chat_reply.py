"""A chat model's reply: the conversation so far rendered through the run's chat template with the
assistant's header (``add_generation_prompt``), encoded as training encoded it, then generated until the
template's end-of-turn token (which is never shown) or ``max_tokens``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from workbench.data.chat.chat_templates import ChatTemplate, run_template
from workbench.data.chat.conversations import ChatEncoder
from workbench.data.text.tokenizer import AnyTokenizer
from workbench.plan.sampling import CHAT
from workbench.train.generate import generate, stream_text
from workbench.train.model import GPT


@dataclass
class Reply:
    text: str
    ids: list[int]          # the generated ids, the end-of-turn token left out
    stopped: bool           # ended by the end-of-turn token (not by max_tokens or the end of the document)


@torch.no_grad()
def reply(model: GPT, tok: AnyTokenizer, template: ChatTemplate, messages: list[dict],
          max_tokens: int = CHAT.max_new_tokens, temperature: float = CHAT.temperature, top_k: int | None = CHAT.top_k,
          top_p: float | None = CHAT.top_p, seed: int | None = CHAT.seed, on_text: Callable[[str], None] | None = None,
          autocast_dtype: torch.dtype | None = None) -> Reply:
    """The assistant's next message after ``messages`` (greedy at temperature 0: chat's default, plan.sampling),
    streamed to ``on_text``."""
    enc = ChatEncoder(template, tok)
    prompt = enc.prompt_ids(messages)
    stops = {enc.end_id, *([tok.eod_id] if tok.eod_id is not None else [])}
    stopped = False

    def until_end():
        nonlocal stopped
        for t in generate(model, prompt, max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                          autocast_dtype=autocast_dtype):
            if t in stops:
                stopped = True
                return
            yield t

    text, ids = stream_text(tok, until_end(), on_text)
    return Reply(text, ids, stopped)


__all__ = ["Reply", "reply", "run_template"]
