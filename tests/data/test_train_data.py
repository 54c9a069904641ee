"""One interface for every kind of training data (workbench.data.train_data): text and conversations both give
the trainer a sampler, a split, a template (or none) and start facts; a batch says what it holds (its arrays,
whether its targets are masked), so nothing downstream asks which kind it is. No torch."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from tests.support.chat import conversations, write_jsonl
from workbench.config import resolve_preset
from workbench.data.chat.chat_data import ChatData
from workbench.data.preset_data import prepare_data
from workbench.data.text.tokens import TokenData
from workbench.data.train_data import IGNORE, Batch, TrainData, array, step_targets


def test_a_batch_maps_its_arrays_and_keeps_what_it_says():
    x, y = np.arange(12).reshape(3, 4), np.arange(1, 13).reshape(3, 4)
    b = Batch(x, y)
    rows = b.map(lambda a: a[1:2])
    assert (rows.inputs == x[1:2]).all() and (rows.targets == y[1:2]).all()
    assert rows.positions is None and rows.segments is None and not rows.masked  # None stays None
    chat = Batch(x, np.where(y % 2 == 0, y, IGNORE), np.zeros_like(x), np.zeros_like(x), masked=True)
    assert chat.map(lambda a: a * 1).masked and chat.trained() == 6 and b.trained() == 12


def test_a_third_kind_of_batch_adds_arrays_that_move_with_the_rest():
    """The seam preference pairs join by: a Batch subclass with its own array fields; map reaches them."""
    @dataclasses.dataclass(frozen=True)
    class PairBatch(Batch):
        chosen_rows: np.ndarray | None = array()
        label: str = "pairs"    # not an array: left alone

    b = PairBatch(np.ones((4, 2)), np.ones((4, 2)), chosen_rows=np.arange(4), masked=True)
    half = b.map(lambda a: a[:2])
    assert isinstance(half, PairBatch) and half.label == "pairs" and (half.chosen_rows == [0, 1]).all()


def test_a_steps_trained_targets_are_counted_only_for_masked_batches():
    y = np.array([[1, IGNORE, 2], [IGNORE, IGNORE, 3]])
    x = np.zeros_like(y)
    assert step_targets([Batch(x, y), Batch(x, y)], world=2) is None         # text: each micro-batch its own mean
    assert step_targets([Batch(x, y, masked=True)] * 2, world=2) == 3.0     # 6 trained targets over 2 ranks
    none = np.full_like(y, IGNORE)
    assert step_targets([Batch(x, none, masked=True)], world=1) == 1.0      # at least one


def _members(cls) -> set[str]:
    return {n for n in [*cls.__annotations__, *vars(cls)] if not n.startswith("_")}


@pytest.mark.parametrize("kind", [TokenData, ChatData])
def test_both_kinds_have_every_member_of_the_interface(kind):
    fields = {f.name for f in dataclasses.fields(kind)}
    for name in _members(TrainData):
        assert name in fields or hasattr(kind, name), f"{kind.__name__} lacks {name}"
        want = getattr(TrainData, name, None)
        if inspect.isfunction(want):
            assert list(inspect.signature(getattr(kind, name)).parameters) == \
                list(inspect.signature(want).parameters), name


def test_text_and_chat_answer_the_same_questions(tmp_path):
    """A real text corpus and a real chat corpus, prepared: the trainer's questions, asked of each alike."""
    chat_file = write_jsonl(tmp_path / "chat.jsonl", conversations(120, seed=2))
    sets = ["model.seq_len=32", "model.vocab_size=400", "train.batch_size=4"]
    text_p = resolve_preset("cpu-small", [*sets, "data.builtin_mb=0.3", "data.tokenizer_sample_mb=0.3"])
    chat_p = resolve_preset("cpu-small", sets, {"data": {"corpus": str(chat_file)}})
    seen = {}
    for name, p in (("text", text_p), ("chat", chat_p)):
        data: TrainData = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: None,
                                       loss_on=p.train.loss_on)
        data.check(p)
        sampler = data.sampler("train", p, seed=5)
        state = sampler.state()
        b = sampler.next_batch()
        sampler.set_state(state)
        again = sampler.next_batch()
        assert isinstance(b, Batch) and b.inputs.shape == (4, 32) and (b.targets == again.targets).all()
        train, val = data.split_tokens()
        assert train > val > 0
        seen[name] = (data.format, data.template is None, b.masked, b.segments is not None,
                      list(data.start_facts(sampler, p)), len(data.start_lines(sampler, p)))
    assert seen["text"] == ("text", True, False, False, [], 0)
    assert seen["chat"] == ("chat", False, True, True, ["chat"], 1)
