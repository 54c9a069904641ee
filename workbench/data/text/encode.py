"""The encoding pass of a corpus preparation: documents cut into shards of ~8 MB of text, encoded by
one process per core, each shard written by atomic rename with a sidecar naming its text's hash, so
an interrupted preparation keeps what it finished; then the shards joined into one ``tokens.bin``.
And the progress both passes report (bytes done, MB/s, ETA)."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from workbench.cli_client import die_with_parent
from workbench.data.corpus.documents import Corpus, CorpusError, Piece, Source, Stats
from workbench.data.text.tokenizer import AnyTokenizer, tokenizer_from_spec
from workbench.faults import NO_FAULTS, Faults
from workbench.fmt import human_bytes
from workbench.fs import fsync_dir, read_json, write_atomic, write_json_atomic

SHARD_CHARS = 8 << 20      # text per token shard: the unit of parallel and resumable encoding


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


class Ticker:
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



_TOKENIZER: AnyTokenizer | None = None


def _init_worker(spec: tuple, parent: int | None = None) -> None:
    """In each encoding process: the tokenizer, and (Linux) a promise to die with the parent. A forked
    worker holds copies of the parent's file locks (the run's, the cache's); a worker orphaned by a
    kill -9 would keep them, and the next start would wait for it forever."""
    global _TOKENIZER
    _TOKENIZER = tokenizer_from_spec(spec)
    if parent is not None and sys.platform == "linux":
        die_with_parent(signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the promise was made
            os._exit(1)


class ShardPool:
    """Shards made by ``workers`` processes (in this one when 1; each process starts with ``initializer``,
    given the parent's pid too so it dies with it), at most two per worker in flight, each result handed to
    its ``done`` in the order the shards went in. Leaving the ``with`` block cancels the shards still waiting
    and waits for the running ones (an error, Ctrl-C); ``finish`` waits for them all first."""

    def __init__(self, workers: int, initializer: Callable[..., None], initargs: tuple,
                 waiting: Callable[[], None] | None = None):
        """``waiting``: called every half second while the oldest shard is still being made (a progress line)."""
        self.workers, self.waiting = workers, waiting
        self.pool: cf.ProcessPoolExecutor | None = None
        if workers > 1:
            ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
            self.pool = cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=initializer,
                                               initargs=(*initargs, os.getpid()))
        else:
            initializer(*initargs)
        self.pending: deque[tuple[cf.Future, Callable[[Any], None]]] = deque()

    def __enter__(self) -> ShardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            for f, _done in self.pending:
                f.cancel()
            self.pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, done: Callable[[Any], None], fn: Callable[..., Any], *args: Any) -> None:
        """``done(fn(*args))``, now in this process or later from a worker's result."""
        if self.pool is None:
            done(fn(*args))
            return
        self.pending.append((self.pool.submit(fn, *args), done))
        while len(self.pending) > 2 * self.workers:  # bounded: at most this many shards in flight
            self._finish_oldest()

    def finish(self) -> None:
        while self.pending:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        fut, done = self.pending.popleft()
        while True:
            try:
                result = fut.result(timeout=0.5)
                break
            except cf.TimeoutError:
                if self.waiting is not None:
                    self.waiting()
        done(result)


def worker_tokenizer() -> AnyTokenizer:
    """The tokenizer of an encoding process (set by ``_init_worker``)."""
    if _TOKENIZER is None:
        raise RuntimeError("an encoding process starts with _init_worker, which sets its tokenizer")
    return _TOKENIZER


def encode_shard(index: int, pieces: list[Piece], out_dir: str, dtype: str, sha: str) -> tuple[int, int, int]:
    """Encode one shard's pieces (an end-of-document id after each document) and write it atomically:
    ``NNNNNN.bin`` first, then its sidecar ``NNNNNN.json``, whose presence makes the shard count."""
    tok = worker_tokenizer()
    eod = tok.eod_id
    parts = []
    docs = 0
    for text, end in pieces:
        ids = tok.encode(text)
        if end:
            if eod is not None:  # a sentencepiece model trained before there was one: documents simply follow
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


def _unchanged(corpus: Corpus) -> Callable[[Source], None]:
    """A check that a source's size and modification time are still those of the manifest."""
    def check(src: Source) -> None:
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


def encode(corpus: Corpus, tok: AnyTokenizer, shard_dir: Path, workers: int, shard_chars: int = SHARD_CHARS,
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
    tick = Ticker("encoding", corpus.total_bytes, progress)
    written = 0

    finished_read = 0

    def done(read: int, shard: tuple[int, int, int]) -> None:
        """A shard is on disk; ``read``: the input bytes read up to its end (progress counts these)."""
        nonlocal written, finished_read
        i, n_tokens, docs = shard
        finished_read = read
        results[i] = (n_tokens, docs)
        written += 1
        faults.after_shard(written)
        tick(read)

    shards = _shards(corpus.pieces(stats, on_source_done=check), shard_chars)
    # while a shard is encoded: a progress line (and a live ETA) every half second
    with ShardPool(workers, _init_worker, (tok.spec(),), waiting=lambda: tick(finished_read)) as pool:
        for i, (pieces, sha, _chars) in enumerate(shards):
            read = stats.bytes_done()
            side = read_json(shard_dir / f"{i:06d}.json")
            if side and side.get("sha256") == sha and (shard_dir / f"{i:06d}.bin").exists():
                results[i] = (side["tokens"], side["documents"])  # finished by an earlier, interrupted start
                tick(read)
            else:
                pool.submit(partial(done, read), encode_shard, i, pieces, str(shard_dir), dtype, sha)
        pool.finish()
    return [results[i] for i in range(len(results))]


def join_shards(shard_dir: Path, n_shards: int, out: Path) -> None:
    """The shards, in order, as one file (written beside it and renamed into place)."""
    join_files([shard_dir / f"{i:06d}.bin" for i in range(n_shards)], out)


def join_files(parts: list[Path], out: Path) -> None:
    """``parts``, in order, as one file (written beside it, synced, and renamed into place)."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        for part in parts:
            with open(part, "rb") as s:
                shutil.copyfileobj(s, f, 16 << 20)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    fsync_dir(out.parent)
