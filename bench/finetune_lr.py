"""The fine-tuning learning rate: chat-tune ONE pretrained cpu-small checkpoint with `--init-from` at several rates,
full fine-tune and LoRA, the same steps and data for each, at one or more seeds, and score each on held-out
conversations.

    python bench/finetune_lr.py --out DIR --pretrain 400 --steps 400 --held 200 --seeds 1337,1 --jobs 2 \
        --full 3e-4,1e-3,2e-3 --lora 1e-3,3e-3   # docs/reference/fine-tuning.md's table at 400 steps
    python bench/finetune_lr.py --out DIR --steps 150 --jobs 4   # the first table, at 150 steps and one seed
    python bench/finetune_lr.py --quick              # fewer steps, rates and held-out conversations

Everything but the rates is bench/chat_sft.py's (imported, not copied): its pretraining of cpu-small on the
built-in corpus (model.seq_len 128; never sees the chat template), its 2,000 generated training conversations
(tests/support/chat.py, seed 0) and held-out ones (seed 1), its real CLI in a subprocess (`chat_sft.train`) and its
greedy exact match (`chat_sft.score`).

What "the rate" is: a fine-tune trains with AdamW even where the preset says Muon (workbench/plan/recipe/finetune.py:
Muon's fixed-size updates at muon_lr would overwrite pretrained weights; LoRA's adapters are not whole matrices), so
each run's one rate is AdamW's `train.lr`, over every trained weight; `train.min_lr` is scaled with it (the preset's
ratio, cpu-small's 1e-4 / 3e-3), so every run has the preset's wsd shape (stable, then linear over the last 40 %) and
only the scale differs. Full and LoRA both keep the preset's wsd (what `train --init-from` gives them); LoRA at the
preset's rank 8, alpha 16. --seeds gives each rate one fine-tune per seed (`train.seed`: the order of the
training windows, and LoRA's adapter init; the pretrained checkpoint is the same one for all), then a row of the
seeds' mean.

Per run it reports the held-out exact match of the last checkpoint (overall and by kind), the final val loss (on the
answers of the training conversations' val split) and the loss on the built-in text the model was pretrained on
(`workbench eval --corpus builtin`, its first 50 windows: how much of the pretraining the rate kept), then a markdown
table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import chat_sft  # noqa: E402

from tests.support.chat import conversations, write_jsonl  # noqa: E402

FULL = (3e-3, 1e-3, 3e-4, 1e-4, 3e-5)
LORA = (3e-3, 1e-3, 3e-4)


def preset_rates() -> tuple[float, float]:
    """cpu-small's own (lr, min_lr): the from-scratch rate a fine-tune took until now, and its decay's floor."""
    from workbench.config import resolve_preset
    t = resolve_preset("cpu-small", []).train
    return t.lr, t.min_lr


def pretrain(out: Path, steps: int) -> float:
    """chat_sft's pretraining step (its run named "pre", the sets its main() gives it), kept in --out."""
    return chat_sft.train(out, "pre", "builtin", [*chat_sft.COMMON, f"train.max_iters={steps}", "train.log_interval=50",
                                         f"train.warmup_iters={min(40, steps // 4)}", f"train.eval_interval={steps}"])


def text_loss(out: Path, run_dir: Path, windows: int = 50) -> float:
    """The latest checkpoint's loss on the built-in corpus (`workbench eval --corpus builtin`, its first ``windows``
    windows): what the pretraining taught, kept or forgotten."""
    cp = subprocess.run([sys.executable, "-m", "workbench", "eval", str(run_dir), "--corpus", "builtin", "--limit",
                         str(windows), "--json", "--no-save"], cwd=ROOT, capture_output=True, text=True,
                        stdin=subprocess.DEVNULL, env=dict(os.environ, WORKBENCH_CACHE_DIR=str(out / "cache")))
    if cp.returncode != 0:
        raise SystemExit(f"finetune_lr: eval of {run_dir} failed ({cp.returncode}):\n{cp.stderr[-2000:]}")
    return float(json.loads(cp.stdout)["checkpoints"][0]["text"]["loss"])


