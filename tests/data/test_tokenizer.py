"""Tokenizer round trip, caching, and the corpus/tokenizer error messages."""

from __future__ import annotations

import pytest

from workbench.config import DataConfig
from workbench.data.corpus.documents import CorpusError, Stats, open_corpus, warnings_of
from workbench.data.preset_data import prepare_data
from workbench.data.text.tokenizer import TokenizerError, train_tokenizer
from workbench.data.text.tokens import DataError, WindowSampler


def corpus_text(spec: str, builtin_mb: float = 0.3) -> str:
    """Every document of a corpus, read by the streaming reader and joined."""
    return "".join(text for text, _end in open_corpus(spec, builtin_mb=builtin_mb).pieces())

SAMPLE = (
    "def f(x):\n"
    "\tif x:\n"
    "        return  'héllo wörld — 世界 🤖'\n"
    "\n\n\n"
    "    # trailing spaces   \n"
    "a\tb\t\tc\r\n"
    "Ünïcödé ∑ λ → ∞  \n"
)


@pytest.fixture(scope="module")
def tok():
    text = corpus_text("builtin")
    return train_tokenizer(text, 512, sample_mb=0.3)


def test_round_trip_is_exact(tok):
    ids = tok.encode(SAMPLE)
    assert tok.decode(ids) == SAMPLE
    # Characters never seen in training go through byte fallback, not <unk>.
    assert 0 not in ids


def test_round_trip_of_builtin_corpus_slice(tok):
    text = corpus_text("builtin")[:20000]
    assert tok.decode(tok.encode(text)) == text


def test_vocab_too_large_says_what_would_work():
    with pytest.raises(TokenizerError, match=r"too small for model.vocab_size = 50000: it supports at most \d+; "
                                             r"use --set model.vocab_size=\d+"):
        train_tokenizer("just a few words here\nand here\n" * 20, 50000)


def test_prepare_data_caches_tokenizer_and_tokens(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(("The quick brown fox jumps over the lazy dog.\n" * 400) + SAMPLE)
    cfg = DataConfig(corpus=str(corpus))
    first = prepare_data(cfg, 400, 16, log=lambda m: None)
    second = prepare_data(cfg, 400, 16, log=lambda m: None)
    assert not first.cached and second.cached
    assert list(first.tokens[:50]) == list(second.tokens[:50])
    assert first.tokenizer.decode([int(t) for t in first.tokens]) == corpus.read_bytes().decode()


def test_sampler_state_round_trip():
    import numpy as np
    tokens = np.arange(1000, dtype=np.uint16)
    a = WindowSampler(tokens, 16, 4, seed=7)
    for _ in range(5):
        a.next_batch()
    st = a.state()
    expected = [a.next_batch() for _ in range(3)]
    b = WindowSampler(tokens, 16, 4, seed=999)
    b.set_state(st)
    for one, two in zip(expected, (b.next_batch() for _ in range(3))):
        assert (one.inputs == two.inputs).all() and (one.targets == two.targets).all()
        assert (one.targets[:, :-1] == one.inputs[:, 1:]).all()
        assert one.positions is None and one.segments is None and not one.masked  # text: every target trained


def test_corpus_errors(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        open_corpus(str(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(CorpusError, match="is empty"):
        open_corpus(str(tmp_path / "empty.txt"))
    bins = tmp_path / "bins"
    bins.mkdir()
    (bins / "a.bin").write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(CorpusError, match=r"has no text files \(1 binary, 0 empty\)"):
        list(open_corpus(str(bins)).pieces())
    (bins / "b.txt").write_bytes("ok text\n".encode() + b"\xff\xfe bad bytes\n")
    c, stats = open_corpus(str(bins)), Stats()
    assert [end for _text, end in c.pieces(stats)] == [True]  # one document: the one text file
    warnings = warnings_of(c, stats)
    assert any("not UTF-8 were replaced" in w for w in warnings)
    assert any("skipped 1 binary file" in w for w in warnings)


def test_vocab_below_byte_fallback_minimum():
    with pytest.raises(TokenizerError, match=r"model.vocab_size = 100 is too small: this corpus needs at least "
                                             r"\d+ pieces .*; use --set model.vocab_size=\d+"):
        train_tokenizer("some text\n" * 50, 100)


def test_corpus_too_short_for_one_sequence(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("tiny corpus\n" * 30)
    with pytest.raises(DataError, match=r"the corpus is too short: \d+ tokens, but one training and one "
                                        r"validation sequence of model.seq_len = 256 need at least 514"):
        prepare_data(DataConfig(corpus=str(short)), 272, 256, log=lambda m: None)
