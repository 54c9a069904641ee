"""Chat data for training: conversations prepared once into token ids with a label per token beside them,
cached; then packed into ``model.seq_len`` rows and drawn in resumable batches. No torch.

Preparation (:mod:`workbench.data.chat.chat_prepare`) streams the corpus, renders each conversation through the chat
template and encodes it (:class:`~workbench.data.chat.conversations.ChatEncoder`), and writes

    tokens.bin   the ids of every conversation, one after another (uint16, or uint32 for a large vocabulary)
    labels.bin   one uint8 per token: 0 a prompt token (header, system, user text), 1 a token of an assistant
                 turn (content and end-of-turn token), 2 a token of the last assistant turn of its conversation
    lengths.bin  each conversation's token count (uint32)
    index.json   counts, the template, the tokenizer's ids; written last: its presence marks the preparation
                 complete

in ``$WORKBENCH_CACHE_DIR/data/chat-<key>/``, the key naming the input files (paths, sizes, modification
times), the reading options, the tokenizer and the template. Memory is bounded: tokens are written as they
are made, and only the lengths (4 bytes a conversation) are held. ``train.loss_on`` picks labels at batch
time (assistant: 1 and 2; last_assistant: 2; all: every token), so changing it re-encodes nothing.

Batches (:class:`ChatSampler`): a conversation of ``n`` tokens gives ``n - 1`` (input, target) positions; its
targets that are not trained are ``IGNORE``. With ``data.packing`` whole conversations share a row (best-fit
decreasing, :func:`pack`), each with its own segment id and positions restarting at 0, so attention never
crosses a conversation and RoPE sees each as if alone. Without it each conversation is a row of its own,
padded. A conversation longer than the row is truncated or dropped (``data.overlong``) and counted.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from workbench.config import DataConfig, Preset, chat_role_map
from workbench.data.chat.chat_templates import (
    CHATML_PIECES,
    ChatTemplate,
    ChatTemplateError,
    load_chat_template,
    model_template,
)
from workbench.data.chat.conversations import ChatOptions, detect_format, special_pieces
from workbench.data.corpus.documents import Corpus, open_corpus
from workbench.data.corpus.record_reader import RecordReader
from workbench.data.corpus.sources import CorpusError, Source
from workbench.data.preference.preference_records import detect_kind
from workbench.data.text.prepare import DataError
from workbench.data.text.tokenizer import AnyTokenizer, HFTokenizer, load_tokenizer
from workbench.data.train_data import IGNORE, Batch, EpochOrder
from workbench.errors import WorkbenchError
from workbench.fs import cache_root, read_json, write_json_atomic

if TYPE_CHECKING:
    from workbench.data.chat.chat_prepare import ChatPrepared

PROMPT, TRAINED, LAST = 0, 1, 2


def corpus_kind(cfg: DataConfig, corpus: Corpus) -> str:
    """What a corpus holds: text, chat (conversations), pairs (prompt / chosen / rejected) or kto (prompt /
    completion / label), from the first record of its first JSONL/parquet file; data.format = text forces text,
    chat reads conversations unless the records are preference records."""
    if cfg.format == "text":
        return "text"
    src = next((s for s in corpus.sources if s.kind in ("jsonl", "parquet")), None)
    if src is None:
        return "chat" if cfg.format == "chat" else "text"
    # remembered per inputs (paths, sizes, modification times) and options: a cached start reads no corpus byte
    key = hashlib.sha256(json.dumps([2, corpus.manifest_key(), cfg.messages_field, cfg.chat_roles]).encode())
    seen = cache_root() / "data" / f"f-{key.hexdigest()[:20]}.json"
    known = read_json(seen)
    if known is None:
        known = {"format": sniff_kind(src, chat_options(cfg))}
        try:
            seen.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(seen, known)
        except OSError:
            pass  # the cache is not writable: the preparation says so
    kind = str(known.get("format"))
    return "chat" if kind == "text" and cfg.format == "chat" else kind


def sniff_kind(src: Source, options: ChatOptions) -> str:
    """A JSONL or parquet file's kind from its first record, read alone: pairs, kto, chat or text."""
    try:
        first = RecordReader(skip_bad=True).first(src)
    except CorpusError:  # not records (one JSON array, an unreadable file): the text reader says which
        return "text"
    if not first:
        return "text"
    return detect_kind(first) or ("chat" if detect_format(first, options) is not None else "text")


