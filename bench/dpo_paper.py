"""The DPO paper's controlled-sentiment setting, on a CPU (Rafailov et al. 2023, §6.1, App. C.1, Fig. 2): pairs from
the SFT model's own samples (4 a prompt, every pair with different rewards: up to 6), labelled by a graded
programmatic reward; DPO at several betas against SFT on the chosen samples ("Preferred-FT") and DPO + NLL; each
model's mean reward and sequence KL to the SFT model on held-out prompts, over seeds, as a table and a plot.

    python bench/dpo_paper.py --out DIR --jobs 2             # the full bench (docs/performance/dpo-paper.md)
    python bench/dpo_paper.py --out DIR --seeds 0            # one seed
    python bench/dpo_paper.py --out DIR --report             # the table and plot of DIR/results.json again
    python bench/dpo_paper.py --tiny --out DIR               # the smoke test's toy scale (~25 s of CPU)

1. **The SFT model.** A small GPT (cpu-small's shape cut to 128 wide, 4 layers, a 2,048-token vocabulary: MODEL)
   pretrained --pretrain steps on the built-in corpus (Python's documentation and standard-library sources, its
   first megabyte), then chat-tuned --sft steps (`--init-from`) on the task: the user's message a short prefix of
   documentation prose (2-6 words, at a sentence start or every 10th word), the answer the next words (up to
   20). The paper's SFT model is GPT-2 large tuned on IMDB reviews; here it is the model the pairs come from and
   the reference every arm is measured against. Chat-tuned, because the preference trainer renders a pair
   through a chat template: the pairs are the model's own replies in the format DPO trains and the evaluation
   samples.
2. **The reward** (`--reward lexicon:POS,NEG`, workbench's built-in): (positive words - negative words) / words
   of the completion, in [-1, 1]. The paper's is a sentiment classifier on movie reviews; documentation has no
   sentiment, so the lexicon is a "permissive vs prohibitive" tone (POSITIVE and NEGATIVE below: "can", "may",
   "true", "new" against "not", "error", "raise", "none"), words the SFT model writes in about half its replies,
   so most prompts' 4 samples score differently (the bench prints the spread before training anything).
3. **The pairs**: `workbench pairs sft --samples 4` on --prompts prefixes of the training documents, sampled at
   temperature 1 with no top-k or top-p (the SFT model's own distribution).
4. **The arms**, each --steps steps from the SFT checkpoint, the same learning rate, batch (--batch pairs, or
   chosen answers for SFT) and seed: DPO at each --betas (train.objective = dpo, train.pref_beta), DPO + NLL
   (train.pref_sft_weight = 1: an SFT term on the chosen answers, at --nll-beta), and Preferred-FT (SFT on the
   pairs' chosen answers, one a row: the examples the pair arms see, without the rejected halves), also at each
   --pft-lr (SFT moves far less in KL than DPO at one rate; a higher rate takes it to the KL the DPO arms reach,
   for a comparison at matched KL). One run per arm and --seeds (train.seed: the order of the pairs); the SFT
   model and the pairs are the same for all.
5. **The measurement** (in this process, the models loaded with workbench's load_run_model): --eval-samples
   completions of each of --held prefixes of held-out documentation (the topics the built-in corpus keeps out of
   training), sampled at temperature 1 (prompt i from a generator seeded 1000 + i, the same for every model),
   each scored by the reward; the sequence KL is the mean over those samples of sum_t [log pi(y_t | x, y_<t) -
   log pi_ref(y_t | x, y_<t)] over the completion's tokens, its end-of-turn token included (the paper's
   sequence-level KL(pi || pi_ref), estimated on the policy's own samples). The SFT model is the origin: KL 0.
   Each run is measured at --points checkpoints (default 3: a third, two thirds and the end), so an arm is a
   curve, not a point.

Every training run goes through the real CLI in a subprocess (bench/chat_sft.py's `train`; the commands are
printed at the end); runs finished in --out are kept, and their measurements (--out's results.json, saved after
each run), so a rerun with more seeds or arms trains and measures only what is new. The report: the table (each
arm's last checkpoint, mean and sd over seeds), each arm's reward at Preferred-FT's KLs (its seed-mean curve,
linear between checkpoints), and a text plot of reward against KL.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import shlex
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import chat_sft  # noqa: E402

from workbench import cli_client  # noqa: E402

# The reward's word lists: a "permissive" and a "prohibitive" tone of Python's documentation (the words the SFT
# model writes often enough that 4 samples of a prompt mostly score differently).
POSITIVE = ("can", "may", "true", "new", "also", "same", "default", "both", "always", "more", "equal", "valid",
            "supported", "support", "allowed", "available", "useful", "simple", "easy", "all", "each", "any")
NEGATIVE = ("not", "no", "none", "false", "cannot", "error", "errors", "exception", "exceptions", "raise", "raised",
            "raises", "typeerror", "valueerror", "invalid", "never", "only", "must", "fail", "fails", "except",
            "deprecated", "removed")
# --tiny: words a model trained for seconds writes (its replies are mostly the commonest words)
TINY_POSITIVE, TINY_NEGATIVE = ("the", "a", "an", "of", "is"), ("to", "in", "and", "for", "or")
# The model: cpu-small's shape made smaller (the preset's 256 x 4 layers and 8,192-token vocabulary take seconds a
# step on two busy cores); 128 x 4 layers, a 2,048-token vocabulary: ~1 M parameters.
# The built-in corpus cut to its first megabyte (the documentation topics, then sources; the tokenizer trained on it):
# data preparation in seconds, and more of the pretraining is prose.
MODEL = ["model.dim=128", "model.n_layers=4", "model.n_heads=4", "model.n_kv_heads=2", "model.vocab_size=2048",
         "data.builtin_mb=1", "data.tokenizer_sample_mb=1"]
TINY_MODEL = ["model.dim=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1", "model.vocab_size=512",
              "data.tokenizer_sample_mb=0.3"]
WORDS = re.compile(r"[A-Za-z][A-Za-z']*")
EVAL_SEED = 1000

# name: (label, corpus key, --set); the DPO arms' beta is added per arm
ARMS = {"preferred-ft": ("Preferred-FT (SFT on the chosen samples)", "chosen", ["data.packing=false"]),
        "dpo-nll": ("DPO + NLL (pref_sft_weight 1)", "pairs", ["train.objective=dpo", "train.pref_sft_weight=1"])}


# ---------------------------------------------------------------------------------------------------- the data
def paragraphs(held_out: bool) -> list[list[str]]:
    """The prose paragraphs of the built-in corpus's documentation topics (the training ones, or the held-out ones),
    each as its words: blank-line separated blocks, wrapped lines joined, code (indented lines) and short blocks
    left out."""
    from workbench.data.corpus.documents import builtin_documents
    out = []
    for kind, _, text in builtin_documents(held_out=held_out):
        if kind != "doc":
            continue
        for block in re.split(r"\n\s*\n", text):
            lines = block.split("\n")
            if any(not ln.strip() or ln.startswith((" ", "\t", ">>>", "*", "+", "|", "=")) for ln in lines):
                continue
            words = " ".join(ln.strip() for ln in lines).split()
            if len(words) >= 12:
                out.append(words)
    return out


def windows(paras: list[list[str]], rng: random.Random, cont: int = 20) -> list[tuple[str, str]]:
    """(prefix, continuation) at each sentence start of the paragraphs and every 10th word: the prefix 2-6 words,
    the continuation the next words up to ``cont`` (at least 6)."""
    out = []
    for words in paras:
        starts = {0, *range(10, len(words), 10)} | {i + 1 for i, w in enumerate(words[:-1])
                                                    if w.endswith((".", ":", "?")) and words[i + 1][:1].isupper()}
        for s in sorted(starts):
            n = rng.randint(2, 6)
            prefix, rest = words[s:s + n], words[s + n:s + n + cont]
            if len(prefix) == n and len(rest) >= 6:
                out.append((" ".join(prefix), " ".join(rest)))
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    tmp.replace(path)
    return path


def write_data(out: Path, n_train: int, n_held: int, tiny: bool = False) -> dict[str, Path]:
    """The SFT conversations, the pairs' prompts (training documents), the held-out prompts and the word lists."""
    rng = random.Random(0)
    train = windows(paragraphs(False), rng)
    held = windows(paragraphs(True), random.Random(1))
    rng.shuffle(train)
    random.Random(1).shuffle(held)
    if len(held) < n_held:
        raise SystemExit(f"dpo_paper: only {len(held)} held-out prefixes; give --held {len(held)} or fewer")
    paths = {"sft": out / "sft.jsonl", "prompts": out / "prompts.jsonl", "held": out / "held.jsonl",
             "pos": out / "positive.txt", "neg": out / "negative.txt"}
    write_jsonl(paths["sft"], [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": c}]}
                               for p, c in train])
    write_jsonl(paths["prompts"], [{"prompt": p} for p, _ in train[:n_train]])
    write_jsonl(paths["held"], [{"prompt": p} for p, _ in held[:n_held]])
    pos, neg = (TINY_POSITIVE, TINY_NEGATIVE) if tiny else (POSITIVE, NEGATIVE)
    paths["pos"].write_text("\n".join(pos) + "\n")
    paths["neg"].write_text("\n".join(neg) + "\n")
    print(f"data: {len(train):,} SFT conversations (training documents), {min(n_train, len(train)):,} pair prompts, "
          f"{n_held} held-out prompts (of {len(held):,})", flush=True)
    return paths


