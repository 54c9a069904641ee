"""Preparing a corpus once: its tokenizer and its tokens, cached, encoded on every core, resumable.

Two streaming passes, memory bounded whatever the corpus size:

1. scan: every document once, for a SHA-256 of the text (the content's name in the cache), the
   document count, and a sample for the tokenizer drawn from the whole corpus (a reservoir of
   blocks of up to 64 KB, at most ``data.tokenizer_sample_mb`` in all).
2. encode: the documents again, cut into shards of ~8 MB of text; worker processes (one per core)
   encode them, each shard written by atomic rename with a sidecar naming its text's hash. An
   interrupted preparation (Ctrl-C, kill -9, a full disk) keeps its finished shards, never counts
   a partial one, and the next start encodes only what is missing, bit for bit the same.

The shards are then joined into one ``tokens.bin`` and ``index.json`` is written last: its
presence marks the preparation complete. Cache layout (``$WORKBENCH_CACHE_DIR`` or
``~/.cache/workbench``), under ``data/``:

    m-<manifest>.json    the inputs (paths, sizes, modification times, options) -> their content
    s-<spec>.json        the inputs a corpus spec named last time (to say why it is encoded again)
    c-<content>/tok-<vocab>-o<options>-s<sample MB>/     (a tokenizer trained on the corpus)
    c-<content>/tok-<kind>-<tokenizer digest>/           (a given one: data.tokenizer, an imported model's)
        tokenizer.model or tokenizer.json, tokens.bin, index.json, shards/ (while encoding)

The tokens of one text under two tokenizers never mix: the directory names the tokenizer.

A start whose inputs are unchanged finds its ``m-`` file and reads no corpus bytes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from workbench.data.corpus.documents import Corpus, Stats, warnings_of
from workbench.data.text.encode import SHARD_CHARS, Progress, Ticker, encode, join_shards
from workbench.data.text.tokenizer import OPTIONS_VERSION, AnyTokenizer, load_tokenizer, tokenizer_file, train_tokenizer
from workbench.errors import WorkbenchError
from workbench.faults import NO_FAULTS, Faults
from workbench.fmt import duration, human_bytes
from workbench.fs import cache_root, read_json, write_atomic, write_json_atomic

SAMPLE_BLOCK = 64 << 10    # the tokenizer's sample is drawn in blocks of at most this many characters, and at
SAMPLE_BLOCKS = 64         # least this many blocks (smaller blocks for a small sample)


class DataError(WorkbenchError):
    pass


@dataclass
class Prepared:
    """A complete preparation (its index.json), ready to be memory-mapped."""
    dir: Path
    index: dict
    cached: bool           # found complete: nothing was read or encoded now

    @property
    def tokenizer_path(self) -> Path:
        return tokenizer_file(self.dir) or self.dir / "tokenizer.model"

    @property
    def tokens_path(self) -> Path:
        return self.dir / "tokens.bin"


def workers_available() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ----------------------------------------------------------------------------- pass 1: scan

@dataclass
class Scan:
    content: str
    documents: int
    chars: int
    bytes: int
    sample: list[str]
    warnings: list[str]


def scan(corpus: Corpus, sample_mb: float, progress: Progress | None = None, seed: int = 0) -> Scan:
    """The content hash, counts and a tokenizer sample from one pass over every document."""
    h = hashlib.sha256()
    stats = Stats()
    rng = random.Random(seed)
    budget = int(sample_mb * 1_000_000)
    block_chars = max(4096, min(SAMPLE_BLOCK, budget // SAMPLE_BLOCKS))
    slots = max(1, budget // block_chars)
    reservoir: list[str] = []
    seen = 0
    block: list[str] = []
    size = 0
    tick = Ticker("scanning", corpus.total_bytes, progress)

    def take(b: str) -> None:
        nonlocal seen
        seen += 1
        if len(reservoir) < slots:
            reservoir.append(b)
        else:
            j = rng.randrange(seen)
            if j < slots:
                reservoir[j] = b

    for text, end in corpus.pieces(stats):
        h.update(text.encode("utf-8", "surrogatepass"))
        if end:
            h.update(b"\x1e")
            # a document's end ends a line of the sample too: one-line documents (JSONL reviews, messages)
            # would otherwise run together into lines too long for sentencepiece, which drops them
            text = text if text.endswith("\n") else text + "\n"
        block.append(text)
        size += len(text)
        if size >= block_chars:  # blocks of whole lines where they can be
            joined, pos = "".join(block), 0
            while len(joined) - pos >= block_chars:
                cut = joined.rfind("\n", pos, pos + block_chars)
                stop = cut + 1 if cut > pos else pos + block_chars
                take(joined[pos:stop])
                pos = stop
            block, size = [joined[pos:]], len(joined) - pos
        tick(stats.bytes_done())
    if size:
        take("".join(block))
    lines = [ln for b in reservoir for ln in b.split("\n")]
    return Scan(h.hexdigest(), stats.documents, stats.chars, corpus.total_bytes, lines, warnings_of(corpus, stats))


# ----------------------------------------------------------------------------- the whole preparation

@contextmanager
def _locked(path: Path, log: Callable[[str], None]) -> Iterator[None]:
    """One preparation of the same inputs at a time (another trainer or `workbench data prepare`)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another process is preparing this corpus; waiting for it ...")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _stem(vocab_size: int, sample_mb: float, tokenizer: AnyTokenizer | None = None) -> str:
    if tokenizer is not None:
        return f"tok-{tokenizer.kind}-{tokenizer.digest()[:16]}"
    return f"tok-{vocab_size}-o{OPTIONS_VERSION}-s{sample_mb:g}"