def corpus_is_chat(cfg: DataConfig, corpus: Corpus) -> bool:
    """data.format: chat or text; auto reads the first record of the first JSONL/parquet file. Preference records
    are not chat (:func:`corpus_kind`)."""
    return corpus_kind(cfg, corpus) == "chat"


_PACKED: dict[str, bool] = {}


def packed_rows(cfg: DataConfig) -> bool:
    """Whether a run of ``cfg`` trains on packed conversations (so its attention takes a block-diagonal
    mask): data.format chat (or auto on a conversation corpus) with data.packing. A corpus that cannot be
    opened counts as text: the run itself says what is wrong with it. Remembered per process."""
    if not cfg.packing or cfg.format == "text":
        return False
    if cfg.format == "chat":
        return True
    key = json.dumps([cfg.corpus, cfg.messages_field, cfg.chat_roles, cfg.text_field])
    if key not in _PACKED:
        try:
            corpus = open_corpus(cfg.corpus, text_field=cfg.text_field, skip_bad=cfg.skip_bad_records,
                                 builtin_mb=cfg.builtin_mb)
            _PACKED[key] = corpus_kind(cfg, corpus) == "chat"
        except (WorkbenchError, OSError, ValueError):
            _PACKED[key] = False
    return _PACKED[key]


def check_loss_on(cfg: DataConfig, corpus: Corpus, asked: str | None) -> None:
    """``train.loss_on``, when the user asked for a value (``asked``), needs conversations: a corpus that
    data.format = auto reads as text would train every token without a word, so it is refused (data.format =
    text is refused with the preset)."""
    if asked is not None and cfg.format == "auto" and not corpus_is_chat(cfg, corpus):
        raise DataError(f"train.loss_on = {asked} applies to chat data, but {corpus.description} was read as text "
                        "(data.format = auto: its first record is not a conversation); give records of messages, "
                        "conversations, instruction/output or prompt/completion, or leave train.loss_on out to "
                        "train every token of the text")


def chat_options(cfg: DataConfig) -> ChatOptions:
    return ChatOptions(cfg.messages_field, chat_role_map(cfg.chat_roles), cfg.skip_bad_records)


def template_for(cfg: DataConfig, tok: AnyTokenizer | None, model_dir: Path | None) -> ChatTemplate:
    """data.chat_template for this tokenizer: ``model`` is the model directory's own template, and for
    workbench's own tokenizer (which reserves the ChatML pieces) the built-in ChatML."""
    if cfg.chat_template == "model" and not isinstance(tok, HFTokenizer):
        if model_dir is not None and model_template(model_dir) is not None:
            return load_chat_template("model", model_dir)
        if tok is None or all(p in special_pieces(tok) for p in CHATML_PIECES):
            return load_chat_template("chatml")
        raise ChatTemplateError(f"the tokenizer {model_dir or ''} has no chat template and does not reserve "
                                f"{' and '.join(CHATML_PIECES)} (it was trained before workbench reserved them); "
                                "give data.chat_template the path of a .jinja template written with its special "
                                "pieces, or train a new tokenizer")
    return load_chat_template(cfg.chat_template, model_dir)


# ----------------------------------------------------------------------------- loading and packing

@dataclass
class Packing:
    """Conversations placed into rows: row r holds ``items[starts[r]:starts[r + 1]]`` (conversation indices)."""
    items: np.ndarray
    starts: np.ndarray
    truncated: int = 0
    dropped: int = 0
    positions: int = 0             # input positions filled (the rest of the rows is padding)
    row_len: int = 0

    @property
    def rows(self) -> int:
        return len(self.starts) - 1

    @property
    def efficiency(self) -> float:
        """Filled positions over all positions of all rows."""
        return self.positions / max(1, self.rows * self.row_len)