def reward_spec(paths: dict[str, Path]) -> str:
    return f"lexicon:{paths['pos']},{paths['neg']}"


# ---------------------------------------------------------------------------------------------------- the runs
def cli(out: Path, args: list[str]) -> str:
    """`python -m workbench ARGS` in a subprocess (its stdout); the command kept for the list at the end."""
    chat_sft.COMMANDS.append(f"WORKBENCH_CACHE_DIR={shlex.quote(str(out / 'cache'))} python -m workbench "
                             f"{shlex.join(args)}")
    cp = cli_client.run([sys.executable, "-m", "workbench", *args], cwd=ROOT,
                        env=dict(os.environ, WORKBENCH_CACHE_DIR=str(out / "cache")))
    if cp.returncode != 0:
        raise SystemExit(f"dpo_paper: `workbench {args[0]}` failed ({cp.returncode}):\n{cp.stdout[-2000:]}\n"
                         f"{cp.stderr[-2000:]}")
    return cp.stdout


def make_pairs(out: Path, a: argparse.Namespace, paths: dict[str, Path]) -> tuple[Path, Path, dict]:
    """`workbench pairs` on the SFT model (kept if complete), and the pairs' chosen halves as conversations."""
    pairs = out / "pairs.jsonl"
    cli(out, ["pairs", "sft", "--runs-dir", str(out / "runs"), "--prompts", str(paths["prompts"]), "--reward",
              reward_spec(paths), "--samples", str(a.samples), "--out", str(pairs), "--temperature", "1",
              "--top-k", "0", "--top-p", "1", "--max-new-tokens", str(a.max_new), "--device", "cpu"])
    meta = json.loads((out / "pairs.jsonl.meta.json").read_text())
    recs = [json.loads(x) for x in pairs.read_text().splitlines()]
    chosen = write_jsonl(out / "chosen.jsonl", [{"messages": [{"role": "user", "content": r["prompt"]},
                                                              {"role": "assistant", "content": r["chosen"]}]}
                                                for r in recs])
    n_prompts = meta["prompts_total"]
    gap = [r["chosen_reward"] - r["rejected_reward"] for r in recs]
    print(f"pairs: {len(recs):,} from {n_prompts:,} prompts x {a.samples} samples ({len(recs) / n_prompts:.2f} a "
          f"prompt; {meta['no_signal']:,} prompts with every sample scored the same); the SFT samples' mean reward "
          f"{meta['mean_reward']:.4f}; chosen - rejected reward: mean {sum(gap) / max(1, len(gap)):.3f}", flush=True)
    return pairs, chosen, meta