def fine_tune(out: Path, name: str, corpus: str, method: str, lr: float, min_ratio: float, steps: int,
              n_held: int, seed: int | None = None) -> dict:
    """One chat fine-tune of the pretrained run at ``lr`` (min_lr at the preset's ratio), its last checkpoint scored
    on the first ``n_held`` held-out conversations (in a process of its own: fine-tunes may run side by side). The
    result is kept in the run's folder (finetune_lr.json): a rerun on the same --out with the same held-out count
    reuses it rather than scoring the finished run again."""
    sets = [*chat_sft.COMMON, f"train.finetune={method}", f"train.lr={lr:g}", f"train.min_lr={lr * min_ratio:.3g}",
            f"train.max_iters={steps}", f"train.warmup_iters={max(1, steps // 10)}", f"train.eval_interval={steps}",
            f"train.ckpt_interval={steps}", "train.log_interval=50",
            *([f"train.seed={seed}"] if seed is not None else [])]
    wall = chat_sft.train(out, name, corpus, sets, init_from="pre")
    from workbench.config import load_preset_file
    run_dir = out / "runs" / name
    kept = run_dir / "finetune_lr.json"
    finished = json.loads((run_dir / "status.json").read_text())["finished"]
    if kept.is_file():
        old = json.loads(kept.read_text())
        if (old.get("n_held"), old.get("finished")) == (n_held, finished):
            return old["result"]
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in recs if r.get("kind") == "eval"]
    result = dict(method=method, lr=lr, seed=seed, wall=wall, val0=evals[0]["val_loss"], val=evals[-1]["val_loss"],
                  optimizer=load_preset_file(run_dir / "preset.toml").train.optimizer,
                  scores=chat_sft.score_in_process(run_dir, n_held), text=text_loss(out, run_dir))
    kept.write_text(json.dumps(dict(n_held=n_held, finished=finished, result=result)))
    return result


