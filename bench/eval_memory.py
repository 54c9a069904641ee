"""Scoring memory does not grow with the task, and how fast it goes: `workbench eval` on 100 and on 10,000
four-way multiple-choice records (contexts and choices drawn from the built-in docs-cloze items, so each record
is a real ~100-token context), each in its own process, peak RSS side by side; then an exact-match task.

    python bench/eval_memory.py RUN [--runs-dir runs] [--sizes 100,10000]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def write_mc(path: Path, n: int) -> None:
    from workbench.data.tasks.builtin_tasks import cloze_task
    items = cloze_task().items
    rng = random.Random(n)
    with open(path, "w") as f:
        for i in range(n):
            it = items[rng.randrange(len(items))]
            choices = list(it.choices)
            rng.shuffle(choices)
            f.write(json.dumps({"query": it.context, "choices": choices, "gold": choices.index(it.choices[it.gold])})
                    + "\n")


def write_gen(path: Path, n: int) -> None:
    from workbench.data.tasks.builtin_tasks import cloze_task
    with open(path, "w") as f:
        for it in cloze_task().items[:n]:
            f.write(json.dumps({"prompt": it.context, "answer": it.choices[it.gold]}) + "\n")
    path.with_suffix(".toml").write_text('until = ["\\n"]\nmax_new_tokens = 8\n')


def child(argv: list[str]) -> None:
    """Run the CLI in this process, then print its peak RSS (MiB) and wall time as JSON on stderr."""
    from workbench.cli import main
    t0 = time.time()
    rc = main(argv)
    print(json.dumps({"rc": rc, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "seconds": time.time() - t0}), file=sys.stderr)


def measure(run: str, runs_dir: str, task: Path) -> dict:
    cp = subprocess.run([sys.executable, __file__, "--child", "eval", run, "--runs-dir", runs_dir, "--task", str(task),
                         "--no-save", "--json", "--device", "cpu"], capture_output=True, text=True, check=True)
    m = json.loads(cp.stderr.strip().splitlines()[-1])
    t = json.loads(cp.stdout)["checkpoints"][0]["tasks"][0]
    return {**m, "n": t["n"], "items_per_s": t["items_per_s"], "score": t["score"], "contains": t.get("contains")}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--runs-dir", default="runs")
    ap.add_argument("--sizes", default="100,10000")
    ap.add_argument("--gen", type=int, default=100, help="exact-match records (0: none)")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        res = {}
        for n in sizes:
            write_mc(Path(tmp) / f"mc{n}.jsonl", n)
            res[n] = measure(a.run, a.runs_dir, Path(tmp) / f"mc{n}.jsonl")
            print(f"multiple choice, {n:,} records x 4 choices: peak RSS {res[n]['peak_rss_mib']:.0f} MiB, "
                  f"{res[n]['items_per_s']:.1f} records/s, {res[n]['seconds']:.0f} s", flush=True)
        lo, hi = res[sizes[0]], res[sizes[-1]]
        print(f"peak RSS {sizes[-1]:,} / {sizes[0]:,} records: {hi['peak_rss_mib'] / lo['peak_rss_mib']:.3f}")
        if a.gen:
            write_gen(Path(tmp) / "gen.jsonl", a.gen)
            g = measure(a.run, a.runs_dir, Path(tmp) / "gen.jsonl")
            print(f"exact match, {g['n']} records (greedy, up to 8 new tokens): {g['items_per_s']:.1f} records/s, "
                  f"peak RSS {g['peak_rss_mib']:.0f} MiB, exact {g['score']:.3f}, contains {g['contains']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