def arm_lr(a: argparse.Namespace, arm: str) -> float:
    """An arm's learning rate: --lr, or a Preferred-FT arm's own (--pft-lr: ``preferred-ft-lrX``)."""
    return float(arm.rsplit("-lr", 1)[1]) if arm.startswith("preferred-ft-lr") else a.lr


def run_name(a: argparse.Namespace, arm: str, seed: int) -> str:
    return f"{arm.split('-lr')[0]}-n{a.steps}-lr{arm_lr(a, arm):g}-bs{a.batch}-s{seed}"


def arm_sets(a: argparse.Namespace, arm: str, seed: int) -> tuple[str, list[str]]:
    """An arm's corpus key and its --set (every arm the same schedule, batch and seed; its own learning rate)."""
    lr = arm_lr(a, arm)
    common = [*chat_sft.COMMON, "train.optimizer=adamw", "train.schedule=cosine", f"train.lr={lr:g}",
              f"train.min_lr={lr:g}", f"train.warmup_iters={max(1, a.steps // 10)}", f"train.max_iters={a.steps}",
              f"train.eval_interval={a.steps}", f"train.ckpt_interval={max(1, a.steps // a.points)}",
              f"train.keep_last={a.points + 1}", f"train.batch_size={a.batch}", "train.log_interval=25",
              f"train.seed={seed}"]
    if arm.startswith("dpo-b"):
        return "pairs", [*common, "train.objective=dpo", f"train.pref_beta={float(arm[5:]):g}"]
    _, corpus, sets = ARMS[arm.split("-lr")[0]]
    beta = [f"train.pref_beta={a.nll_beta:g}"] if arm == "dpo-nll" else []
    return corpus, [*common, *sets, *beta]


