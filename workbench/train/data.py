"""Token data: tokenizer + encoded corpus cached by content, and a resumable window sampler.

Cache layout (``$WORKBENCH_CACHE_DIR`` or ``~/.cache/workbench``)::

    data/<sha256 of corpus text, 16 hex>/
        tok-<vocab>-<opts>.model     sentencepiece model
        tok-<vocab>-<opts>.bin       every token of the corpus, uint16 or uint32
        tok-<vocab>-<opts>.json      token count, dtype, source

A second run on the same corpus and vocab neither retrains nor re-encodes.
Files appear by atomic rename, so two trainers preparing the same cache at once
cannot see a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from workbench.config import DataConfig
from workbench.errors import WorkbenchError
from workbench.fs import write_atomic
from workbench.train.corpus import load_corpus
from workbench.train.tokenizer import OPTIONS_VERSION, Tokenizer, train_tokenizer


class DataError(WorkbenchError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("WORKBENCH_CACHE_DIR") or Path.home() / ".cache" / "workbench")


@dataclass
class TokenData:
    tokenizer: Tokenizer
    tokens: np.ndarray          # memmap of the whole corpus
    n_train: int                # tokens [0, n_train) train, [n_train, len) val
    source: str
    tokenizer_path: Path
    cached: bool

    @property
    def train(self) -> np.ndarray:
        return self.tokens[: self.n_train]

    @property
    def val(self) -> np.ndarray:
        return self.tokens[self.n_train:]


def encode_corpus(tok: Tokenizer, text: str, out: Path, progress: Callable[[float], None] | None = None) -> int:
    """Encode ``text`` in chunks that end at newlines ("\\n" is its own piece, so chunking
    at newlines gives exactly the tokens of one whole encode) into ``out``."""
    dtype = np.uint16 if tok.vocab_size <= 65535 else np.uint32
    chunk_chars = 1 << 20
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    n = 0
    with open(tmp, "wb") as f:
        pos = 0
        while pos < len(text):
            end = min(len(text), pos + chunk_chars)
            if end < len(text):
                nl = text.rfind("\n", pos, end)
                end = nl + 1 if nl >= pos else end
            ids = np.asarray(tok.encode(text[pos:end]), dtype=dtype)
            f.write(ids.tobytes())
            n += len(ids)
            pos = end
            if progress:
                progress(pos / len(text))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    return n


def prepare_data(cfg: DataConfig, vocab_size: int, seq_len: int, log: Callable[[str], None] = print) -> TokenData:
    corpus = load_corpus(cfg.corpus, cfg.builtin_mb)
    for w in corpus.warnings:
        log(f"warning: {w}")
    digest = hashlib.sha256(corpus.text.encode("utf-8", errors="surrogatepass")).hexdigest()[:16]
    d = cache_root() / "data" / digest
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create cache directory {d}: {e.strerror}; set WORKBENCH_CACHE_DIR") from None
    stem = f"tok-{vocab_size}-o{OPTIONS_VERSION}-s{cfg.tokenizer_sample_mb:g}"
    model_path, bin_path, meta_path = d / f"{stem}.model", d / f"{stem}.bin", d / f"{stem}.json"
    cached = model_path.exists() and meta_path.exists() and bin_path.exists()
    if not cached:
        t0 = time.time()
        log(f"training a {vocab_size}-piece tokenizer on {corpus.source} ...")
        tok = train_tokenizer(corpus.text, vocab_size, cfg.tokenizer_sample_mb)
        write_atomic(model_path, tok.proto)
        log(f"tokenizer trained in {time.time() - t0:.1f} s; encoding the corpus ...")
        t0 = time.time()
        big = len(corpus.text) > 4_000_000
        last = [0.0]

        def progress(frac: float) -> None:
            if big and (frac - last[0] >= 0.1 or frac >= 1.0):
                last[0] = frac
                print(f"  encoding {frac:4.0%}", file=sys.stderr, flush=True)

        n = encode_corpus(tok, corpus.text, bin_path, progress)
        meta = {"tokens": n, "dtype": "uint16" if tok.vocab_size <= 65535 else "uint32",
                "source": corpus.source, "chars": len(corpus.text), "vocab_size": tok.vocab_size}
        write_atomic(meta_path, json.dumps(meta))
        log(f"encoded {n:,} tokens in {time.time() - t0:.1f} s ({len(corpus.text) / max(n, 1):.2f} chars/token)")
    else:
        tok = Tokenizer.load(model_path)
    meta = json.loads(meta_path.read_text())
    tokens = np.memmap(bin_path, dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["tokens"],))
    n = len(tokens)
    n_val = max(int(n * cfg.val_fraction), seq_len + 1)
    n_train = n - n_val
    if n_train < seq_len + 1:
        need = 2 * (seq_len + 1)
        raise DataError(f"the corpus is too short: {n:,} tokens, but one training and one validation "
                        f"sequence of model.seq_len = {seq_len} need at least {need:,}; use a longer corpus "
                        f"or a smaller seq_len (e.g. --set model.seq_len={max(8, n // 4)})")
    return TokenData(tokenizer=tok, tokens=tokens, n_train=n_train, source=corpus.source,
                     tokenizer_path=model_path, cached=cached)


class WindowSampler:
    """Random (x, y) windows from a token array, from a generator whose state is saved.

    ``state()`` / ``set_state()`` make the stream resumable: after restoring, the next
    batches equal those the original would have drawn.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int):
        self.tokens, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.high = len(tokens) - seq_len - 1

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        ix = self.rng.integers(0, self.high + 1, size=self.batch_size)
        win = np.stack([np.asarray(self.tokens[i:i + self.seq_len + 1], dtype=np.int64) for i in ix])
        return win[:, :-1], win[:, 1:]

    def state(self) -> dict:
        s = self.rng.bit_generator.state
        # 128-bit integers as strings: the state is stored in JSON.
        return {"bit_generator": s["bit_generator"], "state": {k: str(v) for k, v in s["state"].items()},
                "has_uint32": s["has_uint32"], "uinteger": s["uinteger"]}

    def set_state(self, st: dict) -> None:
        self.rng.bit_generator.state = {"bit_generator": st["bit_generator"],
                                        "state": {k: int(v) for k, v in st["state"].items()},
                                        "has_uint32": st["has_uint32"], "uinteger": st["uinteger"]}
