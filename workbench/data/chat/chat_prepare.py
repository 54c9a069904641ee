"""Preparing a chat corpus once: each conversation rendered through the chat template and encoded, with a
label per token, cached; encoded on every core and resumable, like a text corpus (:mod:`workbench.data.text.prepare`).

The conversations are read in order and cut into shards of ~4 MB of message text; worker processes (one per
core) render and encode a shard each and write it by atomic rename, a sidecar naming the hash of its
conversations last. An interrupted preparation (Ctrl-C, kill -9) keeps its finished shards in
``chat-<key>.shards/``; the next start reads the corpus again but encodes only the shards that are missing.
The shards are then joined (:mod:`workbench.data.chat.chat_data` describes the files) and ``index.json`` is
written last. Memory is bounded: at most two shards per worker are in flight.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from workbench.config import DataConfig, chat_role_map
from workbench.data.chat.chat_data import LAST, chat_options, template_for
from workbench.data.chat.chat_templates import ChatTemplate, ChatTemplateError
from workbench.data.chat.conversations import BadRecord, ChatEncoder, ChatReader, Conversation
from workbench.data.corpus.documents import Corpus, warnings_of
from workbench.data.corpus.record_reader import FIX_RECORDS, Stats
from workbench.data.preference.preference_records import KINDS, PreferenceReader
from workbench.data.text.encode import ShardPool, join_files, worker_tokenizer
from workbench.data.text.encode import _init_worker as _init_encode_worker
from workbench.data.text.prepare import DataError, Prepared, _locked, workers_available
from workbench.data.text.tokenizer import AnyTokenizer, load_tokenizer, tokenizer_file, train_tokenizer
from workbench.faults import NO_FAULTS, Faults
from workbench.fmt import duration, human_bytes
from workbench.fs import cache_root, fsync_dir, read_json, write_atomic, write_json_atomic

CHAT_VERSION = 3           # bump when what is written changes, so caches are prepared again (3: tags.bin)
SHARD_CHARS = 4 << 20      # message text per shard: the unit of parallel and resumable encoding


@dataclass
class ChatPrepared(Prepared):
    template: ChatTemplate = field(kw_only=True)  # after Prepared's fields with defaults


def _sample_for_tokenizer(reader: ChatReader, corpus: Corpus, sample_mb: float) -> list[str]:
    """Lines of message text, the first ``sample_mb`` of the corpus's conversations (the template's own
    pieces are reserved, not learned)."""
    lines, size, budget = [], 0, int(sample_mb * 1_000_000)
    for conv in reader.conversations(corpus.sources):
        for m in conv.messages:
            lines += m.content.split("\n")
            size += len(m.content) + 1
        if size >= budget:
            break
    return lines


def _key(corpus: Corpus, cfg: DataConfig, tok: AnyTokenizer | None, vocab_size: int, sample_mb: float,
         template: ChatTemplate, all_tokens: bool, kind: str = "chat") -> str:
    parts = [CHAT_VERSION, corpus.manifest(), cfg.messages_field, sorted(chat_role_map(cfg.chat_roles).items()),
             tok.digest() if tok is not None else f"own-{vocab_size}-{sample_mb:g}", template.text,
             sorted(template.variables), all_tokens] + ([kind] if kind != "chat" else [])
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def make_reader(cfg: DataConfig, kind: str, stats: Stats | None = None) -> ChatReader:
    """The reader of a corpus of ``kind``: conversations (chat), or preference records (pairs, kto)."""
    return PreferenceReader(kind, chat_options(cfg), stats) if kind in KINDS else ChatReader(chat_options(cfg), stats)


def prepare_chat(cfg: DataConfig, corpus: Corpus, vocab_size: int, loss_on: str, given: AnyTokenizer | None,
                 model_dir: Path | None, log: Callable[[str], None] = print, workers: int | None = None,
                 shard_chars: int = SHARD_CHARS, faults: Faults = NO_FAULTS, kind: str = "chat") -> ChatPrepared:
    """The conversations of ``corpus`` as tokens and labels: from the cache when its inputs are unchanged,
    else prepared now (resuming an interrupted preparation). ``given``: the tokenizer to use (else one is
    trained on the messages' text). ``kind``: chat, or preference data (pairs, kto: each answer a conversation of
    its own, tagged; only its last assistant turn is trained, whatever ``loss_on``)."""
    template = template_for(cfg, given, model_dir)
    all_tokens = loss_on == "all" and kind == "chat"
    root = cache_root() / "data"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create cache directory {root}: {e.strerror}; set WORKBENCH_CACHE_DIR") from None
    d = root / f"{'chat' if kind == 'chat' else kind}-" \
               f"{_key(corpus, cfg, given, vocab_size, cfg.tokenizer_sample_mb, template, all_tokens, kind)}"
    index = read_json(d / "index.json")
    if index and tokenizer_file(d) is not None:
        return ChatPrepared(d, index, cached=True, template=template)
    with _locked(d.with_name(d.name + ".lock"), log):
        index = read_json(d / "index.json")  # prepared while we waited
        if index and tokenizer_file(d) is not None:
            return ChatPrepared(d, index, cached=True, template=template)
        return _prepare_locked(cfg, corpus, vocab_size, template, all_tokens, given, d, log,
                               workers or workers_available(), shard_chars, faults, kind)


def _prepare_locked(cfg: DataConfig, corpus: Corpus, vocab_size: int, template: ChatTemplate, all_tokens: bool,
                    given: AnyTokenizer | None, d: Path, log: Callable[[str], None], workers: int, shard_chars: int,
                    faults: Faults, kind: str = "chat") -> ChatPrepared:
    t0 = time.time()
    shards = d.with_name(d.name + ".shards")
    shards.mkdir(exist_ok=True)
    if given is not None:
        tok = given
    elif tokenizer_file(shards) is not None:  # trained by an interrupted start: its shards used it
        tok = load_tokenizer(shards)
    else:
        log(f"training a {vocab_size}-piece tokenizer on the messages of {corpus.description} ...")
        tok = train_tokenizer(_sample_for_tokenizer(make_reader(cfg, kind), corpus,
                                                    cfg.tokenizer_sample_mb), vocab_size)
        tok.save(shards)
    try:
        encoder = ChatEncoder(template, tok, "all" if all_tokens else "assistant")
    except ChatTemplateError as e:
        raise DataError(str(e)) from None
    done = len(list(shards.glob("*.json")))
    log(f"encoding the conversations of {corpus.description} ({human_bytes(corpus.total_bytes)}) through the chat "
        f"template {template.source} on {workers} process{'es' if workers > 1 else ''}"
        + (f", continuing after {done} finished shard(s)" if done else "") + " ...")
    stats = Stats()
    reader = make_reader(cfg, kind, stats)
    sides = _encode(reader, corpus, encoder, all_tokens, shards, workers, shard_chars, faults)
    tmp = d.with_name(f".{d.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for ext in ("tokens", "labels", "lengths", "tags"):
            join_files([shards / f"{i:06d}.{ext}" for i in range(len(sides))], tmp / f"{ext}.bin")
        skipped = stats.skipped_records + sum(s["skipped"] for s in sides)
        first_bad = stats.first_bad_record or next((s["first_bad"] for s in sides if s["first_bad"]), "")
        stats.skipped_records, stats.first_bad_record = skipped, first_bad
        index = {"format": kind, "conversations": sum(s["conversations"] for s in sides),
                 "tagged": sum(s.get("tagged", 0) for s in sides),
                 "tokens": sum(s["tokens"] for s in sides), "dtype": sides[0]["dtype"] if sides else "uint16",
                 "trained": sum(s["trained"] for s in sides), "last_trained": sum(s["last_trained"] for s in sides),
                 "skipped_records": skipped, "source": corpus.description, "vocab_size": tok.vocab_size,
                 "eod_id": tok.eod_id, "end_of_turn": encoder.end, "end_of_turn_id": encoder.end_id,
                 "template": template.source, "loss_labels": "all" if all_tokens else "assistant",
                 "warnings": warnings_of(corpus, stats), "workers": workers, "seconds": round(time.time() - t0, 2)}
        if index["conversations"] == 0:
            raise DataError(f"no conversation of {corpus.description} could be encoded ({skipped} bad record(s) "
                            f"skipped; the first: {first_bad})")
        if index["trained"] == 0:
            raise DataError(f"no token of {corpus.description} would be trained: every conversation's tokens are "
                            "masked (prompt only); check the records have assistant messages with content, or "
                            "set train.loss_on = \"all\"")
        tok.save(tmp)
        write_json_atomic(tmp / "index.json", index)
        fsync_dir(tmp)
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(shards, ignore_errors=True)
    for w in index["warnings"]:
        log(f"warning: {w}")
    log(f"encoded {index['conversations']:,} conversations, {index['tokens']:,} tokens "
        f"({index['trained'] / max(1, index['tokens']):.0%} of them trained) in {duration(time.time() - t0)}")
    return ChatPrepared(d, index, cached=False, template=template)


def _shards(reader: ChatReader, corpus: Corpus, shard_chars: int) -> Iterator[tuple[list[Conversation], str]]:
    """Consecutive conversations of about ``shard_chars`` characters of messages, and the hash of them."""
    cur: list[Conversation] = []
    h = hashlib.sha256()
    size = 0
    for conv in reader.conversations(corpus.sources):
        cur.append(conv)
        h.update(json.dumps([conv.as_dicts(), conv.tag], ensure_ascii=False).encode("utf-8", "surrogatepass"))
        size += sum(len(m.content) for m in conv.messages)
        if size >= shard_chars and len(cur) % reader.group == 0:  # a preference pair stays in one shard
            yield cur, h.hexdigest()
            cur, h, size = [], hashlib.sha256(), 0
    if cur:
        yield cur, h.hexdigest()


_ENCODER: tuple[ChatEncoder, bool, bool, int] | None = None


def _init_worker(template: ChatTemplate, all_tokens: bool, skip_bad: bool, group: int, tok_spec: tuple,
                 parent: int | None = None) -> None:
    """In each encoding process: the tokenizer (and, on Linux, dying with the parent), and the encoder."""
    global _ENCODER
    _init_encode_worker(tok_spec, parent)
    _ENCODER = (ChatEncoder(template, worker_tokenizer(), "all" if all_tokens else "assistant"), all_tokens, skip_bad,
                group)


def encode_shard(i: int, convs: list[Conversation], out: str, sha: str) -> dict:
    """Render and encode one shard; write its tokens, labels and lengths, then its sidecar."""
    if _ENCODER is None:
        raise RuntimeError("an encoding process starts with _init_worker, which sets its encoder")
    encoder, all_tokens, skip_bad, group = _ENCODER
    dtype = np.uint16 if encoder.tok.vocab_size <= 65535 else np.uint32
    ids: list[int] = []
    labels: list[int] = []
    lengths: list[int] = []
    tags: list[int] = []
    skipped, first_bad = 0, ""
    for k in range(0, len(convs), group):  # a preference pair's two conversations are kept or skipped together
        try:
            got = [(conv, encoder.encode(conv)) for conv in convs[k:k + group]]
        except BadRecord as e:
            if not skip_bad:
                raise BadRecord(f"{e}; {FIX_RECORDS}") from None
            skipped, first_bad = skipped + 1, first_bad or str(e)
            continue
        for conv, enc in got:
            ids += enc.ids
            labels += [LAST] * len(enc.ids) if all_tokens else last_turn_labels(enc.mask)
            lengths.append(len(enc.ids))
            tags.append(conv.tag)
    lab = np.asarray(labels, dtype=np.uint8)
    d = Path(out)
    write_atomic(d / f"{i:06d}.tokens", np.asarray(ids, dtype=dtype).tobytes())
    write_atomic(d / f"{i:06d}.labels", lab.tobytes())
    write_atomic(d / f"{i:06d}.lengths", np.asarray(lengths, dtype=np.uint32).tobytes())
    write_atomic(d / f"{i:06d}.tags", np.asarray(tags, dtype=np.uint8).tobytes())
    side = {"sha256": sha, "conversations": len(lengths), "tokens": len(ids), "dtype": np.dtype(dtype).name,
            "tagged": int(sum(tags)),
            "trained": int(np.count_nonzero(lab)), "last_trained": int(np.count_nonzero(lab == LAST)),
            "skipped": skipped, "first_bad": first_bad}
    write_json_atomic(d / f"{i:06d}.json", side)
    return side


def _encode(reader: ChatReader, corpus: Corpus, encoder: ChatEncoder, all_tokens: bool, out: Path, workers: int,
            shard_chars: int, faults: Faults = NO_FAULTS) -> list[dict]:
    """Every shard's sidecar, in order: kept from an earlier start where its conversations are the same."""
    args = (encoder.template, all_tokens, reader.options.skip_bad, reader.group, encoder.tok.spec())
    results: dict[int, dict] = {}

    def done(i: int, side: dict) -> None:
        results[i] = side
        faults.after_shard(len(results))

    with ShardPool(workers, _init_worker, args) as pool:
        for i, (convs, sha) in enumerate(_shards(reader, corpus, shard_chars)):
            side = read_json(out / f"{i:06d}.json")
            if side and side.get("sha256") == sha:
                results[i] = side  # finished by an earlier, interrupted start
            else:
                pool.submit(partial(done, i), encode_shard, i, convs, str(out), sha)
        pool.finish()
    return [results[i] for i in range(len(results))]


def last_turn_labels(mask: list[int]) -> list[int]:
    """A conversation's 0/1 loss mask as labels: its last run of trained tokens (the last assistant turn) 2."""
    labels = list(mask)
    j = len(labels) - 1
    while j >= 0 and not labels[j]:
        j -= 1
    while j >= 0 and labels[j]:
        labels[j] = LAST
        j -= 1
    return labels


__all__ = ["CHAT_VERSION", "ChatPrepared", "encode_shard", "last_turn_labels", "make_reader", "prepare_chat"]