def arm_label(a: argparse.Namespace, arm: str) -> str:
    if arm.startswith("dpo-b"):
        return f"DPO beta {float(arm[5:]):g}"
    if arm.startswith("preferred-ft-lr"):
        return f"{ARMS['preferred-ft'][0]}, lr {arm_lr(a, arm):g}"
    return ARMS[arm][0] + (f", beta {a.nll_beta:g}" if arm == "dpo-nll" else "")


# ------------------------------------------------------------------------------------------------ the measurement
class Measure:
    """Reward and sequence KL to the SFT model of a checkpoint's own samples on the held-out prompts."""

    def __init__(self, out: Path, a: argparse.Namespace, paths: dict[str, Path]):
        import torch

        from workbench.reward import parse_reward, read_prompts
        from workbench.train.checkpoint import load_run_model
        torch.set_num_threads(1)
        self.a, self.out = a, out
        self.reward = parse_reward(reward_spec(paths))
        self.prompts = read_prompts(paths["held"]).items
        self.ref = load_run_model(out / "runs" / "sft", "latest", "cpu").model.eval()

    def __call__(self, run: str, step: str | int = "latest") -> dict[str, float]:
        import torch

        from workbench.commands.pairs import sampler_for
        from workbench.data.text.tokenizer import load_tokenizer
        from workbench.plan.sampling import Sampling
        from workbench.train.checkpoint import load_run_model
        from workbench.train.generate import sample_prompts
        from workbench.train.model import IGNORE

        run_dir = self.out / "runs" / run
        loaded = load_run_model(run_dir, step, "cpu")
        model = loaded.model.eval()
        sampling = Sampling(temperature=1.0, top_k=0, top_p=1.0, seed=EVAL_SEED, max_new_tokens=self.a.max_new)
        s = sampler_for(run_dir, model, load_tokenizer(run_dir), sampling, "cpu")
        k = self.a.eval_samples
        ids = [s.prompt_ids(p) for p in self.prompts]
        with torch.no_grad():
            rows = sample_prompts(model, ids, k, sampling, [EVAL_SEED + i for i in range(len(ids))], s.stops,
                                  keep_stop=True)
            rewards, kls, lens = [], [], []
            seqs = [(ids[i], r) for i in range(len(ids)) for r in rows[i]]
            for lo in range(0, len(seqs), 64):
                chunk = seqs[lo:lo + 64]
                width = max(len(p) + len(c) for p, c in chunk)
                x = torch.zeros(len(chunk), width - 1, dtype=torch.long)
                y = torch.full((len(chunk), width - 1), IGNORE, dtype=torch.long)
                for j, (p, c) in enumerate(chunk):
                    full = p + c
                    x[j, :len(full) - 1] = torch.tensor(full[:-1])
                    y[j, len(p) - 1:len(full) - 1] = torch.tensor(c)
                _, lp = model(x, targets=y, logps=True)
                _, lr = self.ref(x, targets=y, logps=True)
                kls += (lp - lr).sum(-1).tolist()
            for i, p in enumerate(self.prompts):
                for r in rows[i]:
                    body = [t for t in r if t not in s.stops]
                    rewards.append(self.reward.score(p.text, s.tok.decode(body), p.record))
                    lens.append(len(r))
        n = len(rewards)
        return {"run": run, "step": int(loaded.meta["step"]), "reward": sum(rewards) / n, "kl": sum(kls) / n,
                "len": sum(lens) / n, "hit": sum(x != 0 for x in rewards) / n}


