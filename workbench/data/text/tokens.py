"""Token data for training: the prepared corpus memory-mapped, split by documents, and a resumable
window sampler (the text kind of :class:`~workbench.data.train_data.TrainData`); and :func:`prepare_data`, which
gives a preset's corpus as the kind it is, text or conversations. Preparation itself (tokenizer, parallel
encoding, the cache) is ``prepare``."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from workbench.config import DataConfig, Preset
from workbench.config.objectives import SFT
from workbench.data.chat.chat_data import corpus_kind, load_chat, template_for
from workbench.data.chat.chat_prepare import prepare_chat
from workbench.data.chat.chat_templates import ChatTemplateError
from workbench.data.chat.conversations import ChatEncoder
from workbench.data.corpus.documents import Corpus, open_corpus
from workbench.data.preference.preference_data import load_preference
from workbench.data.preference.preference_records import KINDS, check_corpus_kind
from workbench.data.text.prepare import SHARD_CHARS, DataError, Prepared, Progress, prepare
from workbench.data.text.tokenizer import AnyTokenizer, load_tokenizer, tokenizer_file
from workbench.data.train_data import Batch, Sampler, TrainData
from workbench.faults import NO_FAULTS, Faults

__all__ = ["DataError", "TokenData", "WindowSampler", "load_tokens", "open_data_corpus", "prepare_data",
           "split_point"]


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


def open_data_corpus(cfg: DataConfig) -> Corpus:
    """The corpus a preset's [data] names (listed, nothing read): a mixture's sources together."""
    if cfg.mixture:
        from workbench.data.mixture.mixture_data import mixture_corpus
        return mixture_corpus(cfg)
    return open_corpus(cfg.corpus, text_field=cfg.text_field, skip_bad=cfg.skip_bad_records,
                       builtin_mb=cfg.builtin_mb)


def given_tokenizer(cfg: DataConfig, vocab_size: int, own: Path | None = None) -> AnyTokenizer | None:
    """The tokenizer ``data.tokenizer`` names (None: one is trained on the corpus), checked against the
    embedding's ``vocab_size`` rows. ``own``: a run directory whose own copy of it comes first (a run keeps
    its tokenizer even if the run it came from is deleted)."""
    if not cfg.tokenizer:
        return None
    where = own if own is not None and tokenizer_file(own) is not None else Path(cfg.tokenizer).expanduser()
    tok = load_tokenizer(where)
    if tok.vocab_size > vocab_size:
        raise DataError(f"the tokenizer {where} has {tok.vocab_size:,} ids but the model's embedding has "
                        f"{vocab_size:,} rows (model.vocab_size): it is not this model's tokenizer")
    if tok.eod_id is None:
        raise DataError(f"the tokenizer {where} has no end-of-sequence token to put between documents; name it "
                        "as eos_token in the tokenizer_config.json beside it")
    return tok


def tokenizer_dir(cfg: DataConfig, own: Path | None = None) -> Path | None:
    """The directory of the tokenizer data.tokenizer names (the run's own copy first): where an imported
    model's tokenizer_config.json and chat template are."""
    if own is not None and tokenizer_file(own) is not None:
        return own
    if not cfg.tokenizer:
        return None
    path = Path(cfg.tokenizer).expanduser()
    return path if path.is_dir() else path.parent


def check_chat_template(cfg: DataConfig, vocab_size: int, loss_on: str = "assistant") -> None:
    """The template a chat corpus will be rendered through can be found and masked with the tokenizer given: the
    check a detached start makes before its run directory exists (the trainer encodes the conversations)."""
    given = given_tokenizer(cfg, vocab_size)
    try:
        template = template_for(cfg, given, tokenizer_dir(cfg))
        if given is not None:
            ChatEncoder(template, given, loss_on)  # finds the end-of-turn token, or says why it cannot
    except ChatTemplateError as e:
        raise DataError(str(e)) from None


def prepare_data(cfg: DataConfig, vocab_size: int, seq_len: int, log: Callable[[str], None] = print,
                 progress: Progress | None = None, workers: int | None = None, shard_chars: int = SHARD_CHARS,
                 faults: Faults = NO_FAULTS, run_dir: Path | None = None, loss_on: str = "assistant",
                 objective: str = SFT) -> TrainData:
    """The tokenizer and tokens of a preset's corpus, ready to train on (prepared now unless cached): a
    :class:`TokenData` of documents, a :class:`~workbench.data.chat.chat_data.ChatData` of conversations (data.format),
    or a :class:`~workbench.data.preference.preference_data.PreferenceData` of preference records, refused first when
    ``objective`` (train.objective) cannot train on its kind. ``run_dir``: the run's own copy of a given tokenizer
    (data.tokenizer) comes first."""
    if cfg.mixture:  # several sources: each prepared as below, one tokenizer (data/mixture/mixture_data.py)
        from workbench.data.mixture.mixture_data import prepare_mixture

        def one(c: DataConfig) -> TrainData:
            return prepare_data(c, vocab_size, seq_len, log, progress, workers, shard_chars, faults, run_dir, loss_on,
                                objective)
        data = prepare_mixture(cfg, vocab_size, seq_len, log, one, given_tokenizer(cfg, vocab_size, run_dir),
                               progress=progress, workers=workers, shard_chars=shard_chars, faults=faults,
                               loss_on=loss_on, model_dir=tokenizer_dir(cfg, run_dir))
        if getattr(data, "names", None):  # several sources (one alone was checked as data.corpus)
            check_corpus_kind(objective, data.format, data.source)
        return data
    corpus = open_data_corpus(cfg)
    kind = corpus_kind(cfg, corpus)
    check_corpus_kind(objective, kind, corpus.description)
    given = given_tokenizer(cfg, vocab_size, run_dir)
    if kind in KINDS:
        try:
            prefs = prepare_chat(cfg, corpus, vocab_size, "assistant", given, tokenizer_dir(cfg, run_dir), log=log,
                                 workers=workers, shard_chars=shard_chars, faults=faults, kind=kind)
        except ChatTemplateError as e:
            raise DataError(str(e)) from None
        return load_preference(prefs, cfg.val_fraction)
    if kind == "chat":
        try:
            chat = prepare_chat(cfg, corpus, vocab_size, loss_on, given, tokenizer_dir(cfg, run_dir), log=log,
                                workers=workers, shard_chars=shard_chars, faults=faults)
        except ChatTemplateError as e:
            raise DataError(str(e)) from None
        return load_chat(chat, cfg.val_fraction)
    prep = prepare(corpus, vocab_size, cfg.tokenizer_sample_mb, log=log, progress=progress, workers=workers,
                   shard_chars=shard_chars, faults=faults, tokenizer=given)
    data = load_tokens(prep, cfg.val_fraction, seq_len)
    data.source = corpus.description  # the same text may have been prepared under other names
    return data


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
