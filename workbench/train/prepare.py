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
    c-<content>/tok-<vocab>-o<options>-s<sample MB>/
        tokenizer.model, tokens.bin, index.json, shards/ (while encoding)

A start whose inputs are unchanged finds its ``m-`` file and reads no corpus bytes.
"""

from __future__ import annotations

import concurrent.futures as cf
import fcntl
import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from workbench.errors import WorkbenchError
from workbench.fmt import duration, human_bytes
from workbench.fs import cache_root, fsync_dir, read_json, write_atomic, write_json_atomic
from workbench.train.corpus import Corpus, CorpusError, Piece, Stats, warnings_of
from workbench.train.faults import NO_FAULTS, Faults
from workbench.train.tokenizer import OPTIONS_VERSION, Tokenizer, train_tokenizer

SHARD_CHARS = 8 << 20      # text per token shard: the unit of parallel and resumable encoding
SAMPLE_BLOCK = 64 << 10    # the tokenizer's sample is drawn in blocks of at most this many characters, and at
SAMPLE_BLOCKS = 64         # least this many blocks (smaller blocks for a small sample)

@dataclass(frozen=True)
class PrepareProgress:
    phase: str                 # scanning | encoding
    done_bytes: int            # input bytes read in this phase (compressed bytes for compressed files)
    total_bytes: int
    mb_per_s: float | None
    eta_s: float | None

    @property
    def fraction(self) -> float:
        return min(1.0, self.done_bytes / max(1, self.total_bytes))

    def to_dict(self) -> dict:
        return {"phase": self.phase, "fraction": round(self.fraction, 4), "done_bytes": self.done_bytes,
                "total_bytes": self.total_bytes, "mb_per_s": self.mb_per_s, "eta_s": self.eta_s}


Progress = Callable[[PrepareProgress], None]


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
        return self.dir / "tokenizer.model"

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
    tick = _Ticker("scanning", corpus.total_bytes, progress)

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
        block.append(text)
        size += len(text)
        if size >= block_chars:  # blocks of whole lines where they can be
            joined, pos = "".join(block), 0
            while len(joined) - pos >= block_chars:
                cut = joined.rfind("\n", pos, pos + block_chars)
                end = cut + 1 if cut > pos else pos + block_chars
                take(joined[pos:end])
                pos = end
            block, size = [joined[pos:]], len(joined) - pos
        tick(stats.bytes_done())
    if size:
        take("".join(block))
    lines = [ln for b in reservoir for ln in b.split("\n")]
    return Scan(h.hexdigest(), stats.documents, stats.chars, corpus.total_bytes, lines, warnings_of(corpus, stats))


# ----------------------------------------------------------------------------- pass 2: encode

_TOKENIZER: Tokenizer | None = None


def _init_worker(proto: bytes, parent: int | None = None) -> None:
    """In each encoding process: the tokenizer, and (Linux) a promise to die with the parent. A forked
    worker holds copies of the parent's file locks (the run's, the cache's); a worker orphaned by a
    kill -9 would keep them, and the next start would wait for it forever."""
    global _TOKENIZER
    _TOKENIZER = Tokenizer(proto)
    if parent is not None and sys.platform == "linux":
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the promise was made
            os._exit(1)


def encode_shard(index: int, pieces: list[Piece], out_dir: str, dtype: str, sha: str) -> tuple[int, int, int]:
    """Encode one shard's pieces (an end-of-document id after each document) and write it atomically:
    ``NNNNNN.bin`` first, then its sidecar ``NNNNNN.json``, whose presence makes the shard count."""
    tok = _TOKENIZER
    eod = tok.eod_id
    parts = []
    docs = 0
    for text, end in pieces:
        ids = tok.encode(text)
        if end:
            ids.append(eod)
            docs += 1
        parts.append(np.asarray(ids, dtype=dtype))
    arr = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    out = Path(out_dir)
    write_atomic(out / f"{index:06d}.bin", arr.tobytes())
    write_json_atomic(out / f"{index:06d}.json", {"tokens": int(len(arr)), "documents": docs, "sha256": sha})
    return index, int(len(arr)), docs


def _shards(pieces: Iterator[Piece], shard_chars: int) -> Iterator[tuple[list[Piece], str, int]]:
    """Consecutive pieces of about ``shard_chars`` characters: (pieces, hash of their text, characters)."""
    cur: list[Piece] = []
    h = hashlib.sha256()
    size = 0
    for text, end in pieces:
        cur.append((text, end))
        h.update(text.encode("utf-8", "surrogatepass"))
        h.update(b"\x1e" if end else b"\x1f")
        size += len(text)
        if size >= shard_chars:
            yield cur, h.hexdigest(), size
            cur, h, size = [], hashlib.sha256(), 0
    if cur:
        yield cur, h.hexdigest(), size


def _unchanged(corpus: Corpus) -> Callable:
    """A check that a source's size and modification time are still those of the manifest."""
    def check(src) -> None:
        if src.kind == "builtin":
            return
        try:
            st = os.stat(src.path)
        except OSError as e:
            raise CorpusError(f"corpus file {src.path} disappeared while it was being encoded ({e.strerror}); "
                              "prepare again") from None
        if (st.st_size, st.st_mtime_ns) != (src.size, src.mtime_ns):
            raise CorpusError(f"corpus file {src.path} changed while it was being encoded (size "
                              f"{human_bytes(src.size)} -> {human_bytes(st.st_size)}); prepare again once it stops "
                              "changing")
    return check