def checkpoint_steps(run_dir: Path) -> list[int]:
    from workbench import rundir
    return sorted({int(c["step"]) for c in rundir.list_checkpoints(run_dir) if int(c["step"]) > 0})


# ---------------------------------------------------------------------------------------------------- the report
def mean_sd(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0)


def table(rows: list[tuple[str, list[dict]]]) -> str:
    lines = ["| model | seeds | mean reward (± sd over seeds) | sequence KL to SFT, nats (± sd) | "
             "replies with a lexicon word | tokens a reply | each seed: reward / KL |",
             "|---|---|---|---|---|---|---|"]
    for label, ms in rows:
        if not ms:
            lines.append(f"| {label} | 0 | failed | | | | |")
            continue
        r, rs = mean_sd([m["reward"] for m in ms])
        k, ks = mean_sd([m["kl"] for m in ms])
        hit = sum(m["hit"] for m in ms) / len(ms)
        ln = sum(m["len"] for m in ms) / len(ms)
        each = " · ".join(f"{m['reward']:+.4f} / {m['kl']:.2f}" for m in ms)
        lines.append(f"| {label} | {len(ms)} | {r:+.4f} ± {rs:.4f} | {k:.2f} ± {ks:.2f} | {100 * hit:.0f} % | "
                     f"{ln:.1f} | {each} |")
    return "\n".join(lines)


def plot(series: list[tuple[str, str, list[tuple[float, float]]]], width: int = 72, height: int = 22) -> str:
    """Reward (y) against sequence KL (x) as text: each series' points drawn with its marker (``*`` where two
    series fall in one cell), the axes' ranges at their ends, a legend below."""
    pts = [(x, y) for _, _, ps in series for x, y in ps]
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1e-3)
    grid = [[" "] * width for _ in range(height)]
    for _, marker, ps in series:
        for x, y in ps:
            c = round((x - x0) / (x1 - x0) * (width - 1))
            r = height - 1 - round((y - y0) / (y1 - y0) * (height - 1))
            grid[r][c] = marker if grid[r][c] in (" ", marker) else "*"
    ylab = [f"{y1:+.4f}", f"{(y0 + y1) / 2:+.4f}", f"{y0:+.4f}"]
    lines = ["mean reward", "        ┌" + "─" * width + "┐"]
    for r, row in enumerate(grid):
        lab = ylab[0] if r == 0 else ylab[1] if r == height // 2 else ylab[2] if r == height - 1 else ""
        lines.append(f"{lab:>8}│" + "".join(row) + "│")
    lines.append("        └" + "─" * width + "┘")
    mid = f"{(x0 + x1) / 2:.2f}"
    left, right = f"{x0:.2f}", f"{x1:.2f}"
    gap = width - len(left) - len(mid) - len(right)
    lines.append("         " + left + " " * (gap // 2) + mid + " " * (gap - gap // 2) + right)
    lines.append(" " * 9 + "sequence KL(pi || pi_SFT), nats".center(width))
    lines += [f"  {marker}  {label}" for label, marker, _ in series] + ["  *  two of them in one cell"]
    return "\n".join(lines)


def measured_before(out: Path, a: argparse.Namespace) -> dict[str, list[dict]]:
    """The measurements an earlier bench in --out saved (results.json), by run name ("sft": the origin), if it
    measured the same way (the same held-out prompts, samples, length and checkpoints a run): a rerun that adds
    arms or seeds measures only the new runs. (Each measurement is seeded: measuring again gives the same.)"""
    f = out / "results.json"
    if not f.is_file():
        return {}
    old = json.loads(f.read_text())
    if any(old["args"].get(k) != getattr(a, k) for k in ("held", "eval_samples", "max_new", "points", "tiny")):
        return {}
    found = {"sft": [old["origin"]], "wall": [{"s": old["wall_s"] + old.get("earlier_wall_s", 0.0)}]}
    for gs in old["arms"].values():
        for g in gs:
            found[g[0]["run"]] = [dict(m, seed=int(m["run"].rsplit("-s", 1)[1])) for m in g]
    return found


def save(out: Path, a: argparse.Namespace, origin: dict, results: dict[str, list[list[dict]]], meta: dict,
         wall: float, earlier: float = 0.0) -> None:
    data = {"origin": origin, "arms": results, "pairs": meta["pairs"], "prompts": meta["prompts_total"],
            "wall_s": wall, "earlier_wall_s": earlier, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}}
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out / "results.json")


