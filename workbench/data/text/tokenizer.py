"""The tokenizer: one small interface with two backends.

Every tokenizer has ``vocab_size``, ``eod_id`` (the end-of-document id the data pipeline appends after
each document), ``encode`` / ``decode``, ``byte_lengths()`` (UTF-8 bytes per id, for bits per byte),
``save(directory)`` (its files, under their usual names), ``spec()`` (its files' bytes, to rebuild it in
an encoding worker) and ``digest()`` (what the corpus cache is keyed by). ``load_tokenizer`` finds the
one a run directory, a model directory or a file holds:

* :class:`Tokenizer`: workbench's own sentencepiece BPE, trained on a corpus (``tokenizer.model``).
* :class:`HFTokenizer`: a Hugging Face ``tokenizer.json`` through the ``tokenizers`` library (an
  imported model's own; ``tokenizer_config.json`` beside it names its end-of-sequence token).

sentencepiece BPE that round-trips text exactly (indentation, tabs, newlines).

sentencepiece's defaults normalise text (NFKC), collapse whitespace and drop
newlines. We train with the identity normalisation, keep whitespace, add no
dummy prefix, fall back to bytes for unseen characters, and make "\\n" a
user-defined piece (sentencepiece trains on lines, so it never sees one).
Id 1 is the end-of-document control piece ``<|endoftext|>``: no text ever
encodes to it (typing it in a document gives ordinary pieces), it is put between
documents in the token stream, and it decodes to nothing. Ids 2 and 3 are the
ChatML pieces ``<|im_start|>`` and ``<|im_end|>``, reserved the same way, so a model
trained from scratch can be chat-tuned with the built-in template
(:mod:`workbench.data.chat.chat_templates`).
Known limit: U+2581 (the "▁" sentencepiece uses for spaces) decodes to a space.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np

from workbench.data.chat.chat_templates import CHATML_PIECES
from workbench.data.corpus.record_reader import parse_json
from workbench.errors import WorkbenchError
from workbench.fs import write_atomic

EOD_PIECE = "<|endoftext|>"
TRAINER_OPTIONS: dict[str, Any] = dict(
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
    control_symbols=list(CHATML_PIECES),
    hard_vocab_limit=True,
)
# Bump when TRAINER_OPTIONS change so cached tokenizers are retrained (2: the end-of-document piece;
# 3: the ChatML pieces).
OPTIONS_VERSION = 3


class TokenizerError(WorkbenchError):
    pass


class CorpusTooSmall(TokenizerError):
    """The corpus cannot fit a tokenizer of the vocabulary asked for; ``supported``: the most it can."""

    def __init__(self, message: str, supported: int):
        super().__init__(message)
        self.supported = supported


# Encoding workers are forked; the tokenizers library's own thread pool does not survive a fork.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _sentencepiece() -> Any:
    """The sentencepiece module."""
    import sentencepiece  # lazily: loaded when a tokenizer is made, not with every command that imports this

    return sentencepiece


class Tokenizer:
    """workbench's sentencepiece BPE (see the module docstring)."""
    kind = "sentencepiece"
    FILE = "tokenizer.model"

    def __init__(self, model_proto: bytes):
        self.proto = model_proto
        self.sp = _sentencepiece().SentencePieceProcessor(model_proto=model_proto)

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
        """Write ``tokenizer.model`` into the directory ``path`` (or to ``path`` itself, a file name)."""
        path = Path(path)
        (path / self.FILE if path.is_dir() else path).write_bytes(self.proto)

    def spec(self) -> tuple:
        return (self.kind, self.proto)

    def digest(self) -> str:
        return hashlib.sha256(self.proto).hexdigest()


# ----------------------------------------------------------------------------- Hugging Face tokenizer.json

