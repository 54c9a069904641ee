"""Memory savers measured side by side: the same run with fp32, 8-bit and offloaded AdamW states.

    python bench/savers.py                      # ~100 M parameters on this machine's device
    python bench/savers.py --set model.dim=768 model.n_layers=12 --steps 20
    python bench/savers.py --states fp32,8bit,offload --set hardware.device=cuda   # offload: CUDA only

Each setting is one `workbench train` in a fresh process (so each peak is its own), on the same corpus
and tokenizer, for --steps steps at batch 1 (or --set train.batch_size=N). Per setting the script prints
the trainer's peak memory (RSS on a CPU, peak allocated on a GPU) beside `workbench estimate` for the
same preset, the optimizer states the estimate counts, the checkpoint size on disk, the median
tokens/s after the first steps (the 8-bit step is compiled at its first use), and the final loss; then
the ratios to fp32. On a GPU the estimate compared is its peak allocated (what the trainer measures there),
on a CPU its total (RSS).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ~100 M parameters whose states dominate: dim 1024, 8 layers, a small vocabulary, short sequences.
MODEL = ["model.dim=1024", "model.n_layers=8", "model.n_heads=8", "model.n_kv_heads=8", "model.vocab_size=512",
         "model.seq_len=32", "model.dropout=0.0"]
RUN = ["train.batch_size=1", "train.warmup_iters=1", "train.eval_iters=1", "train.log_interval=1",
       "train.patience=0", "train.sample_prompt=''", "data.builtin_mb=0.3", "data.tokenizer_sample_mb=0.3",
       "hardware.nproc=1", "hardware.compile=false"]


def wb(*args: str) -> str:
    cp = subprocess.run([sys.executable, "-m", "workbench", *args], cwd=ROOT, capture_output=True, text=True)
    if cp.returncode != 0:
        raise SystemExit(f"savers: workbench {' '.join(args[:2])} failed:\n{cp.stderr[-2000:]}")
    return cp.stdout


def measure(runs: Path, name: str, overrides: list[str]) -> dict:
    wb("train", "cpu-small", "--name", name, "--runs-dir", str(runs), "--yes", "--set", *overrides)
    row = next(r for r in json.loads(wb("runs", "--json", "--runs-dir", str(runs))) if r["id"] == name)
    recs = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    tps = [r["tokens_per_s"] for r in train[2:] if r.get("tokens_per_s")]
    est = json.loads(wb("estimate", str(runs / name / "preset.toml"), "--json", "--no-calibrate"))
    ckpt = max((runs / name / "checkpoints").iterdir())
    mem = est["memory"]
    return {"mem_mb": row["mem_mb"],
            "est_mb": (mem["peak_allocated"] if mem["device"] == "cuda" else mem["total"]) / 2**20,
            "host_mb": mem.get("host_offload", 0) / 2**20,
            "states_mb": est["memory"]["components"]["optimizer"] / 2**20,
            "ckpt_mb": sum(f.stat().st_size for f in ckpt.iterdir()) / 2**20,
            "tokens_per_s": statistics.median(tps) if tps else None, "loss": train[-1]["loss"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides for every setting")
    ap.add_argument("--states", default="fp32,8bit", help="hardware.optimizer_states values, the first the baseline")
    args = ap.parse_args()
    base = [*MODEL, *RUN, f"train.max_iters={args.steps}", f"train.eval_interval={args.steps}",
            f"train.ckpt_interval={args.steps}", *args.set]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        states = args.states.split(",")
        for i, st in enumerate(states):
            tok = [f"data.tokenizer='{runs / states[0] / 'tokenizer.model'}'"] if i else []  # trained once
            rows[st] = measure(runs, st, [*base, f"hardware.optimizer_states={st}", *tok])
    print(f"{'states':<8}{'peak MB':>10}{'est MB':>10}{'err':>8}{'states MB':>11}{'host MB':>9}{'ckpt MB':>10}"
          f"{'tok/s':>9}{'loss':>9}")
    for name, r in rows.items():
        err = (r["mem_mb"] - r["est_mb"]) / r["est_mb"]
        tps = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-"
        print(f"{name:<8}{r['mem_mb']:>10,.0f}{r['est_mb']:>10,.0f}{err:>+8.1%}{r['states_mb']:>11,.0f}"
              f"{r['host_mb']:>9,.0f}{r['ckpt_mb']:>10,.0f}{tps:>9}{r['loss']:>9.4f}")
    base_name, a = next(iter(rows.items()))
    for name, b in list(rows.items())[1:]:
        print(f"{name} - {base_name}: peak {b['mem_mb'] - a['mem_mb']:+,.0f} MB measured, "
              f"{b['est_mb'] - a['est_mb']:+,.0f} MB estimated; checkpoint x{b['ckpt_mb'] / a['ckpt_mb']:.2f}"
              + (f"; tokens/s x{b['tokens_per_s'] / a['tokens_per_s']:.2f}"
                 if a["tokens_per_s"] and b["tokens_per_s"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
