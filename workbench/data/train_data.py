"""What the engine trains on, whatever its kind: the :class:`TrainData` interface, the :class:`Sampler` it
hands out and the :class:`Batch` one draw gives. No torch.

Two kinds implement it: text (:class:`~workbench.data.text.tokens.TokenData`: random windows of one token stream,
every target trained) and conversations (:class:`~workbench.data.chat.chat_data.ChatData`: rows of whole
conversations, packed or one a row, their prompt tokens masked). The trainer, its evaluation and the commands
ask the data (its sampler, its split, its template, its start facts) and read what a batch holds; none of them
asks which kind it is.

A third kind joins the same way: preference data (:class:`~workbench.data.preference.preference_data.PreferenceData`:
pairs of a chosen and a rejected answer, or KTO's labelled answers) is a ``TrainData`` whose sampler yields subclasses
of :class:`Batch` with their own arrays (declared with :func:`array`, so they move to the device and are sliced per rank
with the rest), and whose start facts say what the doctor should know of it; the loss of such a batch is the objective's
(``workbench.train.batches.batch_loss``), not the loop's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, Protocol, Sequence, TypeVar, cast

import numpy as np

if TYPE_CHECKING:
    from workbench.config import Preset
    from workbench.data.chat.chat_templates import ChatTemplate
    from workbench.data.text.tokenizer import AnyTokenizer

IGNORE = -100              # a target the loss skips (torch's cross_entropy ignore_index)

A = TypeVar("A")
B = TypeVar("B")


_ARRAY = {"array": True}


def array() -> Any:
    """An optional field of a :class:`Batch` that holds an array (a row per sequence): :meth:`Batch.map` applies
    to it."""
    return field(default=None, metadata=_ARRAY)


@dataclass(frozen=True)
class Batch(Generic[A]):
    """One draw of a sampler: ``[batch, seq_len]`` arrays (numpy as drawn, tensors on the device).

    ``masked``: the targets hold ``IGNORE`` where the loss skips them (conversations' prompt tokens and the
    padding), so one optimizer step's loss is the mean over its trained targets (:func:`step_targets`);
    unmasked (text), every target counts and each micro-batch's loss is its own mean."""
    inputs: A = field(metadata=_ARRAY)
    targets: A = field(metadata=_ARRAY)   # the next token of each input (IGNORE: not trained)
    positions: A | None = array()   # each token's position: restarting at 0 in each conversation (None: 0..T-1)
    segments: A | None = array()    # which conversation of a packed row a position is in (None: one a row)
    masked: bool = False

    def map(self, fn: Callable[[A], B]) -> "Batch[B]":
        """The same batch with ``fn`` applied to each of its arrays (None stays None): a rank's rows, the
        device's tensors."""
        # the arrays change type (numpy to tensors), which dataclasses.replace's signature cannot say
        changed = {f.name: fn(v) for f in dataclasses.fields(self)
                   if f.metadata.get("array") and (v := getattr(self, f.name)) is not None}
        return cast("Batch[B]", dataclasses.replace(self, **changed))  # type: ignore[arg-type]

    def loss_units(self) -> Any:
        """What an eval's loss is averaged over: its trained targets (a count, as numpy or torch gives it); a
        preference batch's pairs or answers."""
        return (self.targets != IGNORE).sum()  # type: ignore[attr-defined]  # an array, numpy or torch

    def trained(self) -> int:
        """How many of its targets the loss is over."""
        y = np.asarray(self.targets)
        return int(np.count_nonzero(y != IGNORE)) if self.masked else int(y.size)


def step_targets(batches: Sequence[Batch], world: int) -> float | None:
    """The trained targets of one optimizer step's global micro-batches, per rank, for masked batches (DDP
    averages the ranks' gradients, so each rank divides its sum by this to make the step's loss the mean over
    them all); at least one. None for unmasked ones: each micro-batch's loss is its mean."""
    if not batches[0].masked:
        return None
    return max(1, sum(b.trained() for b in batches)) / world


class Sampler(Protocol):
    """Batches drawn from a generator whose state is saved: after ``set_state(state())`` the next batches
    equal those the original would have drawn."""

    def next_batch(self) -> Batch: ...

    def state(self) -> dict: ...

    def set_state(self, st: dict) -> None: ...


class EpochOrder:
    """The indices ``0 .. n-1`` drawn in a shuffled order, a new one each epoch (from the seed and the epoch
    number), so what a sampler of whole items (conversations' rows, preference items) saves is two integers."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self.epoch, self.pos = 0, 0
        self.order = self._shuffle()

    def _shuffle(self) -> np.ndarray:
        return np.random.Generator(np.random.PCG64([self.seed, self.epoch])).permutation(self.n)

    def take(self, k: int) -> list[int]:
        """The next ``k`` indices, running on into the next epoch's order where this one ends."""
        out: list[int] = []
        while len(out) < k:
            if self.pos == len(self.order):
                self.epoch, self.pos = self.epoch + 1, 0
                self.order = self._shuffle()
            take = self.order[self.pos:self.pos + k - len(out)]
            out += take.tolist()
            self.pos += len(take)
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def set_state(self, st: dict) -> None:
        self.epoch, self.pos = int(st["epoch"]), int(st["pos"])
        self.order = self._shuffle()


class TrainData(Protocol):
    """A prepared corpus a run trains on, of any kind (``format``: text, chat)."""
    format: str
    tokenizer: AnyTokenizer
    source: str                     # what the corpus is, as the start line says it
    tokenizer_path: Path
    cached: bool                    # prepared before (nothing was read now)
    n_train: int                    # where the train part ends (in its own unit: tokens, conversations)

    @property
    def template(self) -> ChatTemplate | None:
        """The chat template it was rendered through (None: plain text)."""
        ...

    def sampler(self, part: str, p: Preset, seed: int) -> Sampler:
        """The batches of ``part`` (train or val) a run of ``p`` draws, from ``seed``."""
        ...

    def split_tokens(self) -> tuple[int, int]:
        """Tokens of the train and of the val part."""
        ...

    def check(self, p: Preset) -> None:
        """Refuse, in one line, data a run of ``p`` cannot train on (before its run directory exists)."""
        ...

    def start_lines(self, sampler: Any, p: Preset) -> list[str]:
        """What the start log says of it beyond the start line (its train ``sampler`` drawn for ``p``)."""
        ...

    def start_facts(self, sampler: Any, p: Preset) -> dict[str, Any]:
        """What the start event keeps of it for the run doctor: {its kind: facts}, or nothing."""
        ...


__all__ = ["A", "IGNORE", "Batch", "EpochOrder", "Sampler", "TrainData", "array", "step_targets"]
