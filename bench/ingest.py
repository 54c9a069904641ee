"""Corpus ingestion at scale: encoding rate on every core vs one process, peak memory by corpus size,
and a cached start on a big corpus vs the built-in one.

    python bench/ingest.py                       # 0.1 GB and 1 GB
    python bench/ingest.py --sizes 0.1,1,3       # and 3 GB (needs ~3.5 GB of disk and ~15 min here)
    python bench/ingest.py --one-document        # also each size as one plain-text document (a .txt dump)

The corpora are generated at run time from the built-in corpus (Python's docs and stdlib) as JSONL,
one document a line, each copy numbered so no two documents are the same, in a temporary directory
(never committed). Each preparation runs as `workbench data prepare --json` in a fresh cache; its
peak memory is polled over the whole process tree (the sum of the processes' RSS, which counts
pages a forked worker shares with its parent twice: an upper bound). The rates of 1 and N
processes are measured side by side on the smallest corpus, alternating, so load on the machine
affects both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_corpus(path: Path, gb: float) -> int:
    """JSONL of builtin documents repeated (each copy numbered) up to ``gb`` GB; returns bytes written."""
    from workbench.data.corpus.documents import open_corpus
    docs, cur = [], ""
    for text, end in open_corpus("builtin", builtin_mb=6.0).pieces():
        cur += text
        if end:
            docs.append(cur)
            cur = ""
    target, size, copy = int(gb * 1e9), 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while size < target:
            for i, d in enumerate(docs):
                line = json.dumps({"text": f"[copy {copy}, document {i}]\n{d}"}) + "\n"
                f.write(line)
                size += len(line)
                if size >= target:
                    break
            copy += 1
    return path.stat().st_size


def make_text(path: Path, gb: float) -> int:
    """One plain-text document: the built-in corpus's text repeated up to ``gb`` GB; returns bytes written."""
    from workbench.data.corpus.documents import open_corpus
    text = "".join(t for t, _end in open_corpus("builtin", builtin_mb=6.0).pieces())
    target, size = int(gb * 1e9), 0
    with open(path, "w", encoding="utf-8") as f:
        while size < target:
            part = text[: target - size]
            f.write(part)
            size += len(part.encode("utf-8"))
    return path.stat().st_size


