"""sentencepiece BPE that round-trips text exactly (indentation, tabs, newlines).

sentencepiece's defaults normalise text (NFKC), collapse whitespace and drop
newlines. We train with the identity normalisation, keep whitespace, add no
dummy prefix, fall back to bytes for unseen characters, and make "\\n" a
user-defined piece (sentencepiece trains on lines, so it never sees one).
Id 1 is the end-of-document control piece ``<|endoftext|>``: no text ever
encodes to it (typing it in a document gives ordinary pieces), it is put between
documents in the token stream, and it decodes to nothing.
Known limit: U+2581 (the "▁" sentencepiece uses for spaces) decodes to a space.
"""

from __future__ import annotations

import io
import random
import re
from pathlib import Path

import numpy as np

from workbench.errors import WorkbenchError

EOD_PIECE = "<|endoftext|>"
TRAINER_OPTIONS = dict(
    model_type="bpe",
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    add_dummy_prefix=False,
    byte_fallback=True,
    user_defined_symbols=["\n"],
    allow_whitespace_only_pieces=True,
    split_digits=True,
    character_coverage=0.9995,
    max_sentence_length=1 << 15,
    bos_id=-1, eos_id=1, eos_piece=EOD_PIECE, pad_id=-1, unk_id=0,
    hard_vocab_limit=True,
)
# Bump when TRAINER_OPTIONS change so cached tokenizers are retrained (2: the end-of-document piece).
OPTIONS_VERSION = 2


class TokenizerError(WorkbenchError):
    pass


class Tokenizer:
    def __init__(self, model_proto: bytes):
        import sentencepiece as spm
        self.proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)

    @classmethod
    def load(cls, path: Path) -> "Tokenizer":
        try:
            return cls(Path(path).read_bytes())
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"cannot load tokenizer {path}: {e}") from None

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    @property
    def eod_id(self) -> int | None:
        """The end-of-document id, or None for a tokenizer trained before there was one."""
        i = self.sp.eos_id()
        return i if i >= 0 else None

    def byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes each id stands for (a byte piece 1, a control piece 0, "▁" a space), to turn a loss
        per token into bits per byte, which does not depend on the tokenizer."""
        sp = self.sp
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            if sp.is_byte(i):
                out[i] = 1
            elif not (sp.is_control(i) or sp.is_unknown(i)):
                out[i] = len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
        return out

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(ids)

    def save(self, path: Path) -> None:
        Path(path).write_bytes(self.proto)


def train_tokenizer(text: str | list[str], vocab_size: int, sample_mb: float = 8.0, seed: int = 0,
                    num_threads: int = 2) -> Tokenizer:
    """Train BPE on (a sample of) the lines of ``text`` (a string, or lines already sampled)."""
    import sentencepiece as spm

    lines = text.split("\n") if isinstance(text, str) else list(text)
    budget = int(sample_mb * 1_000_000)
    if sum(len(ln) + 1 for ln in lines) > budget:
        rng = random.Random(seed)
        rng.shuffle(lines)
        picked, size = [], 0
        for ln in lines:
            picked.append(ln)
            size += len(ln) + 1
            if size >= budget:
                break
        lines = picked
    lines = [ln for ln in lines if ln]
    if not lines:
        raise TokenizerError("the corpus has no text to train a tokenizer on")
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf,
                                       vocab_size=vocab_size, num_threads=num_threads,
                                       minloglevel=2, **TRAINER_OPTIONS)
    except RuntimeError as e:
        msg = str(e)
        m = re.search(r"value <= (\d+)", msg)
        if m:
            ok = int(m.group(1))
            raise TokenizerError(f"the corpus is too small for model.vocab_size = {vocab_size}: it supports at "
                                 f"most {m.group(1)}; use --set model.vocab_size={ok} or a larger corpus") from None
        m = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", msg)
        if m:
            need = int(m.group(2)) + 1
            ok = (need + 63) // 64 * 64
            raise TokenizerError(f"model.vocab_size = {vocab_size} is too small: this corpus needs at least {need} "
                                 f"pieces (256 byte pieces plus its characters); "
                                 f"use --set model.vocab_size={ok}") from None
        raise TokenizerError(f"tokenizer training failed: {msg.strip().splitlines()[-1]}") from None
    return Tokenizer(buf.getvalue())