def pack(lengths: np.ndarray, seq_len: int, packing: bool = True, overlong: str = "truncate") -> Packing:
    """Rows of ``seq_len`` input positions; a conversation of ``n`` tokens needs ``n - 1`` (one-token
    conversations have no target and are left out). Best-fit decreasing: the longest first, each into the
    fullest row it fits; deterministic (ties by index)."""
    need = np.asarray(lengths, dtype=np.int64) - 1
    over = need > seq_len
    dropped = int(over.sum()) if overlong == "drop" else 0
    truncated = 0 if overlong == "drop" else int(over.sum())
    keep = (need > 0) & ~(over if overlong == "drop" else np.zeros_like(over))
    idx = np.flatnonzero(keep)
    size = np.minimum(need[idx], seq_len)
    if not packing:
        return Packing(idx.astype(np.int64), np.arange(len(idx) + 1, dtype=np.int64), truncated, dropped,
                       int(size.sum()), seq_len)
    order = idx[np.lexsort((idx, -size))]
    rows: list[list[int]] = []
    free: list[int] = []                   # the distinct free space of open rows, sorted
    by_free: dict[int, list[int]] = {}     # free space -> rows with it
    sizes = dict(zip(idx.tolist(), size.tolist()))
    for c in order.tolist():
        s = sizes[c]
        k = bisect.bisect_left(free, s)
        if k < len(free):
            f = free[k]
            r = by_free[f].pop()
            if not by_free[f]:
                del by_free[f]
                free.pop(k)
            rows[r].append(c)
        else:
            f = seq_len
            r = len(rows)
            rows.append([c])
        left = f - s
        if left > 0:
            if left not in by_free:
                bisect.insort(free, left)
                by_free[left] = []
            by_free[left].append(r)
    items = np.asarray([c for row in rows for c in row], dtype=np.int64)
    starts = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in rows], out=starts[1:])
    return Packing(items, starts, truncated, dropped, int(size.sum()), seq_len)