def encode(corpus: Corpus, tok: Tokenizer, shard_dir: Path, workers: int, shard_chars: int = SHARD_CHARS,
           progress: Progress | None = None, faults: Faults = NO_FAULTS) -> list[tuple[int, int]]:
    """Encode every document into ``shard_dir``, keeping shards already there whose text is the same.
    Returns (tokens, documents) per shard, in order."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    dtype = "uint16" if tok.vocab_size <= 65535 else "uint32"
    check = _unchanged(corpus)
    for src in corpus.sources:
        check(src)
    stats = Stats()
    results: dict[int, tuple[int, int]] = {}
    tick = _Ticker("encoding", corpus.total_bytes, progress)
    written = 0

    def done(i: int, n_tokens: int, docs: int, read: int) -> None:
        """Shard ``i`` is on disk; ``read``: the input bytes read up to its end (progress counts these)."""
        nonlocal written
        results[i] = (n_tokens, docs)
        written += 1
        faults.after_shard(written)
        tick(read)

    shards = _shards(corpus.pieces(stats, on_source_done=check), shard_chars)
    pool = None
    if workers > 1:
        ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
        pool = cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                      initargs=(tok.proto, os.getpid()))
    else:
        _init_worker(tok.proto)
    pending: deque[tuple[cf.Future, int]] = deque()
    finished_read = 0

    def finish_oldest() -> None:
        nonlocal finished_read
        fut, read = pending.popleft()
        while True:
            try:
                i, n_tokens, docs = fut.result(timeout=0.5)
                break
            except cf.TimeoutError:
                tick(finished_read)  # a progress line (and a live ETA) while the shard is encoded
        finished_read = read
        done(i, n_tokens, docs, read)

    try:
        for i, (pieces, sha, _chars) in enumerate(shards):
            read = stats.bytes_done()
            side = read_json(shard_dir / f"{i:06d}.json")
            if side and side.get("sha256") == sha and (shard_dir / f"{i:06d}.bin").exists():
                results[i] = (side["tokens"], side["documents"])  # finished by an earlier, interrupted start
                tick(read)
            elif pool is None:
                done(*encode_shard(i, pieces, str(shard_dir), dtype, sha), read)
            else:
                pending.append((pool.submit(encode_shard, i, pieces, str(shard_dir), dtype, sha), read))
                while len(pending) > 2 * workers:  # bounded: at most this many shards of text in flight
                    finish_oldest()
        while pending:
            finish_oldest()
    finally:
        if pool is not None:
            for f, _read in pending:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
    return [results[i] for i in range(len(results))]


def join_shards(shard_dir: Path, n_shards: int, out: Path) -> None:
    """The shards, in order, as one file (written beside it and renamed into place)."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        for i in range(n_shards):
            with open(shard_dir / f"{i:06d}.bin", "rb") as s:
                shutil.copyfileobj(s, f, 16 << 20)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    fsync_dir(out.parent)


