"""Preference data for training (the third kind of :class:`~workbench.data.train_data.TrainData`): a prepared preference
corpus (:mod:`workbench.data.preference.preference_records` read it, :mod:`workbench.data.chat.chat_prepare` rendered
and encoded it, cached, with a tag per conversation in ``tags.bin``), split by items, drawn in resumable batches. No
torch.

An item is a pair (conversations ``2i``, chosen, and ``2i + 1``, rejected) or a labelled answer (KTO:
conversation ``i``, tagged 1 good or 0 bad). ``train.batch_size`` counts items. One answer a row, padded (no
packing: the two answers of a pair are scored side by side); its targets are the last assistant turn's tokens
(the answer and its end-of-turn token), every other target ``IGNORE``. A conversation longer than
``model.seq_len`` is cut to it (``data.overlong = "truncate"``: kept while its answer still has a token in the
row) or dropped; a pair is dropped whole.

:class:`PairBatch` holds the chosen rows as ``inputs``/``targets`` and the rejected rows of the same pairs beside
them, so a rank's slice keeps its pairs whole; :class:`AnswerBatch` holds KTO's answers, their labels and the
rows of its KL estimate (each prompt with the previous item's answer, as TRL's KTO shifts them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic

import numpy as np

from workbench.data.chat.chat_data import LAST, PreparedConversations
from workbench.data.preference.preference_records import DESCRIBE, PAIRS, check_corpus_kind
from workbench.data.text.prepare import DataError
from workbench.data.train_data import IGNORE, A, Batch, EpochOrder, array

if TYPE_CHECKING:
    from workbench.config import Preset
    from workbench.data.chat.chat_prepare import ChatPrepared


@dataclass(frozen=True)
class PairBatch(Batch[A], Generic[A]):
    """Pairs: the chosen answers' rows (``inputs``, ``targets``) and the rejected answers' rows of the same pairs;
    with a precomputed reference, its summed log-probs of both answers [B] (float32)."""
    rejected_inputs: A | None = array()
    rejected_targets: A | None = array()
    ref_chosen: A | None = array()
    ref_rejected: A | None = array()

    def loss_units(self) -> Any:
        return len(self.inputs)  # type: ignore[arg-type]  # an array of rows


@dataclass(frozen=True)
class AnswerBatch(Batch[A], Generic[A]):
    """KTO: answers (``inputs``, ``targets``), whether each is good (``desirable`` [B], 1 or 0), and the rows of
    the KL estimate: each prompt with the previous item's answer."""
    desirable: A | None = array()
    kl_inputs: A | None = array()
    kl_targets: A | None = array()

    def loss_units(self) -> Any:
        return len(self.inputs)  # type: ignore[arg-type]