@dataclass
class PreparedConversations:
    """Conversations as their preparation wrote them (``tokens.bin``, ``labels.bin``, ``lengths.bin``),
    memory-mapped: what a chat corpus and a preference corpus share."""
    tokenizer: AnyTokenizer
    tokens: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray            # conversation c is tokens[offsets[c]:offsets[c + 1]]
    n_train: int                   # conversations (chat) or items (preference) [0, n_train) train, the rest val
    template: ChatTemplate
    source: str
    tokenizer_path: Path
    cached: bool
    index: dict = field(default_factory=dict)

    @classmethod
    def opened(cls, prep: ChatPrepared, n_train: int, **more: Any) -> Self:
        """``prep``'s conversations, the first ``n_train`` (conversations or items) to train; ``more``: the
        subclass's own fields."""
        idx = prep.index
        tokens = np.memmap(prep.dir / "tokens.bin", dtype=np.dtype(idx["dtype"]), mode="r", shape=(idx["tokens"],))
        labels = np.memmap(prep.dir / "labels.bin", dtype=np.uint8, mode="r", shape=(idx["tokens"],))
        lengths = np.fromfile(prep.dir / "lengths.bin", dtype=np.uint32)
        offsets = np.zeros(idx["conversations"] + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(load_tokenizer(prep.dir), tokens, labels, offsets, n_train, prep.template, idx["source"],
                   prep.tokenizer_path, prep.cached, idx, **more)


@dataclass
class ChatData(PreparedConversations):
    """A prepared chat corpus (a :class:`~workbench.data.train_data.TrainData`), memory-mapped, its
    conversations split into train and val (the last ones); drawn as rows of whole conversations with the
    targets ``train.loss_on`` does not train masked."""
    format: str = "chat"

    @property
    def documents(self) -> int:
        return len(self.offsets) - 1

    def lengths(self, part: str) -> np.ndarray:
        n = np.diff(self.offsets)
        return n[: self.n_train] if part == "train" else n[self.n_train:]

    def packing(self, part: str, seq_len: int, packing: bool, overlong: str) -> Packing:
        p = pack(self.lengths(part), seq_len, packing, overlong)
        if part == "val":  # indices into the whole corpus
            p.items = p.items + self.n_train
        return p

    def rows(self, part: str, seq_len: int, packing: bool, overlong: str) -> Packing:
        """:meth:`packing`, refused in one line when it holds no row (data.overlong = "drop" dropped every
        conversation of ``part``): the check a start makes before its run directory exists, and the sampler's."""
        p = self.packing(part, seq_len, packing, overlong)
        if p.rows == 0:
            need = self.lengths(part).astype(np.int64) - 1
            shortest = int(need[need > 0].min()) if (need > 0).any() else 1
            raise DataError(f"every {part} conversation ({len(need):,}) is longer than model.seq_len = {seq_len} and "
                            f"data.overlong = \"drop\" dropped them all; raise model.seq_len (the shortest needs "
                            f"{shortest}) or set data.overlong = \"truncate\"")
        return p

    # ------------------------------------------------------------------ as TrainData

    def sampler(self, part: str, p: Preset, seed: int) -> ChatSampler:
        return ChatSampler(self, part, p.model.seq_len, p.train.batch_size, seed, p.train.loss_on, p.data.packing,
                           p.data.overlong)

    def split_tokens(self) -> tuple[int, int]:
        return int(self.lengths("train").sum()), int(self.lengths("val").sum())

    def check(self, p: Preset) -> None:
        """Conversations that fill no row (all dropped as overlong) are bad input too."""
        for part in ("train", "val"):
            self.rows(part, p.model.seq_len, p.data.packing, p.data.overlong)

    def start_lines(self, sampler: ChatSampler, p: Preset) -> list[str]:
        """Conversations, what is trained, how rows are filled."""
        idx, rows = self.index, sampler.rows
        trained = trained_count(idx, p.train.loss_on)
        over = (f", {rows.truncated:,} truncated to model.seq_len" if rows.truncated else "") + \
            (f", {rows.dropped:,} longer than model.seq_len dropped" if rows.dropped else "")
        how = "packed" if p.data.packing else "one a row"
        return [f"chat: {self.documents:,} conversations ({self.n_train:,} train), template {self.template.source}; "
                f"loss on {p.train.loss_on} ({trained / max(1, idx['tokens']):.0%} of tokens); {how} into "
                f"{rows.rows:,} rows of {p.model.seq_len}, {rows.efficiency:.0%} filled{over}"]

    def start_facts(self, sampler: ChatSampler, p: Preset) -> dict[str, Any]:
        """What the run doctor needs to judge a chat corpus (the start event's ``chat``)."""
        idx, rows, lengths = self.index, sampler.rows, self.lengths("train")
        return {"chat": {"conversations": int(len(lengths)),
                         "trained_fraction": round(trained_count(idx, p.train.loss_on) / max(1, idx["tokens"]), 4),
                         "loss_on": p.train.loss_on, "truncated": rows.truncated, "dropped": rows.dropped,
                         "row_fill": round(rows.efficiency, 4), "packing": p.data.packing,
                         "p95_tokens": int(np.percentile(lengths, 95)) if len(lengths) else 0}}


def load_chat(prep: ChatPrepared, val_fraction: float) -> ChatData:
    idx = prep.index
    n = idx["conversations"]
    if n < 2:
        raise DataError(f"the chat corpus has {n} conversation(s); training and validation need at least 2 "
                        "(one of each); add conversations")
    n_val = min(n - 1, max(1, round(n * val_fraction)))
    return ChatData.opened(prep, n - n_val)


def trained_labels(loss_on: str) -> np.ndarray:
    """A lookup from label (0, 1, 2) to whether ``train.loss_on`` trains it."""
    return np.array({"assistant": [0, 1, 1], "last_assistant": [0, 0, 1], "all": [1, 1, 1]}[loss_on], dtype=bool)


def trained_count(index: dict, loss_on: str) -> int:
    """The tokens of a prepared chat corpus that ``train.loss_on`` trains (from its index.json's counts)."""
    return {"assistant": index["trained"], "last_assistant": index["last_trained"], "all": index["tokens"]}[loss_on]


def conversation_pieces(data: PreparedConversations, c: int, loss_on: str) -> list[tuple[str, bool]]:
    """Conversation ``c`` as the trainer sees it: (text, trained) runs of its tokens, special pieces written
    out (``<|im_end|>``), trained meaning the token is a target of the loss under ``loss_on`` (the first token
    never is: nothing predicts it)."""
    lo, hi = int(data.offsets[c]), int(data.offsets[c + 1])
    ids = np.asarray(data.tokens[lo:hi], dtype=np.int64).tolist()
    trained = trained_labels(loss_on)[np.asarray(data.labels[lo:hi])].tolist()
    trained[0] = False
    names = {i: piece for piece, i in special_pieces(data.tokenizer).items()}
    runs: list[tuple[str, bool]] = []
    j = 0
    while j < len(ids):
        k = j
        while k < len(ids) and trained[k] == trained[j] and (ids[k] in names) == (ids[j] in names):
            k += 1
        text = "".join(names[i] for i in ids[j:k]) if ids[j] in names else data.tokenizer.decode(ids[j:k])
        if runs and runs[-1][1] == trained[j]:
            runs[-1] = (runs[-1][0] + text, trained[j])
        else:
            runs.append((text, trained[j]))
        j = k
    return runs


def fill_row(d: ChatData, p: Packing, trains: np.ndarray, r: int, row: tuple[np.ndarray, ...]) -> None:
    """Row ``r`` of ``d``'s packing ``p`` written into ``row`` (inputs, targets, positions, segments; each
    [seq_len], the targets IGNORE and the segments -1 where nothing is): its conversations one after another, the
    targets ``trains`` (:func:`trained_labels`) does not train masked."""
    x, y, pos, seg = row
    T, at = len(x), 0
    for k, c in enumerate(p.items[p.starts[r]:p.starts[r + 1]].tolist()):
        lo = int(d.offsets[c])
        n = min(int(d.offsets[c + 1]) - lo - 1, T)
        ids = np.asarray(d.tokens[lo:lo + n + 1], dtype=np.int64)
        trained = trains[np.asarray(d.labels[lo + 1:lo + n + 1])]
        x[at:at + n] = ids[:-1]
        y[at:at + n] = np.where(trained, ids[1:], IGNORE)
        pos[at:at + n] = np.arange(n)
        seg[at:at + n] = k
        at += n


class ChatSampler:
    """Batches of packed rows (inputs, masked targets, positions, segments; each [batch, seq_len]). Rows are
    drawn in a shuffled order, a new one each epoch (from the seed and the epoch number), so the state is two
    integers.

    ``segments`` is None without packing (one conversation a row: plain causal attention suffices)."""

    def __init__(self, data: ChatData, part: str, seq_len: int, batch_size: int, seed: int, loss_on: str,
                 packing: bool = True, overlong: str = "truncate"):
        self.data, self.seq_len, self.batch_size, self.seed = data, seq_len, batch_size, seed
        self.packed = packing
        self.rows = data.rows(part, seq_len, packing, overlong)
        self.trains = trained_labels(loss_on)
        self.order = EpochOrder(self.rows.rows, seed)

    def next_batch(self) -> Batch[np.ndarray]:
        T, d, p = self.seq_len, self.data, self.rows
        B = self.batch_size
        x = np.zeros((B, T), dtype=np.int64)
        y = np.full((B, T), IGNORE, dtype=np.int64)
        pos = np.zeros((B, T), dtype=np.int64)
        seg = np.full((B, T), -1, dtype=np.int64)
        for b, r in enumerate(self.order.take(B)):
            fill_row(d, p, self.trains, r, (x[b], y[b], pos[b], seg[b]))
        return Batch(x, y, pos, seg if self.packed else None, masked=True)

    def state(self) -> dict:
        return {"kind": "chat", **self.order.state()}

    def set_state(self, st: dict) -> None:
        if st.get("kind") != "chat":
            raise DataError("the checkpoint was trained on text, not conversations; a run keeps its data.format")
        self.order.set_state(st)


__all__ = ["IGNORE", "LAST", "PROMPT", "TRAINED", "ChatData", "ChatSampler", "Packing", "chat_options",
           "conversation_pieces", "corpus_is_chat", "corpus_kind", "fill_row", "load_chat", "pack", "sniff_kind",
           "template_for", "trained_count", "trained_labels"]
