"""Any corpus, any size: every input kind, the cache, bad input, parallel and resumable encoding."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.support.cli import REPO, wb
from tests.support.files import tokens_path
from workbench.config import DataConfig
from workbench.data.corpus.documents import CorpusError, open_corpus
from workbench.data.preset_data import prepare_data

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]


def make_docs(n: int, seed: int = 0, words: list[str] = WORDS) -> list[str]:
    rng = random.Random(seed)
    return [f"Doc {i}.\n" + " ".join(rng.choice(words) for _ in range(rng.randint(20, 80))) + "\n"
            for i in range(n)]


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> bytes:
    raw = "".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()
    path.write_bytes(raw)
    return raw


def text_of(spec, **kw) -> tuple[list[str], int]:
    """The documents a corpus yields (joined pieces) and how many."""
    docs, cur = [], ""
    for text, end in open_corpus(spec, **kw).pieces():
        cur += text
        if end:
            docs.append(cur)
            cur = ""
    return docs, len(docs)


# ----------------------------------------------------------------------------- every input kind

def test_each_input_kind_yields_its_documents(tmp_path):
    docs = make_docs(50)
    write_jsonl(tmp_path / "a.jsonl", docs)
    raw = (tmp_path / "a.jsonl").read_bytes()
    (tmp_path / "b.json").write_bytes(raw)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    (tmp_path / "a.jsonl.xz").write_bytes(lzma.compress(raw))
    pq.write_table(pa.table({"text": docs, "n": list(range(50))}), tmp_path / "a.parquet")
    for name in ("a.jsonl", "b.json", "a.jsonl.gz", "a.jsonl.zst", "a.jsonl.xz", "a.parquet"):
        assert text_of(str(tmp_path / name))[0] == docs, name
    # text: a file is one document, compressed or not
    (tmp_path / "t.txt").write_text("".join(docs))
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress("".join(docs).encode()))
    assert text_of(str(tmp_path / "t.txt"))[0] == ["".join(docs)]
    assert text_of(str(tmp_path / "t.txt.gz"))[0] == ["".join(docs)]
    # a field other than "text", a glob, a list, a directory (recursive, hidden files skipped)
    write_jsonl(tmp_path / "c.jsonl", docs[:5], field="body")
    assert text_of(str(tmp_path / "c.jsonl"), text_field="body")[0] == docs[:5]
    assert text_of(str(tmp_path / "a.jsonl*"))[1] == 200  # .jsonl, .jsonl.gz, .jsonl.xz, .jsonl.zst
    assert text_of([str(tmp_path / "a.parquet"), str(tmp_path / "t.txt")])[1] == 51
    d = tmp_path / "dir" / "sub"
    d.mkdir(parents=True)
    write_jsonl(d / "x.jsonl", docs[:3])
    (d / "y.txt").write_text("plain text\n")
    (d / ".hidden.txt").write_text("never read\n")
    assert text_of(str(tmp_path / "dir"))[0] == [*docs[:3], "plain text\n"]
    # long documents stream in pieces, cut after a newline, and join back exactly
    big = "line of text\n" * 200_000
    (tmp_path / "big.txt").write_text(big)
    pieces = list(open_corpus(str(tmp_path / "big.txt")).pieces())
    assert len(pieces) > 1 and all(t.endswith("\n") for t, _ in pieces) and [e for _, e in pieces][-1]
    assert "".join(t for t, _ in pieces) == big


def test_builtin_corpus_is_documents_of_python_docs_and_stdlib():
    docs, n = text_of("builtin", builtin_mb=0.3)
    assert n > 10 and 250_000 <= sum(len(d) for d in docs) <= 300_000


# ----------------------------------------------------------------------------- one-line documents

def one_line_docs(n: int, words_each: int, seed: int = 0) -> list[str]:
    """Documents with no newline in them (reviews, messages, Q&A pairs): the most common shape of user data.
    Each quarter of them is written in words of its own alphabet, so a tokenizer that learnt from only part
    of the corpus spells the others' words letter by letter."""
    rng = random.Random(seed)
    alphabets = ["abcdef", "ghijkl", "mnopqr", "stuvwx"]
    words = [["".join(rng.choice(a) for _ in range(rng.randint(3, 7))) for _ in range(60)] for a in alphabets]
    return [f"Review {i}: " + " ".join(rng.choice(words[i * 4 // n]) for _ in range(words_each)) + "."
            for i in range(n)]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
@pytest.mark.parametrize("shape", ["short", "long"])
def test_one_line_documents_train_a_tokenizer(tmp_path, kind, shape):
    # short: 3,000 reviews of ~15 words; long: 12 documents of ~60 KB each, every one past sentencepiece's
    # 32 KB sentence limit (before the fix each run of documents became one line it dropped, then it had none)
    docs = one_line_docs(3000, 15) if shape == "short" else one_line_docs(12, 10_000, seed=1)
    path = tmp_path / f"reviews.{kind}"
    if kind == "jsonl":
        write_jsonl(path, docs)
    else:
        pq.write_table(pa.table({"text": docs}), path)
    cp = wb("data", "prepare", str(path), "--vocab-size", "1024", "--json", cwd=tmp_path,
            env={"WORKBENCH_CACHE_DIR": str(tmp_path / "cache")})
    assert cp.returncode == 0, cp.stderr
    out = json.loads(cp.stdout)
    assert out["documents"] == len(docs)
    from workbench.data.text.tokenizer import load_tokenizer
    tok = load_tokenizer(Path(out["cache_dir"]))
    assert tok.vocab_size == 1024
    # it learnt the documents' words (a tokenizer trained on nothing would spell them in bytes)
    for doc in (docs[0], docs[len(docs) // 3], docs[2 * len(docs) // 3], docs[-1]):   # every quarter learnt
        assert len(tok.encode(doc)) < len(doc.encode()) / 2.5
    assert tok.decode(tok.encode(docs[7])) == docs[7]


def test_a_sample_line_past_the_sentence_limit_is_cut_at_spaces_not_dropped():
    from workbench.data.text.tokenizer import SENTENCE_CHARS, split_long_line
    line = " ".join(f"w{i}" for i in range(5000))
    parts = split_long_line(line)
    assert "".join(parts) == line and len(parts) > 1
    assert all(len(p) <= SENTENCE_CHARS for p in parts)
    assert all(p.startswith(" ") for p in parts[1:])            # cut before a space: no word split in two
    assert split_long_line("x" * (SENTENCE_CHARS * 2 + 5)) == ["x" * SENTENCE_CHARS] * 2 + ["x" * 5]


# ----------------------------------------------------------------------------- bad input

def _cli_prepare(tmp_path, *corpus, env_cache: Path, extra=()):
    return wb("data", "prepare", *corpus, "--set", "model.vocab_size=300", *extra, cwd=tmp_path,
              env={"WORKBENCH_CACHE_DIR": str(env_cache)})


def _nothing_half_written(cache: Path) -> None:
    """No tokens, index or temporary file of a preparation that failed."""
    left = [p for p in cache.rglob("*") if p.name in ("tokens.bin", "index.json") or p.name.endswith(".tmp")]
    assert left == []


BAD = {
    "not_json": ("bad.jsonl", lambda p: p.write_text('{"text": "ok"}\n{"text": oops}\n'),
                 "bad.jsonl, line 2: not valid JSON"),
    "no_field": ("nofield.jsonl", lambda p: p.write_text('{"text": "ok"}\n{"body": "x", "title": "y"}\n'),
                 "nofield.jsonl, line 2: the record has no field 'text' (it has: body, title)"),
    "not_string": ("num.jsonl", lambda p: p.write_text('{"text": 5}\n'),
                   "num.jsonl, line 1: field 'text' is a number, not a string"),
    "no_column": ("nocol.parquet", lambda p: pq.write_table(pa.table({"body": ["x"], "n": [1]}), p),
                  "nocol.parquet has no column 'text' (its columns: body, n); set data.text_field"),
    "truncated_gz": ("t.jsonl.gz", lambda p: p.write_bytes(gzip.compress(os.urandom(200_000))[:50_000]),
                     "t.jsonl.gz is truncated or corrupt (gz: Compressed file ended"),
    "truncated_zst": ("t.txt.zst", lambda p: p.write_bytes(zstandard.ZstdCompressor().compress(
        "".join(f"x {random.random()}\n" for _ in range(50_000)).encode())[:30_000]),
        "t.txt.zst is truncated or corrupt (zst: the file ends in the middle of a zstd frame"),
    "corrupt_xz": ("c.txt.xz", lambda p: p.write_bytes(b"not xz at all" * 10), "c.txt.xz is truncated or corrupt"),
    "json_array": ("arr.json", lambda p: p.write_text('[{"text": "a"}, {"text": "b"}]\n'),
                   "arr.json is one JSON array, not JSON lines"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2_and_nothing_half_written(tmp_path, case):
    name, make, expected = BAD[case]
    make(tmp_path / name)
    cache = tmp_path / "cache"
    cp = _cli_prepare(tmp_path, name, env_cache=cache)
    assert cp.returncode == 2, cp.stderr
    line = cp.stderr.strip().splitlines()[-1]
    assert line.startswith("workbench: error: ") and expected in line, cp.stderr
    _nothing_half_written(cache)


def test_bad_paths(tmp_path):
    cache = tmp_path / "cache"
    cp = _cli_prepare(tmp_path, "nothing*.jsonl", env_cache=cache)
    assert cp.returncode == 2 and "corpus glob 'nothing*.jsonl' matches no files" in cp.stderr
    d = tmp_path / "d"
    d.mkdir()
    (d / "ok.txt").write_text("some text\n" * 100)
    (d / "gone.txt").symlink_to(tmp_path / "missing.txt")  # a file in the directory that cannot be read
    cp = _cli_prepare(tmp_path, "d", env_cache=cache)
    assert cp.returncode == 2 and "cannot read corpus file" in cp.stderr and "gone.txt" in cp.stderr
    (d / "gone.txt").unlink()
    (d / "sub").mkdir()
    (d / "sub" / "loop").symlink_to(d)
    cp = _cli_prepare(tmp_path, "d", env_cache=cache)
    assert cp.returncode == 2 and "contains a symbolic-link loop" in cp.stderr, cp.stderr
    _nothing_half_written(cache)


def test_skip_bad_records_counts_them(tmp_path, capsys):
    docs = make_docs(40)
    lines = [json.dumps({"text": d}) for d in docs]
    lines[3], lines[7], lines[9] = "{broken", json.dumps({"body": "x"}), json.dumps({"text": None})
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match="line 4: not valid JSON"):
        text_of(str(tmp_path / "m.jsonl"))
    got, n = text_of(str(tmp_path / "m.jsonl"), skip_bad=True)
    assert n == 37 and got == [d for i, d in enumerate(docs) if i not in (3, 7, 9)]
    msgs = []
    prepare_data(DataConfig(corpus=str(tmp_path / "m.jsonl"), skip_bad_records=True), 300, 16, log=msgs.append)
    assert any("skipped 3 bad record(s)" in m and "line 4" in m for m in msgs), msgs


# ----------------------------------------------------------------------------- the cache

def test_cached_start_reads_no_corpus_bytes_and_a_change_is_reencoded_with_a_reason(tmp_path):
    docs = make_docs(400)
    write_jsonl(tmp_path / "c.jsonl", docs)
    cfg = DataConfig(corpus=str(tmp_path / "c.jsonl"))
    first = prepare_data(cfg, 300, 16, log=lambda m: None)
    assert not first.cached and first.documents == 400
    # The tokens hold every document, each followed by the end-of-document id.
    ids = np.asarray(first.tokens)
    eod = first.tokenizer.eod_id
    assert int((ids == eod).sum()) == 400 and ids[-1] == eod
    assert first.tokenizer.decode([int(t) for t in ids]) == "".join(docs)
    # A start whose inputs are unchanged opens no corpus file (an audit hook sees every open(); hooks cannot be
    # removed, so it runs in a process of its own)
    script = textwrap.dedent("""
        import json, os, sys
        opened = []
        sys.addaudithook(lambda event, args: opened.append(os.fsdecode(args[0])) if event == "open" and args
                         and isinstance(args[0], (str, bytes, os.PathLike)) else None)
        from workbench.config import DataConfig
        from workbench.data.preset_data import prepare_data
        data = prepare_data(DataConfig(corpus=sys.argv[1]), 300, 16, log=lambda m: None)
        print(json.dumps({"cached": data.cached, "opened": [p for p in opened if sys.argv[1] in p]}))
    """)
    cp = subprocess.run([sys.executable, "-c", script, str(tmp_path / "c.jsonl")], capture_output=True, text=True,
                        check=True, cwd=REPO, env=dict(os.environ))
    assert json.loads(cp.stdout.strip().splitlines()[-1]) == {"cached": True, "opened": []}
    second = prepare_data(cfg, 300, 16, log=lambda m: None)
    assert second.cached and np.array_equal(np.asarray(second.tokens), ids)
    # A changed file is prepared again, and the log says why.
    write_jsonl(tmp_path / "c.jsonl", docs + make_docs(10, seed=1))
    msgs: list[str] = []
    third = prepare_data(cfg, 300, 16, log=msgs.append)
    assert not third.cached and third.documents == 410
    assert any("corpus changed since it was encoded" in m and "c.jsonl changed (size" in m for m in msgs), msgs


def test_validation_is_the_last_documents_and_stable(tmp_path):
    docs = make_docs(200)
    write_jsonl(tmp_path / "v.jsonl", docs)
    cfg = DataConfig(corpus=str(tmp_path / "v.jsonl"), val_fraction=0.1)
    data = prepare_data(cfg, 300, 16, log=lambda m: None)
    eod = data.tokenizer.eod_id
    assert data.tokens[data.n_train - 1] == eod  # the split is at a document boundary
    val_docs = data.tokenizer.decode([int(t) for t in data.val])
    k = int((np.asarray(data.val) == eod).sum())
    assert 10 <= k <= 30 and val_docs == "".join(docs[-k:])  # ~10 % of the tokens, whole documents, the last ones
    assert prepare_data(cfg, 300, 16, log=lambda m: None).n_train == data.n_train


def test_tokenizer_sample_comes_from_the_whole_corpus(tmp_path):
    """A corpus whose second half is written in other letters: a tokenizer trained on its head alone
    would know none of them (they would fall back to bytes); one trained on a sample of the whole
    corpus has pieces for both halves."""
    rng = random.Random(3)

    def words(letters: str, n: int) -> list[str]:
        return [" ".join("".join(rng.choice(letters) for _ in range(rng.randint(3, 7))) for _ in range(60)) + "\n"
                for _ in range(n)]
    write_jsonl(tmp_path / "s.jsonl", words("abcdefghijklm", 2500) + words("nopqrstuvwxyz", 2500))
    data = prepare_data(DataConfig(corpus=str(tmp_path / "s.jsonl"), tokenizer_sample_mb=0.2), 400, 16,
                        log=lambda m: None)
    pieces = {data.tokenizer.sp.id_to_piece(i) for i in range(data.tokenizer.vocab_size)}
    assert set("abcdefghijklm") <= pieces and set("nopqrstuvwxyz") <= pieces
    assert any(len(p) > 1 and set(p) <= set("nopqrstuvwxyz") for p in pieces)  # merges learned from the tail too


# ----------------------------------------------------------------------------- parallel and resumable

_PREPARE = """
import json, os, sys
from workbench.config import DataConfig
from workbench.data.preset_data import prepare_data
from workbench.faults import Faults

KEPT = json.loads(os.environ.get("KEPT_SHARD_FILES", "{}"))  # path -> [inode, mtime_ns] before this start


def same(path, ino, mtime_ns):
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_ino, st.st_mtime_ns) == (ino, mtime_ns)


class Watched(Faults):
    def after_shard(self, shards_written):
        # a line per shard this start encodes, naming any file of an earlier start's shards not left as it was
        changed = [os.path.basename(p) for p, (i, m) in KEPT.items() if not same(p, i, m)]
        print("ENCODED", shards_written, *changed, flush=True)
        super().after_shard(shards_written)


d = prepare_data(DataConfig(corpus=sys.argv[1]), 300, 16, log=lambda m: print(m, flush=True),
                 workers=int(sys.argv[2]), shard_chars=int(sys.argv[3]), faults=Watched.from_env())
print("TOKENS", d.tokenizer_path.parent / "tokens.bin", flush=True)
"""


def _prepare_in_subprocess(corpus: Path, cache: Path, workers: int, env: dict | None = None,
                           wait: bool = True) -> subprocess.Popen | str:
    e = dict(os.environ, WORKBENCH_CACHE_DIR=str(cache), **(env or {}))
    proc = subprocess.Popen([sys.executable, "-c", _PREPARE, str(corpus), str(workers), str(64 << 10)],
                            env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out


@pytest.mark.slow
def test_parallel_equals_serial_and_a_killed_preparation_resumes_bit_for_bit(tmp_path):
    corpus = tmp_path / "r.jsonl"
    write_jsonl(corpus, make_docs(4000))  # ~1.5 MB: about 24 shards of 64 K characters
    serial = tokens_path(_prepare_in_subprocess(corpus, tmp_path / "c1", workers=1)).read_bytes()
    parallel_out = _prepare_in_subprocess(corpus, tmp_path / "c2", workers=2)
    assert tokens_path(parallel_out).read_bytes() == serial
    # kill -9 once 5 shards are on disk, then start again: it continues and ends with the same tokens
    marker = tmp_path / "paused"
    proc = _prepare_in_subprocess(corpus, tmp_path / "c3", workers=2, wait=False, env={
        "WORKBENCH_TEST_PAUSE_AFTER_SHARD": "5", "WORKBENCH_TEST_PAUSE_MARKER": str(marker),
        "WORKBENCH_TEST_PAUSE_SECONDS": "60"})
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)  # its encoding processes die with it (a signal on its exit): let a last write land
    finished = sorted((tmp_path / "c3").rglob("shards/*.json"))  # a sidecar makes a shard count
    assert len(finished) >= 5 and not list((tmp_path / "c3").rglob("tokens.bin"))
    kept = {str(f): [f.stat().st_ino, f.stat().st_mtime_ns] for s in finished for f in (s, s.with_suffix(".bin"))}
    out = _prepare_in_subprocess(corpus, tmp_path / "c3", workers=2, env={"KEPT_SHARD_FILES": json.dumps(kept)})
    assert f"continuing after {len(finished)} finished shard(s)" in out and tokens_path(out).read_bytes() == serial
    # It encoded only the shards not finished before, and left each finished one as it was (same inode, same
    # modification time) while it encoded the rest.
    n_shards = len(json.loads((tokens_path(out).parent / "index.json").read_text())["shards"])
    encoded = [ln.split()[1:] for ln in out.splitlines() if ln.startswith("ENCODED")]
    assert not {name for line in encoded for name in line[1:]}, f"finished shards rewritten: {encoded}"
    assert [int(line[0]) for line in encoded] == list(range(1, n_shards - len(finished) + 1)), \
        f"{len(encoded)} shards encoded, {n_shards - len(finished)} unfinished of {n_shards}"


@pytest.mark.slow
def test_a_file_that_changes_while_it_is_encoded_is_refused(tmp_path):
    corpus = tmp_path / "g.jsonl"
    write_jsonl(corpus, make_docs(4000))
    marker = tmp_path / "paused"
    proc = _prepare_in_subprocess(corpus, tmp_path / "c", workers=1, wait=False, env={
        "WORKBENCH_TEST_PAUSE_AFTER_SHARD": "2", "WORKBENCH_TEST_PAUSE_MARKER": str(marker),
        "WORKBENCH_TEST_PAUSE_SECONDS": "2"})
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    with open(corpus, "a") as f:
        f.write(json.dumps({"text": "appended while encoding"}) + "\n")
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "g.jsonl changed while it was being encoded" in err, err
    assert not list((tmp_path / "c").rglob("tokens.bin"))


@pytest.mark.slow
def test_a_detached_run_prepares_its_corpus_in_the_trainer_with_progress_in_status(tmp_path):
    from tests.support.cli import tiny
    corpus = tmp_path / "d.jsonl"
    write_jsonl(corpus, make_docs(30000))  # ~10 MB: a few seconds of encoding
    cp = wb("train", "cpu-small", "--corpus", str(corpus), "--name", "d", "--runs-dir", str(tmp_path / "runs"),
            "--detach", *tiny("train.max_iters=3", "model.vocab_size=300"),
            env={"WORKBENCH_CACHE_DIR": str(tmp_path / "c")})
    assert cp.returncode == 0, cp.stderr
    status = tmp_path / "runs" / "d" / "status.json"
    seen, st = [], {}
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            st = json.loads(status.read_text())
        except (OSError, ValueError):
            continue
        if st.get("preparing"):
            seen.append(st["preparing"])
        if st.get("state") in ("finished", "failed", "crashed"):
            break
        time.sleep(0.05)
    assert st.get("state") == "finished", st
    assert st.get("preparing") is None and seen, st  # it was reported while it lasted, and cleared after
    assert {p["phase"] for p in seen} <= {"scanning", "encoding"}
    assert all(0 <= p["fraction"] <= 1 and p["total_bytes"] == corpus.stat().st_size for p in seen)


def test_a_new_tokenizer_on_an_unchanged_corpus_says_so(tmp_path):
    """Encoding the same files again for another tokenizer is not a changed corpus (issue 31: fine-tuning on a
    corpus another run had prepared said "corpus changed since it was encoded ... its files or options")."""
    f = tmp_path / "notes.txt"
    f.write_text("".join(f"note {i}: the quick brown fox jumps over the lazy dog {i * 7}\n" for i in range(800)))
    env = {"WORKBENCH_CACHE_DIR": str(tmp_path / "cache")}
    wb("data", "prepare", str(f), "--vocab-size", "300", "--set", "data.tokenizer_sample_mb=0.1", env=env, check=True)
    cp = wb("data", "prepare", str(f), "--vocab-size", "320", "--set", "data.tokenizer_sample_mb=0.1", env=env,
            check=True)
    out = cp.stdout + cp.stderr
    assert "corpus changed" not in out, out
    assert "the corpus is unchanged; it has not been encoded with a 320-piece tokenizer" in out, out