def interpolate(curve: list[tuple[float, float]], kl: float) -> float | None:
    """The reward of a (KL, reward) curve at ``kl``, linear between its points; None outside them."""
    pts = sorted(curve)
    for (k0, r0), (k1, r1) in zip(pts, pts[1:]):
        if k0 <= kl <= k1:
            return r0 if k1 == k0 else r0 + (r1 - r0) * (kl - k0) / (k1 - k0)
    return None


def mean_curve(origin: dict, seeds: list[list[dict]]) -> list[tuple[float, float]]:
    """An arm's curve: the origin, then each measured checkpoint's (KL, reward), averaged over the seeds."""
    n = min(len(g) for g in seeds)
    return [(0.0, origin["reward"])] + [(sum(g[j]["kl"] for g in seeds) / len(seeds),
                                         sum(g[j]["reward"] for g in seeds) / len(seeds)) for j in range(n)]


def report(res: dict) -> None:
    """The table, the rewards at matched KL, and the plot, from a results.json."""
    a = argparse.Namespace(**res["args"])
    origin, results = res["origin"], res["arms"]
    arms = list(results)
    seeds_done = sorted({g[0]["seed"] for gs in results.values() for g in gs})
    print(f"\n{res['pairs']:,} pairs from {res['prompts']:,} prompts x {a.samples} samples; each arm {a.steps} "
          f"steps, AdamW lr {a.lr:g}, batch {a.batch}; seeds measured: {' '.join(map(str, seeds_done)) or 'none'}; "
          f"measured on {a.held} held-out prompts x {a.eval_samples} samples (temperature 1, at most {a.max_new} "
          f"tokens); wall {res['wall_s']:.0f} s"
          + (f" (and {res['earlier_wall_s']:.0f} s of earlier runs in this --out)" if res.get("earlier_wall_s") else "")
          + f" ({res['machine']})\n")
    rows = [("SFT model (the reference, the origin)", [origin])]
    rows += [(f"+{a.steps} steps: {arm_label(a, arm)}", [g[-1] for g in results[arm]]) for arm in arms]
    print(table(rows))
    done = {arm: results[arm] for arm in arms if results[arm]}
    pft = [arm for arm in done if arm.startswith("preferred-ft")]
    if pft:
        curves = {arm: mean_curve(origin, gs) for arm, gs in done.items()}
        others = [arm for arm in done if not arm.startswith("preferred-ft")]
        print("\nreward at matched KL: at each Preferred-FT checkpoint's KL (seed means), each other arm's reward "
              "there (its seed-mean curve from the origin, linear between its checkpoints; - where the arm's curve "
              "does not reach that KL):\n")
        print("| Preferred-FT checkpoint | KL | its reward | " + " | ".join(arm_label(a, x) for x in others) + " |")
        print("|---|---|---|" + "---|" * len(others))
        for arm in pft:
            steps = [m["step"] for m in done[arm][0]]
            for step, (kl, r) in zip(steps, curves[arm][1:]):
                cells = [interpolate(curves[x], kl) for x in others]
                print(f"| lr {arm_lr(a, arm):g}, step {step} | {kl:.2f} | {r:+.4f} | "
                      + " | ".join("-" if c is None else f"{c:+.4f}" for c in cells) + " |")
    markers = {arm: m for arm, m in zip(arms, "123456789"[:len(a.betas)] + "NPFGH")}
    series = [("SFT model", "S", [(origin["kl"], origin["reward"])])]
    series += [(arm_label(a, arm), markers[arm], mean_curve(origin, results[arm])[1:]) for arm in arms
               if results[arm]]
    print(f"\nreward vs KL on the held-out prompts: each arm's checkpoints ({a.points} a run), the mean of its seeds\n")
    print(plot(series))