# ----------------------------------------------------------------------------- the whole preparation

@contextmanager
def _locked(path: Path, log: Callable[[str], None]):
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


def _stem(vocab_size: int, sample_mb: float) -> str:
    return f"tok-{vocab_size}-o{OPTIONS_VERSION}-s{sample_mb:g}"


def _complete(root: Path, pointer: dict | None, stem: str) -> Prepared | None:
    if not pointer:
        return None
    d = root / f"c-{pointer['content'][:20]}" / stem
    index = read_json(d / "index.json")
    if index and (d / "tokens.bin").exists() and (d / "tokenizer.model").exists():
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
    return "; ".join(parts) or "its files or options changed"


def prepare(corpus: Corpus, vocab_size: int, sample_mb: float, log: Callable[[str], None] = print,
            progress: Progress | None = None, workers: int | None = None, shard_chars: int = SHARD_CHARS,
            faults: Faults = NO_FAULTS) -> Prepared:
    """The corpus's tokenizer and tokens: from the cache when its inputs are unchanged (reading no
    corpus bytes), else prepared now (and resumed where an interrupted preparation stopped)."""
    root = cache_root() / "data"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create cache directory {root}: {e.strerror}; set WORKBENCH_CACHE_DIR") from None
    stem = _stem(vocab_size, sample_mb)
    mkey = corpus.manifest_key()
    pointer_path = root / f"m-{mkey}.json"
    if (hit := _complete(root, read_json(pointer_path), stem)):
        return hit
    with _locked(root / f"m-{mkey}.lock", log):
        if (hit := _complete(root, read_json(pointer_path), stem)):  # prepared while we waited
            return hit
        return _prepare_locked(corpus, vocab_size, sample_mb, root, stem, log, progress,
                               workers or workers_available(), shard_chars, faults)


def _prepare_locked(corpus: Corpus, vocab_size: int, sample_mb: float, root: Path, stem: str, log, progress,
                    workers: int, shard_chars: int, faults: Faults) -> Prepared:
    mkey = corpus.manifest_key()
    spec_key = hashlib.sha256(json.dumps([corpus.spec, corpus.text_field]).encode()).hexdigest()[:20]
    why = _why_again(read_json(root / f"s-{spec_key}.json"), corpus)
    if why:
        log(f"corpus changed since it was encoded ({why}): preparing it again")
    pointer = read_json(root / f"m-{mkey}.json")
    t0 = time.time()
    sc = None
    if pointer is None or not (root / f"c-{pointer['content'][:20]}" / stem / "tokenizer.model").exists():
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
    if (d / "tokenizer.model").exists():
        tok = Tokenizer.load(d / "tokenizer.model")
    else:
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


class _Ticker:
    """Calls ``progress`` at most twice a second with the bytes done, MB/s and ETA of a phase."""

    def __init__(self, phase: str, total: int, progress: Progress | None):
        self.phase, self.total, self.progress = phase, max(1, total), progress
        self.t0 = self.last = time.time()

    def __call__(self, done: int) -> None:
        now = time.time()
        if self.progress is None or now - self.last < 0.5:
            return
        self.last = now
        rate = done / 1e6 / (now - self.t0) if now > self.t0 else None
        eta = max(0.0, self.total - done) / 1e6 / rate if rate else None
        self.progress(PrepareProgress(self.phase, done, self.total, rate, eta))