# End-of-sequence tokens of common models, for a directory whose files do not say which is theirs.
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<|im_end|>", "<|eot_id|>")
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _token_content(tok: Any) -> str | None:
    """A special token of tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(tok, dict):
        tok = tok.get("content")
    return tok if isinstance(tok, str) and tok else None


def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is written as -> the byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (the ``tokenizers`` library). Text is encoded without the special
    tokens a chat or BOS template would add (as ``tokenizer(text, add_special_tokens=False)``); the
    end-of-document id is the model's end-of-sequence token, named by ``tokenizer_config.json``
    (``eos_token``), else ``eos_id`` given on import, else a token of a common name (EOS_NAMES)."""
    kind = "hf"
    FILE = "tokenizer.json"
    CONFIG = "tokenizer_config.json"

    def __init__(self, tokenizer_json: bytes, config_json: bytes | None = None):
        from tokenizers import Tokenizer as RustTokenizer  # lazily: only imported models have a tokenizer.json
        self.json_bytes, self.config_bytes = tokenizer_json, config_json
        try:
            self.tk = RustTokenizer.from_str(tokenizer_json.decode("utf-8"))
            self.raw = parse_json(tokenizer_json, self.FILE, TokenizerError)
        except Exception as e:  # noqa: BLE001 - the library raises its own exception types
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise TokenizerError(f"tokenizer.json cannot be read by the tokenizers library: {first}") from None
        self.config = parse_json(config_json, self.CONFIG, TokenizerError) if config_json else {}
        if not isinstance(self.config, dict):
            raise TokenizerError("tokenizer_config.json is not a JSON object")
        self.vocab = self.tk.get_vocab(with_added_tokens=True)
        self._eos = self.token_id(_token_content(self.config.get("eos_token")))
        if self._eos is None:
            self._eos = next((self.vocab[n] for n in EOS_NAMES if n in self.vocab), None)
        self._bos = self.token_id(_token_content(self.config.get("bos_token")))

    @classmethod
    def load(cls, path: Path) -> "HFTokenizer":
        """From tokenizer.json (and the tokenizer_config.json beside it, if any)."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise TokenizerError(f"cannot read tokenizer {path}: {e.strerror}") from None
        cfg = path.with_name(cls.CONFIG)
        return cls(data, cfg.read_bytes() if cfg.is_file() else None)

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.vocab.get(token)

    def with_eos(self, eos_id: int) -> "HFTokenizer":
        """The same tokenizer with ``eos_id`` written into its tokenizer_config.json as eos_token."""
        piece = self.tk.id_to_token(eos_id)
        if piece is None:
            raise TokenizerError(f"the end-of-sequence id {eos_id} is not in the tokenizer")
        return HFTokenizer(self.json_bytes, json.dumps(dict(self.config, eos_token=piece), indent=2,
                                                       ensure_ascii=False).encode("utf-8"))

    @property
    def vocab_size(self) -> int:
        """One more than the largest id (ids the embedding must have rows for)."""
        return max(self.vocab.values()) + 1 if self.vocab else 0

    @property
    def eod_id(self) -> int | None:
        return self._eos

    @property
    def bos_id(self) -> int | None:
        return self._bos

    def special_ids(self) -> set[int]:
        return {i for i, t in self.tk.get_added_tokens_decoder().items() if t.special}

    def byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes each id stands for: special tokens 0, a byte-fallback piece (<0x41>) 1, a byte-level
        BPE token (GPT-2 / Llama 3 / Qwen style) one byte per character, else its text ("▁" a space)."""
        out = np.zeros(self.vocab_size, dtype=np.int64)
        special = self.special_ids()
        byte_level = "ByteLevel" in json.dumps(self.raw.get("decoder"))
        fallback = bool((self.raw.get("model") or {}).get("byte_fallback"))
        chars = _byte_level_chars() if byte_level else {}
        added = {i: t.content for i, t in self.tk.get_added_tokens_decoder().items()}
        for piece, i in self.vocab.items():
            if i in special:
                continue
            if i in added:
                out[i] = len(added[i].encode("utf-8"))
            elif fallback and _BYTE_PIECE.fullmatch(piece):
                out[i] = 1
            elif byte_level:
                out[i] = sum(1 if c in chars else len(c.encode("utf-8")) for c in piece)
            else:
                out[i] = len(piece.replace("\u2581", " ").encode("utf-8"))
        return out

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=True)

    def save(self, path: Path) -> None:
        """Write tokenizer.json (and tokenizer_config.json) into the directory ``path``."""
        path = Path(path)
        if self.config_bytes is not None:  # first: tokenizer.json's presence says the tokenizer is there
            write_atomic(path / self.CONFIG, self.config_bytes)
        write_atomic(path / self.FILE, self.json_bytes)

    def spec(self) -> tuple:
        return (self.kind, self.json_bytes, self.config_bytes)

    def digest(self) -> str:
        h = hashlib.sha256(self.json_bytes)
        h.update(b"\0" + str(self._eos).encode())  # the end-of-document id is part of what the tokens mean
        return h.hexdigest()