def run_tracked(cmd: list[str], env: dict) -> tuple[subprocess.CompletedProcess, int, float]:
    """Run ``cmd``; (result, peak RSS of its process tree in bytes, seconds)."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), peak, time.time() - t0


def prepare(corpus: Path, cache: Path, workers: int | None, vocab: int = 8192) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, WORKBENCH_CACHE_DIR=str(cache))
    cmd = [sys.executable, "-m", "workbench", "data", "prepare", str(corpus), "--json",
           "--set", f"model.vocab_size={vocab}"] + (["--workers", str(workers)] if workers else [])
    cp, peak, wall = run_tracked(cmd, env)
    if cp.returncode != 0:
        raise SystemExit(f"ingest: prepare failed:\n{cp.stderr[-2000:]}")
    r = json.loads(cp.stdout)
    r.update(peak_rss=peak, wall_s=wall)
    return r


def first_step_seconds(corpus: str, cache: Path, runs: Path) -> float:
    """Seconds from `workbench train` to its first training step, on a corpus already prepared."""
    env = dict(os.environ, WORKBENCH_CACHE_DIR=str(cache))
    name = f"r{time.time_ns()}"
    cmd = [sys.executable, "-m", "workbench", "train", "cpu-small", "--corpus", corpus, "--name", name,
           "--runs-dir", str(runs), "--set", "train.max_iters=1", "train.warmup_iters=0", "train.eval_iters=1",
           "train.log_interval=1", "hardware.compile=false", "data.builtin_mb=6"]
    t0 = time.time()
    cp = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if cp.returncode != 0:
        raise SystemExit(f"ingest: train failed:\n{cp.stderr[-2000:]}")
    recs = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in recs if r["kind"] == "train")
    return first["time"] - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="0.1,1", help="corpus sizes in GB, comma-separated (default 0.1,1)")
    ap.add_argument("--rate-repeat", type=int, default=2, help="alternating 1-vs-N rate measurements")
    ap.add_argument("--one-document", action="store_true",
                    help="also prepare each size as a single plain-text document (peak memory)")
    ap.add_argument("--dir", default=None, help="where to write the corpora (default: a temporary directory)")
    args = ap.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    cores = len(os.sched_getaffinity(0))
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="wb-ingest-"))
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"{cores} cores usable; corpora in {tmp}", flush=True)
    try:
        corpora = {}
        for gb in sizes:
            t0 = time.time()
            corpora[gb] = tmp / f"corpus-{gb:g}gb.jsonl"
            n = make_corpus(corpora[gb], gb)
            print(f"generated {corpora[gb].name}: {n / 1e9:.2f} GB in {time.time() - t0:.0f} s", flush=True)

        small = corpora[min(sizes)]
        print(f"\nencoding rate, {small.name}, 1 process vs {cores}, alternating:", flush=True)
        one, many = [], []
        for _ in range(args.rate_repeat):
            for w, out in ((1, one), (cores, many)):
                r = prepare(small, tmp / "cache-rate", w)
                out.append(r["encode_mb_per_s"])
                print(f"  {w} process(es): encode {r['encode_mb_per_s']:.2f} MB/s, all {r['mb_per_s']:.2f} MB/s "
                      f"({r['seconds']:.0f} s)", flush=True)
        ratios = [b / a for a, b in zip(one, many)]
        print(f"  ratio {cores} vs 1: {', '.join(f'{x:.2f}' for x in ratios)} (goal >= 1.7 on 2 cores)")

        print("\npeak memory by corpus size (all cores):", flush=True)
        results = {}
        for gb in sizes:
            r = results[gb] = prepare(corpora[gb], tmp / f"cache-{gb:g}", None)
            print(f"  {gb:g} GB: {r['documents']:,} documents, {r['tokens']:,} tokens, {r['seconds']:.0f} s, "
                  f"{r['mb_per_s']:.2f} MB/s (encode {r['encode_mb_per_s']:.2f}), "
                  f"peak RSS {r['peak_rss'] / 2**20:,.0f} MiB (process tree)", flush=True)
        lo, hi = min(sizes), max(sizes)
        grow = (results[hi]["peak_rss"] - results[lo]["peak_rss"]) / 2**20
        print(f"  growth {lo:g} -> {hi:g} GB: {grow:+,.0f} MiB (goal <= 300 MiB; all under 1.5 GB)")
        if args.one_document:
            print("\npeak memory, the corpus as one plain-text document (all cores):", flush=True)
            one = {}
            for gb in sizes:
                txt = tmp / f"one-{gb:g}gb.txt"
                make_text(txt, gb)
                r = one[gb] = prepare(txt, tmp / f"cache-one-{gb:g}", None)
                txt.unlink()
                print(f"  {gb:g} GB: {r['documents']:,} document, {r['tokens']:,} tokens, {r['seconds']:.0f} s, "
                      f"peak RSS {r['peak_rss'] / 2**20:,.0f} MiB (JSONL of many documents: "
                      f"{results[gb]['peak_rss'] / 2**20:,.0f} MiB)", flush=True)
            grow = (one[hi]["peak_rss"] - one[lo]["peak_rss"]) / 2**20
            print(f"  growth {lo:g} -> {hi:g} GB: {grow:+,.0f} MiB (goal <= 300 MiB, as for many documents)")

        print("\ncached start, seconds from `workbench train` to the first step:", flush=True)
        big_cache = tmp / f"cache-{hi:g}"  # the big corpus is prepared there; the built-in one is added
        runs = tmp / "runs"
        subprocess.run([sys.executable, "-m", "workbench", "data", "prepare", "builtin", "--set", "data.builtin_mb=6"],
                       env=dict(os.environ, WORKBENCH_CACHE_DIR=str(big_cache)), capture_output=True, check=True)
        pairs = []
        for _ in range(3):
            b = first_step_seconds("builtin", big_cache, runs)
            g = first_step_seconds(str(corpora[hi]), big_cache, runs)
            pairs.append((b, g))
            print(f"  builtin {b:.2f} s, {hi:g} GB corpus {g:.2f} s (difference {g - b:+.2f} s)", flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
