"""Token data for training: the prepared corpus memory-mapped, split by documents, and a resumable
window sampler (the text kind of :class:`~workbench.data.train_data.TrainData`). Preparation itself (tokenizer,
parallel encoding, the cache) is ``prepare``; a preset's data as the kind it is, ``workbench.data.preset_data``."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.config import Preset
from workbench.data.text.prepare import DataError, Prepared
from workbench.data.text.tokenizer import AnyTokenizer, load_tokenizer
from workbench.data.train_data import Batch, Sampler

__all__ = ["DataError", "TokenData", "WindowSampler", "load_tokens", "split_point"]


@dataclass
class TokenData:
    """A prepared text corpus (a :class:`TrainData`): one token stream, documents joined by the end-of-document
    token, split at a document boundary; drawn as random windows, every target trained."""
    tokenizer: AnyTokenizer
    tokens: np.ndarray          # memmap of the whole corpus
    n_train: int                # tokens [0, n_train) train, [n_train, len) val
    source: str
    tokenizer_path: Path
    cached: bool
    documents: int = 0
    index: dict | None = None   # the preparation's index.json (counts, timings, warnings)
    format: str = "text"

    @property
    def train(self) -> np.ndarray:
        return self.tokens[: self.n_train]

    @property
    def val(self) -> np.ndarray:
        return self.tokens[self.n_train:]

    @property
    def template(self) -> None:
        return None  # text is trained as it is, through no chat template

    def sampler(self, part: str, p: Preset, seed: int) -> WindowSampler:
        return WindowSampler(self.train if part == "train" else self.val, p.model.seq_len, p.train.batch_size, seed)

    def split_tokens(self) -> tuple[int, int]:
        return int(self.n_train), int(len(self.tokens) - self.n_train)

    def check(self, p: Preset) -> None:
        pass  # a corpus too short for one window of each part was refused as it was loaded

    def start_lines(self, sampler: Sampler, p: Preset) -> list[str]:
        return []

    def start_facts(self, sampler: Sampler, p: Preset) -> dict[str, Any]:
        return {}


def split_point(tokens: np.ndarray, eod: int | None, val_fraction: float, seq_len: int,
                documents: int | None = None) -> int:
    """Where validation starts: at a document boundary, so that the last documents, about ``val_fraction``
    of the tokens, are held out (no document is split between train and val). The boundary is looked for
    where it leaves between half and twice that share for validation (a corpus of a few huge documents
    would otherwise hold out most of itself, or almost nothing); with none there, or a single document
    (``documents``, if known: then nothing is read), the split is at ``val_fraction`` of the tokens.
    Depends only on the corpus: stable across runs. Reads at most ~2 ``val_fraction`` of the tokens, in
    blocks."""
    n, need = len(tokens), seq_len + 1
    held = max(int(n * val_fraction), need)
    target = n - held
    if eod is not None and documents != 1:
        blocks = _Blocks(tokens)
        # the first document that starts at/after the target, leaving at least half the share ...
        after = _find(blocks, eod, target - 1, forward=True, stop=n - max(held // 2, need))
        if after is not None and need <= after + 1 <= n - need:
            return after + 1
        # ... else the last one before it, holding out at most twice the share
        before = _find(blocks, eod, target - 1, forward=False, stop=max(0, n - 2 * held - 1))
        if before is not None and need <= before + 1 <= n - need:
            return before + 1
    return target


class _Blocks:
    """Slices of a token array; of a whole-file memmap, read through the file: the pages of a map, once
    touched, count in the process's memory (a scan of a 1 GB corpus would hold it all)."""

    def __init__(self, tokens: np.ndarray):
        self.tokens, self.n = tokens, len(tokens)
        name = getattr(tokens, "filename", None)
        whole = (isinstance(tokens, np.memmap) and isinstance(tokens.base, mmap.mmap) and tokens.offset == 0
                 and os.path.getsize(name) == tokens.nbytes)
        self.path = name if whole else None

    def __getitem__(self, sl: slice) -> np.ndarray:
        lo, hi = max(0, sl.start), min(self.n, sl.stop)
        if self.path is None:
            return np.asarray(self.tokens[lo:hi])
        with open(self.path, "rb") as f:
            f.seek(lo * self.tokens.itemsize)
            return np.fromfile(f, dtype=self.tokens.dtype, count=max(0, hi - lo))


def _find(tokens: _Blocks, value: int, start: int, forward: bool, stop: int, block: int = 1 << 20) -> int | None:
    """The position of the first ``value`` in [start, stop) (forward), or the last in [stop, start)."""
    if forward:
        for lo in range(max(0, start), min(stop, tokens.n), block):
            hits = np.flatnonzero(tokens[lo:min(lo + block, stop)] == value)
            if len(hits):
                return lo + int(hits[0])
        return None
    hi = min(tokens.n, start)
    while hi > stop:
        lo = max(stop, hi - block)
        hits = np.flatnonzero(tokens[lo:hi] == value)
        if len(hits):
            return lo + int(hits[-1])
        hi = lo
    return None


def load_tokens(prep: Prepared, val_fraction: float, seq_len: int) -> TokenData:
    idx = prep.index
    tok = load_tokenizer(prep.dir)
    tokens = np.memmap(prep.tokens_path, dtype=np.dtype(idx["dtype"]), mode="r", shape=(idx["tokens"],))
    n = len(tokens)
    if n < 2 * (seq_len + 1):
        need = 2 * (seq_len + 1)
        raise DataError(f"the corpus is too short: {n:,} tokens, but one training and one validation "
                        f"sequence of model.seq_len = {seq_len} need at least {need:,}; use a longer corpus "
                        f"or a smaller seq_len (e.g. --set model.seq_len={max(8, n // 4)})")
    n_train = split_point(tokens, tok.eod_id, val_fraction, seq_len, idx.get("documents"))
    return TokenData(tokenizer=tok, tokens=tokens, n_train=n_train, source=idx.get("source", "?"),
                     tokenizer_path=prep.tokenizer_path, cached=prep.cached, documents=idx.get("documents", 0),
                     index=idx)


class WindowSampler:
    """Random (x, y) windows from a token array, from a generator whose state is saved.

    ``state()`` / ``set_state()`` make the stream resumable: after restoring, the next
    batches equal those the original would have drawn.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int):
        self.tokens, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.high = len(tokens) - seq_len - 1

    def next_batch(self) -> Batch[np.ndarray]:
        ix = self.rng.integers(0, self.high + 1, size=self.batch_size)
        win = np.stack([np.asarray(self.tokens[i:i + self.seq_len + 1], dtype=np.int64) for i in ix])
        return Batch(win[:, :-1], win[:, 1:])

    def state(self) -> dict:
        s = self.rng.bit_generator.state
        # 128-bit integers as strings: the state is stored in JSON.
        return {"bit_generator": s["bit_generator"], "state": {k: str(v) for k, v in s["state"].items()},
                "has_uint32": s["has_uint32"], "uinteger": s["uinteger"]}

    def set_state(self, st: dict) -> None:
        self.rng.bit_generator.state = {"bit_generator": st["bit_generator"],
                                        "state": {k: int(v) for k, v in st["state"].items()},
                                        "has_uint32": st["has_uint32"], "uinteger": st["uinteger"]}