AnyTokenizer = Tokenizer | HFTokenizer


def tokenizer_from_spec(spec: tuple) -> AnyTokenizer:
    """The tokenizer ``tok.spec()`` describes (for encoding workers)."""
    return Tokenizer(spec[1]) if spec[0] == Tokenizer.kind else HFTokenizer(spec[1], spec[2])


def tokenizer_file(path: Path) -> Path | None:
    """The tokenizer file a directory holds (tokenizer.json before tokenizer.model), or ``path`` if it is one."""
    path = Path(path)
    if path.is_dir():
        for name in (HFTokenizer.FILE, Tokenizer.FILE):
            if (path / name).is_file():
                return path / name
        return None
    return path if path.is_file() else None


def load_tokenizer(path: Path) -> AnyTokenizer:
    """The tokenizer of a directory (a run, a model, a cache entry) or a file: tokenizer.json through
    `tokenizers`, else tokenizer.model through sentencepiece."""
    f = tokenizer_file(path)
    if f is None:
        what = "has no tokenizer.json or tokenizer.model" if Path(path).is_dir() else "does not exist"
        raise TokenizerError(f"{path} {what}")
    return HFTokenizer.load(f) if f.name.endswith(".json") else Tokenizer.load(f)


SENTENCE_CHARS = 4096   # sample lines are cut to at most this many characters (<= 16 KB of UTF-8, within
                        # TRAINER_OPTIONS' max_sentence_length, past which sentencepiece drops a line whole)


def split_long_line(line: str, limit: int = SENTENCE_CHARS) -> list[str]:
    """``line`` in pieces of at most ``limit`` characters, cut after the last space before the limit where
    there is one (so words stay whole), for the tokenizer's sample: a long one-line document is learnt
    from, not dropped."""
    out, pos = [], 0
    while len(line) - pos > limit:
        cut = line.rfind(" ", pos + 1, pos + limit)
        end = cut if cut > pos else pos + limit
        out.append(line[pos:end])
        pos = end
    out.append(line[pos:])
    return out


def train_tokenizer(text: str | list[str], vocab_size: int, sample_mb: float = 8.0, seed: int = 0,
                    num_threads: int = 2) -> Tokenizer:
    """Train BPE on (a sample of) the lines of ``text`` (a string, or lines already sampled)."""
    spm = _sentencepiece()
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
    lines = [piece for ln in lines if ln for piece in split_long_line(ln)]
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
            raise CorpusTooSmall(f"the corpus is too small for model.vocab_size = {vocab_size}: it supports at "
                                 f"most {m.group(1)}; use --set model.vocab_size={ok} or a larger corpus", ok) from None
        m = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", msg)
        if m:
            need = int(m.group(2)) + 1
            ok = (need + 63) // 64 * 64
            raise TokenizerError(f"model.vocab_size = {vocab_size} is too small: this corpus needs at least {need} "
                                 f"pieces (256 byte pieces plus its characters); "
                                 f"use --set model.vocab_size={ok}") from None
        if "sentences_.empty()" in msg:
            raise TokenizerError("the tokenizer found no usable text in the corpus's sample (sentencepiece kept none "
                                 "of its lines); check data.text_field names the field that holds the text, or "
                                 "raise data.tokenizer_sample_mb") from None
        raise TokenizerError(f"tokenizer training failed: {msg.strip().splitlines()[-1]}") from None
    return Tokenizer(buf.getvalue())