def rates(given: str | None, default: tuple[float, ...]) -> list[float]:
    """--full's or --lora's rates: comma-separated, "none" for none, or the default."""
    if given is None:
        return list(default)
    return [] if given.strip().lower() == "none" else [float(x) for x in given.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps, rates and held-out conversations")
    ap.add_argument("--pretrain", type=int, default=None, help="pretraining steps (default 300; quick 100)")
    ap.add_argument("--steps", type=int, default=None, help="fine-tuning steps, every run (default 200; quick 60)")
    ap.add_argument("--held", type=int, default=None, help="held-out conversations (default 100; quick 40)")
    ap.add_argument("--full", default=None, help="full fine-tune rates, comma-separated, or none (default "
                                                 + ",".join(f"{x:g}" for x in FULL) + ")")
    ap.add_argument("--lora", default=None, help="LoRA rates, or none (default "
                                                 + ",".join(f"{x:g}" for x in LORA) + ")")
    ap.add_argument("--seeds", default=None, help="train.seed of the fine-tunes, comma-separated: one run per rate "
                                                   "and seed, and the seeds' mean (default: the preset's, one run)")
    ap.add_argument("--jobs", type=int, default=1, help="fine-tunes at once, each a process of one thread (scores at a "
                                                        "fixed number of steps do not depend on the machine's load)")
    ap.add_argument("--out", type=Path, default=None, help="runs and cache here (default: a new temp dir); runs "
                                                           "finished in it are kept")
    a = ap.parse_args()
    pre_steps = a.pretrain or (100 if a.quick else 300)
    steps = a.steps or (60 if a.quick else 200)
    n_held = a.held or (40 if a.quick else 100)
    full = rates(a.full, FULL[::2] if a.quick else FULL)
    lora = rates(a.lora, LORA[::2] if a.quick else LORA)
    seeds: list[int | None] = [int(x) for x in a.seeds.split(",")] if a.seeds else [None]
    out = (a.out or Path(tempfile.mkdtemp(prefix="wb-ft-lr-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    corpus = str(write_jsonl(out / "train.jsonl", conversations(2000, seed=0)))
    held = conversations(n_held, seed=1)
    preset_lr, preset_min = preset_rates()
    ratio = preset_min / preset_lr
    print(f"finetune_lr in {out}: pretrain {pre_steps} steps, fine-tunes {steps} steps, {n_held} held out; "
          f"full at {', '.join(f'{x:g}' for x in full) or 'none'}; "
          f"LoRA at {', '.join(f'{x:g}' for x in lora) or 'none'}; "
          f"seeds {', '.join('preset' if x is None else str(x) for x in seeds)}; "
          f"min_lr = lr x {ratio:.3g} (cpu-small's {preset_min:g} / {preset_lr:g})", flush=True)
    pre_s = pretrain(out, pre_steps)
    before = chat_sft.score(out / "runs" / "pre", "latest", held)
    before_text = text_loss(out, out / "runs" / "pre")
    if a.jobs > 1:  # one thread each (the runs inherit it): only the order of float sums differs
        os.environ["OMP_NUM_THREADS"] = "1"
    # seed-major: a bench stopped early has every rate at the first seeds (finished runs are kept in --out)
    arms = [(method, lr, seed) for seed in seeds for method, rates in (("full", full), ("lora", lora))
            for lr in rates]

    def one(arm: tuple[str, float, int | None]) -> dict:
        method, lr, seed = arm
        r = fine_tune(out, f"{method}-{lr:g}" + (f"-s{seed}" if seed is not None else ""), corpus, method, lr, ratio,
                      steps, n_held, seed)
        print(f"  {method} lr {lr:g}" + (f" seed {seed}" if seed is not None else "")
              + f" ({r['optimizer']}): exact match {r['scores']['all']:.1f} %, "
              f"val loss {r['val0']:.3f} -> {r['val']:.3f}, built-in text loss {r['text']:.3f}", flush=True)
        return r

    with ThreadPoolExecutor(max(1, a.jobs)) as pool:  # each a subprocess: threads only wait
        results = list(pool.map(one, arms))
    print(f"\npretrained cpu-small ({pre_steps} steps of builtin, {pre_s:.0f} s): exact match {before['all']:.1f} % "
          f"on {n_held} held-out conversations, loss {before_text:.3f} on the built-in text; each fine-tune {steps} "
          f"steps (warmup {max(1, steps // 10)}, wsd), AdamW, "
          + ("the same seed" if seeds == [None] else f"seeds {', '.join(str(x) for x in seeds)}")
          + ", batch 8 packed rows of 128\n")
    print("| method | lr (min_lr) | seed | held-out exact match | reverse / sort / colour | val loss (step 0 -> end) | "
          "built-in text loss | wall |")
    print("|---|---|---|---|---|---|---|---|")
    rows = sorted(results, key=lambda r: (r["method"], -r["lr"]))
    for r in rows:
        s = r["scores"]
        print(f"| {'full' if r['method'] == 'full' else 'LoRA r8'} | {r['lr']:g} ({r['lr'] * ratio:.2g}) | "
              f"{'preset' if r['seed'] is None else r['seed']} | {s['all']:.1f} % | "
              f"{s['reverse']:.0f} / {s['sort']:.0f} / {s['colour']:.0f} % | "
              f"{r['val0']:.3f} -> {r['val']:.3f} | {r['text']:.3f} | {r['wall']:.0f} s |")
        same = [x for x in rows if (x["method"], x["lr"]) == (r["method"], r["lr"])]
        if len(same) > 1 and r is same[-1]:  # the seeds' mean, and their range
            def mean(f):
                return sum(f(x) for x in same) / len(same)
            em = [x["scores"]["all"] for x in same]
            print(f"| {'full' if r['method'] == 'full' else 'LoRA r8'} | **{r['lr']:g}** | mean of {len(same)} | "
                  f"**{mean(lambda x: x['scores']['all']):.1f} %** ({min(em):.1f}-{max(em):.1f}) | "
                  f"{mean(lambda x: x['scores']['reverse']):.0f} / {mean(lambda x: x['scores']['sort']):.0f} / "
                  f"{mean(lambda x: x['scores']['colour']):.0f} % | {mean(lambda x: x['val0']):.3f} -> "
                  f"{mean(lambda x: x['val']):.3f} | **{mean(lambda x: x['text']):.3f}** | "
                  f"{mean(lambda x: x['wall']):.0f} s |")
    print(f"\ntotal {time.time() - t_start:.0f} s; commands:")
    for c in chat_sft.COMMANDS:
        print("  " + c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