@dataclass
class PreferenceData(PreparedConversations):
    """A prepared preference corpus (a :class:`~workbench.data.train_data.TrainData`), memory-mapped; its
    ``n_train`` counts items."""
    tags: np.ndarray = field(kw_only=True)  # per conversation: chosen 1 / rejected 0; KTO: good 1 / bad 0
    kind: str = field(kw_only=True)         # pairs | kto
    format: str = ""               # the kind, as TrainData names it (set from kind)
    dir: Path | None = None        # the prepared data's cache directory (a precomputed reference is kept there)
    reference: np.ndarray | None = None  # a precomputed reference: each conversation's log-prob (memory-mapped)

    def __post_init__(self) -> None:
        self.format = self.kind

    @property
    def per_item(self) -> int:
        return 2 if self.kind == PAIRS else 1

    @property
    def items(self) -> int:
        return (len(self.offsets) - 1) // self.per_item

    def part_items(self, part: str) -> np.ndarray:
        return np.arange(self.n_train) if part == "train" else np.arange(self.n_train, self.items)

    def conversations(self, item: int) -> list[int]:
        return [item * self.per_item + k for k in range(self.per_item)]

    def answer_start(self, c: int) -> int:
        """Where conversation ``c``'s trained answer begins (its first token of the last assistant turn)."""
        lo, hi = int(self.offsets[c]), int(self.offsets[c + 1])
        return int(np.argmax(np.asarray(self.labels[lo:hi]) == LAST))

    def rows(self, convs: list[int], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Conversations ``convs``, one a row of ``seq_len``, as inputs and masked targets (as a batch has them)."""
        return answer_rows([self.conversation(c, seq_len) for c in convs], seq_len)

    def conversation(self, c: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Conversation ``c``'s first ``seq_len + 1`` tokens and which of them are trained."""
        lo, hi = int(self.offsets[c]), int(min(self.offsets[c + 1], self.offsets[c] + seq_len + 1))
        return np.asarray(self.tokens[lo:hi], dtype=np.int64), np.asarray(self.labels[lo:hi]) == LAST

    def usable(self, part: str, seq_len: int, overlong: str) -> tuple[np.ndarray, int, int]:
        """The items of ``part`` a row of ``seq_len`` can train on, and how many were truncated and dropped: a
        conversation of ``n`` tokens fills ``n - 1`` positions; one longer is cut (kept while its answer still has
        a target in the row) or, with ``overlong = "drop"``, dropped; a pair goes whole."""
        items = self.part_items(part)
        if not len(items):
            return items, 0, 0
        n = np.diff(self.offsets).astype(np.int64)
        convs = (items[:, None] * self.per_item + np.arange(self.per_item)[None, :])
        over = (n[convs] - 1) > seq_len                       # [items, per_item]
        keep = np.logical_not(np.any(over, axis=1))
        truncated = 0
        if overlong == "truncate":
            for r in np.flatnonzero(~keep):
                if all(not over[r, k] or self.answer_start(int(convs[r, k])) <= seq_len for k in range(self.per_item)):
                    keep[r] = True
                    truncated += 1
        return items[keep], truncated, int((~keep).sum())

    # ------------------------------------------------------------------ as TrainData

    def sampler(self, part: str, p: Preset, seed: int) -> PreferenceSampler:
        return PreferenceSampler(self, part, p.model.seq_len, p.train.batch_size, seed, p.data.overlong)

    def split_tokens(self) -> tuple[int, int]:
        split = int(self.offsets[self.n_train * self.per_item])
        return split, int(self.offsets[-1]) - split

    def check(self, p: Preset) -> None:
        """The objective trains on this kind, and each part keeps an item at ``model.seq_len``."""
        check_corpus_kind(p.train.objective, self.kind, self.source)
        for part in ("train", "val"):
            kept, _t, dropped = self.usable(part, p.model.seq_len, p.data.overlong)
            if not len(kept):
                raise DataError(f"every {part} item of {self.source} ({dropped:,}) is longer than model.seq_len = "
                                f"{p.model.seq_len} with no answer token left in a row; raise model.seq_len or "
                                "shorten the prompts")

    def start_lines(self, sampler: PreferenceSampler, p: Preset) -> list[str]:
        what = "pairs" if self.kind == PAIRS else "labelled answers"
        good = "" if self.kind == PAIRS else f" ({int(self.tags.sum()):,} good)"
        over = (f", {sampler.truncated:,} cut to model.seq_len" if sampler.truncated else "") + \
            (f", {sampler.dropped:,} longer than model.seq_len dropped" if sampler.dropped else "")
        trained = self.index.get("last_trained", 0) / max(1, self.index.get("tokens", 1))
        return [f"preference: {self.items:,} {what}{good} ({self.n_train:,} train), template {self.template.source}; "
                f"loss on the answers ({trained:.0%} of tokens); one answer a row of {p.model.seq_len}{over}"]

    def start_facts(self, sampler: PreferenceSampler, p: Preset) -> dict[str, Any]:
        return {"preference": {"kind": self.kind, "items": self.items, "train_items": self.n_train,
                               "truncated": sampler.truncated, "dropped": sampler.dropped,
                               "objective": p.train.objective}}


def load_preference(prep: ChatPrepared, val_fraction: float) -> PreferenceData:
    idx = prep.index
    kind = idx["format"]
    n = idx["conversations"]
    per = 2 if kind == PAIRS else 1
    items = n // per
    if items < 2:
        raise DataError(f"the corpus has {items} {DESCRIBE[kind]} item(s); training and validation need at least 2 "
                        "(one of each); add records")
    n_val = min(items - 1, max(1, round(items * val_fraction)))
    return PreferenceData.opened(prep, items - n_val, tags=np.fromfile(prep.dir / "tags.bin", dtype=np.uint8),
                                 kind=kind, dir=prep.dir)


def answer_rows(pieces: list[tuple[np.ndarray, np.ndarray]], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, trained) of each row as inputs and masked targets, cut to ``seq_len`` and padded."""
    T = seq_len
    x = np.zeros((len(pieces), T), dtype=np.int64)
    y = np.full((len(pieces), T), IGNORE, dtype=np.int64)
    for b, (ids, trained) in enumerate(pieces):
        n = min(len(ids) - 1, T)
        x[b, :n] = ids[:n]
        y[b, :n] = np.where(trained[1:n + 1], ids[1:n + 1], IGNORE)
    return x, y


class PreferenceSampler:
    """Batches of items drawn in a shuffled order, a new one each epoch (an :class:`EpochOrder`): the
    state is two integers."""

    def __init__(self, data: PreferenceData, part: str, seq_len: int, batch_size: int, seed: int,
                 overlong: str = "truncate"):
        self.data, self.seq_len, self.batch_size, self.seed = data, seq_len, batch_size, seed
        self.items, self.truncated, self.dropped = data.usable(part, seq_len, overlong)
        if not len(self.items):
            raise DataError(f"no {part} item of {data.source} fits model.seq_len = {seq_len}; raise it")
        self.order = EpochOrder(len(self.items), seed)

    def next_items(self) -> list[int]:
        return self.items[self.order.take(self.batch_size)].tolist()

    def next_batch(self) -> Batch[np.ndarray]:
        d, items, T = self.data, self.next_items(), self.seq_len
        if d.kind == PAIRS:
            chosen, rejected = [2 * i for i in items], [2 * i + 1 for i in items]
            cx, cy = d.rows(chosen, T)
            rx, ry = d.rows(rejected, T)
            if d.reference is None:
                return PairBatch(cx, cy, rejected_inputs=rx, rejected_targets=ry)
            return PairBatch(cx, cy, rejected_inputs=rx, rejected_targets=ry,
                             ref_chosen=np.asarray(d.reference[chosen], dtype=np.float32),
                             ref_rejected=np.asarray(d.reference[rejected], dtype=np.float32))
        x, y = d.rows(items, T)
        kl = []
        for k, i in enumerate(items):  # this prompt with the previous item's answer (TRL's KL completions)
            other = items[k - 1]
            lo, a = int(d.offsets[i]), d.answer_start(i)
            olo, ohi = int(d.offsets[other]), int(d.offsets[other + 1])
            oa = d.answer_start(other)
            ids = np.concatenate([np.asarray(d.tokens[lo:lo + a]), np.asarray(d.tokens[olo + oa:ohi])]).astype(np.int64)
            trained = np.concatenate([np.zeros(a, dtype=bool), np.asarray(d.labels[olo + oa:ohi]) == LAST])
            kl.append((ids[:self.seq_len + 1], trained[:self.seq_len + 1]))
        kx, ky = answer_rows(kl, T)
        good = np.asarray(d.tags[items], dtype=np.int64)
        return AnswerBatch(x, y, desirable=good, kl_inputs=kx, kl_targets=ky)

    def state(self) -> dict:
        return {"kind": self.data.kind, **self.order.state()}

    def set_state(self, st: dict) -> None:
        if st.get("kind") != self.data.kind:
            raise DataError(f"the checkpoint was trained on {st.get('kind', 'text')} data, not {self.data.kind}; a run "
                            "keeps its kind of data")
        self.order.set_state(st)


__all__ = ["AnswerBatch", "PairBatch", "PreferenceData", "PreferenceSampler", "answer_rows", "load_preference"]