def _complete(root: Path, pointer: dict | None, stem: str) -> Prepared | None:
    if not pointer:
        return None
    d = root / f"c-{pointer['content'][:20]}" / stem
    index = read_json(d / "index.json")
    if index and (d / "tokens.bin").exists() and tokenizer_file(d) is not None:
        return Prepared(d, index, cached=True)
    return None


def _why_again(previous: dict | None, corpus: Corpus) -> str | None:
    """What changed in the inputs of this corpus spec since they were last prepared."""
    if not previous:
        return None
    old = {p: (size, mtime) for p, size, mtime in previous.get("sources", [])}
    new = {p: (size, mtime) for p, size, mtime in corpus.manifest()["sources"]}
    parts = [f"{p} is new" for p in new if p not in old][:3]
    parts += [f"{p} is gone" for p in old if p not in new][:3]
    for p in new:
        if p in old and old[p] != new[p]:
            (s0, _), (s1, _) = old[p], new[p]
            parts.append(f"{p} changed (size {s0:,} -> {s1:,} bytes)" if s0 != s1 else f"{p} was modified")
            if len(parts) >= 4:
                break
    if not parts and previous.get("text_field") != corpus.text_field:
        parts.append(f"data.text_field is now {corpus.text_field!r}")
    if not parts and previous.get("skip_bad_records") != corpus.skip_bad:
        parts.append(f"data.skip_bad_records is now {str(corpus.skip_bad).lower()}")
    if not parts and previous.get("reader", corpus.manifest()["reader"]) != corpus.manifest()["reader"]:
        parts.append("this version of workbench reads it differently")
    return "; ".join(parts) or None  # the same files and options: what is new is the tokenizer (the caller says)


def prepare(corpus: Corpus, vocab_size: int, sample_mb: float, log: Callable[[str], None] = print,
            progress: Progress | None = None, workers: int | None = None, shard_chars: int = SHARD_CHARS,
            faults: Faults = NO_FAULTS, tokenizer: AnyTokenizer | None = None) -> Prepared:
    """The corpus's tokenizer and tokens: from the cache when its inputs are unchanged (reading no
    corpus bytes), else prepared now (and resumed where an interrupted preparation stopped).
    ``tokenizer``: encode with this one instead of training one on the corpus."""
    root = cache_root() / "data"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create cache directory {root}: {e.strerror}; set WORKBENCH_CACHE_DIR") from None
    stem = _stem(vocab_size, sample_mb, tokenizer)
    mkey = corpus.manifest_key()
    pointer_path = root / f"m-{mkey}.json"
    if (hit := _complete(root, read_json(pointer_path), stem)):
        return hit
    with _locked(root / f"m-{mkey}.lock", log):
        if (hit := _complete(root, read_json(pointer_path), stem)):  # prepared while we waited
            return hit
        return _prepare_locked(corpus, vocab_size, sample_mb, root, stem, log, progress,
                               workers or workers_available(), shard_chars, faults, tokenizer)