# ---------------------------------------------------------------------------------------------------- main
def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the smoke test's toy scale: every step, a few seconds each")
    ap.add_argument("--pretrain", type=int, default=300, help="pretraining steps on the built-in corpus; 0: the SFT "
                                                                "model trained from scratch")
    ap.add_argument("--sft", type=int, default=300, help="chat-tuning steps on the prefix -> continuation task")
    ap.add_argument("--prompts", type=int, default=384, help="training prompts the pairs are sampled for")
    ap.add_argument("--samples", type=int, default=4, help="samples a prompt (the paper's 4: up to 6 pairs)")
    ap.add_argument("--held", type=int, default=128, help="held-out prompts the models are measured on")
    ap.add_argument("--eval-samples", type=int, default=4, help="samples a held-out prompt")
    ap.add_argument("--max-new", type=int, default=40, help="the most tokens a completion has")
    ap.add_argument("--steps", type=int, default=150, help="steps of each arm from the SFT checkpoint")
    ap.add_argument("--points", type=int, default=3, help="checkpoints of each arm measured (evenly spaced)")
    ap.add_argument("--lr", type=float, default=2e-4, help="each arm's learning rate (AdamW, constant after warmup)")
    ap.add_argument("--batch", type=int, default=8, help="pairs a step (DPO), or chosen answers (Preferred-FT)")
    ap.add_argument("--betas", type=float, nargs="+", default=[0.05, 0.1, 0.5], help="the DPO arms' betas")
    ap.add_argument("--pft-lr", type=float, nargs="*", default=[1e-3],
                    help="more Preferred-FT arms at these learning rates (SFT moves slower in KL than DPO at one "
                         "rate: a higher one reaches the KL the DPO arms do)")
    ap.add_argument("--nll-beta", type=float, default=0.1, help="DPO + NLL's beta")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the arms' train.seed, one run each")
    ap.add_argument("--report", action="store_true", help="print the table and plot of --out's results.json again "
                                                          "(what was measured so far), training nothing")
    ap.add_argument("--jobs", type=int, default=1, help="arms trained at once (each a process of one thread)")
    ap.add_argument("--out", type=Path, default=None, help="runs and data here (default: a new temp dir); runs "
                                                           "finished in it are kept")
    a = ap.parse_args()
    if a.tiny:
        a.pretrain, a.sft, a.prompts, a.held, a.eval_samples, a.max_new, a.steps, a.points = 0, 30, 16, 8, 2, 12, 4, 1
        a.betas, a.seeds, a.pft_lr = [0.1], [0], []
    return a


