"""What a training step draws: the sampler of a run's data (token windows of text, packed rows of
conversations) and, for chat, how many targets one optimizer step trains."""

from __future__ import annotations

import numpy as np

from workbench.config import Preset
from workbench.data.chat_data import IGNORE, ChatData, ChatSampler, trained_count
from workbench.data.tokens import TokenData, WindowSampler

Sampler = WindowSampler | ChatSampler


def new_sampler(data: TokenData | ChatData, part: str, p: Preset, seed: int) -> Sampler:
    """The batches of ``part`` (train or val) of a run's data, drawn from ``seed``."""
    if data.format == "chat":
        return ChatSampler(data, part, p.model.seq_len, p.train.batch_size, seed, p.train.loss_on,
                           p.data.packing, p.data.overlong)
    return WindowSampler(data.train if part == "train" else data.val, p.model.seq_len, p.train.batch_size, seed)


def trained_targets(batches: list[tuple], world: int) -> float | None:
    """Chat: the trained targets of one optimizer step's global micro-batches, per rank (DDP averages the
    ranks' gradients, so each rank divides its sum by this to make the step's loss the mean over them
    all); at least one. None for text (every target counts: the mean of each micro-batch)."""
    if len(batches[0]) < 4:
        return None
    n = sum(int(np.count_nonzero(b[1] != IGNORE)) for b in batches)
    return max(1, n) / world


def split_tokens(data: TokenData | ChatData) -> tuple[int, int]:
    """Tokens of the train and the val split."""
    if data.format == "chat":
        return int(data.lengths("train").sum()), int(data.lengths("val").sum())
    return int(data.n_train), int(len(data.tokens) - data.n_train)


def chat_facts(data: ChatData, sampler: ChatSampler, p: Preset) -> dict:
    """What the run doctor needs to judge a chat corpus (the start event's ``chat``)."""
    idx, rows, lengths = data.index, sampler.rows, data.lengths("train")
    return {"conversations": int(len(lengths)), "trained_fraction": round(trained_count(idx, p.train.loss_on)
                                                                          / max(1, idx["tokens"]), 4),
            "loss_on": p.train.loss_on, "truncated": rows.truncated, "dropped": rows.dropped,
            "row_fill": round(rows.efficiency, 4), "packing": p.data.packing,
            "p95_tokens": int(np.percentile(lengths, 95)) if len(lengths) else 0}


def chat_line(data: ChatData, sampler: ChatSampler, p: Preset) -> str:
    """The start log's line about a chat corpus: conversations, what is trained, how rows are filled."""
    idx, rows = data.index, sampler.rows
    trained = trained_count(idx, p.train.loss_on)
    over = (f", {rows.truncated:,} truncated to model.seq_len" if rows.truncated else "") + \
        (f", {rows.dropped:,} longer than model.seq_len dropped" if rows.dropped else "")
    how = "packed" if p.data.packing else "one a row"
    return (f"chat: {data.documents:,} conversations ({data.n_train:,} train), template {data.template.source}; "
            f"loss on {p.train.loss_on} ({trained / max(1, idx['tokens']):.0%} of tokens); {how} into "
            f"{rows.rows:,} rows of {p.model.seq_len}, {rows.efficiency:.0%} filled{over}")


__all__ = ["Sampler", "chat_facts", "chat_line", "new_sampler", "split_tokens", "trained_targets"]