def _prepare_locked(corpus: Corpus, vocab_size: int, sample_mb: float, root: Path, stem: str,
                    log: Callable[[str], None], progress: Progress | None, workers: int, shard_chars: int,
                    faults: Faults, given: AnyTokenizer | None) -> Prepared:
    mkey = corpus.manifest_key()
    spec_key = hashlib.sha256(json.dumps([corpus.spec, corpus.text_field]).encode()).hexdigest()[:20]
    why = _why_again(read_json(root / f"s-{spec_key}.json"), corpus)
    if why:
        log(f"corpus changed since it was encoded ({why}): preparing it again")
    pointer = read_json(root / f"m-{mkey}.json")
    if not why and pointer is not None:  # the text is known; its tokens for this tokenizer are not
        what = (f"the given {given.kind} tokenizer" if given is not None
                else f"a {vocab_size:,}-piece tokenizer (tokenizer sample {sample_mb:g} MB)")
        log(f"the corpus is unchanged; it has not been encoded with {what} yet: encoding it")
    t0 = time.time()
    sc = None
    if pointer is None or (given is None and tokenizer_file(root / f"c-{pointer['content'][:20]}" / stem) is None):
        log(f"reading {corpus.description} ({human_bytes(corpus.total_bytes)}) for its size and a tokenizer "
            "sample ...")
        sc = scan(corpus, sample_mb, progress)
        pointer = {"content": sc.content, "documents": sc.documents, "chars": sc.chars, "bytes": sc.bytes,
                   "warnings": sc.warnings, **corpus.manifest()}
        write_json_atomic(root / f"m-{corpus.manifest_key()}.json", pointer)
        write_json_atomic(root / f"s-{spec_key}.json", corpus.manifest())
        if (hit := _complete(root, pointer, stem)):  # the same text was prepared before under other names
            log("the same text was prepared before: using its tokens")
            return hit
    for w in pointer.get("warnings", []):
        log(f"warning: {w}")
    d = root / f"c-{pointer['content'][:20]}" / stem
    d.mkdir(parents=True, exist_ok=True)
    t_scan = time.time() - t0
    if given is not None:
        tok = given
        if tokenizer_file(d) is None:
            tok.save(d)
    elif tokenizer_file(d) is not None:
        tok = load_tokenizer(d)
    else:
        assert sc is not None  # no tokenizer here yet: the corpus was scanned above for its sample
        log(f"training a {vocab_size}-piece tokenizer on a {human_bytes(sum(len(x) + 1 for x in sc.sample))} "
            "sample of the whole corpus ...")
        tok = train_tokenizer(sc.sample, vocab_size, sample_mb)
        write_atomic(d / "tokenizer.model", tok.proto)
    t_tok = time.time() - t0 - t_scan
    n_shards = len([p for p in (d / "shards").glob("*.json")]) if (d / "shards").is_dir() else 0
    log(f"encoding on {workers} process{'es' if workers > 1 else ''}"
        + (f", continuing after {n_shards} finished shard(s)" if n_shards else "") + " ...")
    t1 = time.time()
    counts = encode(corpus, tok, d / "shards", workers, shard_chars, progress, faults)
    join_shards(d / "shards", len(counts), d / "tokens.bin")
    n_tokens = sum(n for n, _docs in counts)
    t_enc = time.time() - t1
    index = {"tokens": n_tokens, "dtype": "uint16" if tok.vocab_size <= 65535 else "uint32",
             "documents": pointer["documents"], "chars": pointer["chars"], "bytes": pointer["bytes"],
             "shards": counts, "content": pointer["content"], "source": corpus.description,
             "vocab_size": tok.vocab_size, "eod_id": tok.eod_id, "warnings": pointer.get("warnings", []),
             "workers": workers, "seconds": {"scan": round(t_scan, 2), "tokenizer": round(t_tok, 2),
                                             "encode": round(t_enc, 2)}}
    write_json_atomic(d / "index.json", index)
    shutil.rmtree(d / "shards", ignore_errors=True)
    rate = corpus.total_bytes / 1e6 / max(t_enc, 1e-9)
    log(f"encoded {index['documents']:,} documents, {n_tokens:,} tokens in {duration(time.time() - t0)} "
        f"({rate:.1f} MB/s on {workers} process{'es' if workers > 1 else ''}, "
        f"{index['chars'] / max(n_tokens, 1):.2f} chars/token)")
    return Prepared(d, index, cached=False)


def train_corpus_tokenizer(corpus: Corpus, vocab_size: int, sample_mb: float, log: Callable[[str], None] = print,
                           progress: Progress | None = None) -> AnyTokenizer:
    """A tokenizer trained on a sample of ``corpus`` (a mixture's sources together), cached where preparing the
    corpus itself would keep it; the corpus is scanned (for the sample) but not encoded."""
    root = cache_root() / "data"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create cache directory {root}: {e.strerror}; set WORKBENCH_CACHE_DIR") from None
    stem, mkey = _stem(vocab_size, sample_mb), corpus.manifest_key()
    with _locked(root / f"m-{mkey}.lock", log):
        pointer = read_json(root / f"m-{mkey}.json")
        if pointer is not None and tokenizer_file(d := root / f"c-{pointer['content'][:20]}" / stem) is not None:
            return load_tokenizer(d)
        log(f"reading {corpus.description} ({human_bytes(corpus.total_bytes)}) for a tokenizer sample ...")
        sc = scan(corpus, sample_mb, progress)
        pointer = {"content": sc.content, "documents": sc.documents, "chars": sc.chars, "bytes": sc.bytes,
                   "warnings": sc.warnings, **corpus.manifest()}
        write_json_atomic(root / f"m-{mkey}.json", pointer)
        d = root / f"c-{pointer['content'][:20]}" / stem
        d.mkdir(parents=True, exist_ok=True)
        if tokenizer_file(d) is not None:  # the same text, listed under other names before
            return load_tokenizer(d)
        log(f"training a {vocab_size}-piece tokenizer on a {human_bytes(sum(len(x) + 1 for x in sc.sample))} "
            "sample of all the sources ...")
        tok = train_tokenizer(sc.sample, vocab_size, sample_mb)
        write_atomic(d / "tokenizer.model", tok.proto)
        return tok