def main() -> int:
    a = parse()
    if a.report:
        if a.out is None or not (a.out / "results.json").is_file():
            raise SystemExit("dpo_paper: --report reads DIR/results.json: give the --out DIR of a bench that ran")
        res = json.loads((a.out / "results.json").read_text())
        if "pairs" not in res:  # written by the first version of this bench, which did not keep these
            meta = json.loads((a.out / "pairs.jsonl.meta.json").read_text())
            res |= {"pairs": meta["pairs"], "prompts": meta["prompts_total"], "machine": "x86_64, 2 CPUs"}
            for gs in res["arms"].values():
                for m in (m for g in gs for m in g):
                    m.setdefault("seed", int(m["run"].rsplit("-s", 1)[1]))
        report(res)
        return 0
    t0 = time.time()
    # one thread a process (the runs inherit it): on a shared CPU two threads of a tiny model wait on each other
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = (a.out or Path(tempfile.mkdtemp(prefix="wb-dpo-paper-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"dpo_paper in {out}", flush=True)
    paths = write_data(out, a.prompts, a.held, a.tiny)
    base = [*chat_sft.COMMON, "train.log_interval=50"]
    shape = TINY_MODEL if a.tiny else MODEL
    if a.pretrain:
        chat_sft.train(out, f"pre{a.pretrain}", "builtin", [*base, *shape, f"train.max_iters={a.pretrain}",
                                                             f"train.warmup_iters={max(1, min(40, a.pretrain // 4))}",
                                                             f"train.eval_interval={a.pretrain}"])
    # the SFT run is named "sft" (the pairs and every arm start from it): a --out holds one SFT model
    chat_sft.train(out, "sft", str(paths["sft"]), [*base, f"train.max_iters={a.sft}", "train.lr=1e-3",
                                                    "train.min_lr=1e-4", f"train.warmup_iters={max(1, a.sft // 10)}",
                                                    f"train.eval_interval={a.sft}",
                                                    *([] if a.pretrain else [*shape, "data.chat_template=chatml"])],
                   init_from=f"pre{a.pretrain}" if a.pretrain else None)
    measure = Measure(out, a, paths)
    kept = measured_before(out, a)
    origin = kept.get("sft", [None])[0] or measure("sft")
    earlier = kept.get("wall", [{"s": 0.0}])[0]["s"]   # the earlier benches' wall time in this --out
    print(f"SFT model on the held-out prompts: mean reward {origin['reward']:+.4f}, KL to itself {origin['kl']:.6f}, "
          f"{100 * origin['hit']:.0f} % of replies with a lexicon word, {origin['len']:.1f} tokens a reply",
          flush=True)
    _, _, meta = make_pairs(out, a, paths)
    corpora = {"pairs": str(out / "pairs.jsonl"), "chosen": str(out / "chosen.jsonl")}
    arms = [f"dpo-b{b:g}" for b in a.betas] + ["dpo-nll", "preferred-ft"] + [f"preferred-ft-lr{x:g}"
                                                                          for x in a.pft_lr]
    results: dict[str, list[list[dict]]] = {arm: [] for arm in arms}   # arm: each seed's measured checkpoints
    # seed-major: a bench stopped early has every arm at the first seeds (runs finished in --out are kept)
    runs = [(run_name(a, arm, seed), arm, seed) for seed in a.seeds for arm in arms]

    def train(run: tuple[str, str, int]) -> str | None:
        name, arm, seed = run
        corpus, sets = arm_sets(a, arm, seed)
        try:
            chat_sft.train(out, name, corpora[corpus], sets, init_from="sft")
        except SystemExit as e:  # one run's failure is said and left out of the table; the others go on
            return str(e)[-600:]
        return None

    with ThreadPoolExecutor(max(1, a.jobs)) as pool:  # each run a subprocess: the threads only wait
        futures = {pool.submit(train, run): run for run in runs}
        for fut in as_completed(futures):   # each measured here, in the main thread, as it finishes
            name, arm, seed = futures[fut]
            if (failed := fut.result()) is not None:
                print(f"    {name}: failed: {failed}", flush=True)
                continue
            got = kept.get(name) or [dict(measure(name, step), seed=seed)
                                     for step in checkpoint_steps(out / "runs" / name)[-a.points:]]
            results[arm] = sorted([*results[arm], got], key=lambda g: g[0]["seed"])
            save(out, a, origin, results, meta, time.time() - t0, earlier)   # a bench stopped early keeps it
            print("    " + name + ": " + "; ".join(f"step {m['step']}: reward {m['reward']:+.4f}, KL {m['kl']:.2f}"
                                               for m in got), flush=True)
    save(out, a, origin, results, meta, time.time() - t0, earlier)
    report(json.loads((out / "results.json").read_text()))
    print("\ncommands:")
    for c in chat_sft.COMMANDS:
        print("  " + c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
