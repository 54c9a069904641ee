"""Preference tuning teaches: on bench/chat_sft.py's checkable task, a model chat-tuned briefly, then tuned for the
same number of extra steps from that checkpoint: SFT on the correct answers alone, against DPO (and a
reference-free variant) on pairs of the correct answer and a wrong one. Greedy exact match on held-out
conversations before and after.

    python bench/preference.py [--out DIR] [--pretrain 400] [--sft 300] [--steps 100] [--held 200] [--seeds 0 1 2]
        [--pairs onpolicy synthetic] [--lr 1e-4 3e-5] [--jobs 4] [--device cuda] [--set train.pref_reference=live]
    bash bench/gpu_check.sh preference     # on a GPU: 16 runs at a time, 4 seeds, 500 held-out items (README)

1. Pretrains cpu-small (model.seq_len 128) on the built-in corpus, then chat-tunes it (`--init-from`) on 2,000
   generated conversations (tests/support/chat.py, seed 0).
2. Writes the pairs. ``--pairs synthetic`` (the default): a pair for every conversation, the rejected answer made
   up (the words not reversed, the numbers sorted the wrong way, another colour of the table). ``--pairs
   onpolicy``: the chat-tuned model answers each training prompt (greedy, as it is scored); each prompt it gets
   wrong is a pair, the correct answer chosen and *its own reply* rejected, so preference tuning suppresses the
   mistakes the model actually makes (neither has beaten SFT yet: README, preference tuning).
3. From the chat-tuned checkpoint, --steps more steps each, the same learning rate, batch and seed:
   - ``sft``: SFT on all the training conversations, packed (about 20 conversations a step: more data than the
     pair arms see, the stronger baseline);
   - ``sft-pairs``: SFT on the pairs' prompts and chosen answers alone, one a row, --batch a step: the same
     examples the pair arms see (their chosen halves), so only the rejected answers differ;
   - ``dpo``: train.objective = dpo on the pairs (train.pref_beta = --beta);
   - ``dpo-sft``: the same with an SFT term on the chosen answers (train.pref_sft_weight = 1, RPO's recipe);
   - ``dpop``: DPO-Positive (train.dpop_lambda = --dpop, 50 the paper's): DPO with a penalty on the chosen
     answers' log-prob falling below the reference's, which on-policy pairs push down with the rejected;
   - ``simpo`` / ``orpo``: the reference-free variants on the pairs, at their own default strength.
   ``--arms`` picks which (default: all but orpo).
4. Exact match on --held held-out conversations (seed 1): the chat-tuned checkpoint and each arm's last; with
   several ``--seeds`` (train.seed of the arms; the chat-tuned model and the pairs are the same), each arm's mean
   and range.

Every run goes through the real CLI in a subprocess; the commands are printed at the end. Runs finished in --out
are kept (their names say the settings, the chat-tuned run its steps), so a rerun with more seeds or arms trains
only what is new. Each kind of pairs (--pairs) and learning rate (--lr) is a table of its own; the runs of all of
them go through one pool of --jobs processes, each scored as it finishes (chat_sft.score_in_process: greedy,
batched by prompt length), and a run that fails is said and left out of its table.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import chat_sft  # noqa: E402

from tests.support.chat import COLOURS, conversations, write_jsonl  # noqa: E402

# name: (label, corpus, --set)
ARMS = {"sft": ("SFT on all the correct answers (packed)", "chats", []),
        "sft-pairs": ("SFT on the pairs' chosen answers (one a row)", "chosen", ["data.packing=false"]),
        "dpo": ("DPO on the pairs", "pairs", ["train.objective=dpo"]),
        "dpo-sft": ("DPO + an SFT term (pref_sft_weight 1)", "pairs", ["train.objective=dpo",
                                                                     "train.pref_sft_weight=1"]),
        "dpop": ("DPOP on the pairs (dpop_lambda --dpop)", "pairs", ["train.objective=dpo"]),
        "simpo": ("SimPO on the pairs (no reference)", "pairs", ["train.objective=simpo"]),
        "orpo": ("ORPO on the pairs (no reference)", "pairs", ["train.objective=orpo"])}
DEFAULT_ARMS = ("sft", "sft-pairs", "dpo", "dpo-sft", "simpo")


def wrong_answer(rec: dict, rng: random.Random) -> str:
    """A plausible wrong answer to a conversation of the task (``--pairs synthetic``)."""
    msgs = rec["messages"]
    ask, ans = msgs[-2]["content"], msgs[-1]["content"]
    if ask.startswith("Reverse the words: "):
        return ask.removeprefix("Reverse the words: ")          # not reversed
    if ask.startswith("Sort: "):
        wrong = " ".join(sorted(ans.split(), key=int, reverse=True))  # the wrong order
        return wrong if wrong != ans else ans + " 0"
    return rng.choice([c for c in COLOURS if c != ans])          # another colour


def pair(rec: dict, rejected: str) -> dict:
    return {"prompt": rec["messages"][:-1], "chosen": [rec["messages"][-1]], "rejected": rejected}


def synthetic_pairs(recs: list[dict], seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [pair(r, wrong_answer(r, rng)) for r in recs]


def onpolicy_pairs(run_dir: Path, recs: list[dict], device: str = "cpu") -> tuple[list[dict], dict[str, int]]:
    """The model's greedy reply to each record's prompt (as chat_sft.score decodes it); a pair for each wrong,
    non-empty one: the correct answer chosen, the reply rejected. Also the counts (right, wrong, empty)."""
    replies = chat_sft.replies(run_dir, "latest", recs, device=device)
    pairs, counts = [], {"right": 0, "wrong": 0, "empty": 0}
    for rec, got in zip(recs, replies):
        if got.strip() == rec["messages"][-1]["content"].strip():
            counts["right"] += 1
        elif not got.strip():
            counts["empty"] += 1
        else:
            counts["wrong"] += 1
            pairs.append(pair(rec, got.strip()))
    return pairs, counts


def write_pairs(out: Path, kind: str, sft: str, train_recs: list[dict], device: str = "cpu") -> tuple[Path, Path]:
    """The pairs file and its chosen halves as conversations (the sft-pairs arm's corpus); made once per --out
    and chat-tuned run ``sft``."""
    path, chosen = out / f"pairs-{kind}-{sft}.jsonl", out / f"chosen-{kind}-{sft}.jsonl"
    if not path.is_file():
        if kind == "onpolicy":
            pairs, counts = onpolicy_pairs(out / "runs" / sft, train_recs, device)
            print(f"  on-policy pairs: the chat-tuned model answered {len(train_recs):,} training prompts: "
                  f"{counts['right']:,} right, {counts['wrong']:,} wrong (pairs), {counts['empty']:,} empty",
                  flush=True)
        else:
            pairs = synthetic_pairs(train_recs)
        write_jsonl(chosen, [{"messages": [*p["prompt"], *p["chosen"]]} for p in pairs])
        write_jsonl(path, pairs)   # last: its presence says both are whole
    return path, chosen


def arm_name(arm: str, a: argparse.Namespace, kind: str, lr: float, seed: int) -> str:
    beta = f"-b{a.beta:g}" if arm.startswith("dpo") else ""
    beta += f"-l{a.dpop:g}" if arm == "dpop" else ""
    return (f"{arm}-{kind if arm != 'sft' else 'all'}-from{a.sft}-n{a.steps}-lr{lr:g}{beta}-bs{a.batch}"
            f"{'-' + '-'.join(a.set).replace('=', '') if a.set else ''}-s{seed}")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pretrain", type=int, default=400, help="pretraining steps; 0: chat-tune from scratch")
    ap.add_argument("--sft", type=int, default=300, help="chat-tuning steps before the comparison")
    ap.add_argument("--steps", type=int, default=100, help="extra steps of each arm")
    ap.add_argument("--held", type=int, default=200)
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-4], help="each arm's learning rate (several: each)")
    ap.add_argument("--beta", type=float, default=0.1, help="DPO's beta (train.pref_beta)")
    ap.add_argument("--dpop", type=float, default=50.0, help="the dpop arm's train.dpop_lambda")
    ap.add_argument("--batch", type=int, default=8, help="each arm's train.batch_size (pairs, or rows for SFT)")
    ap.add_argument("--pairs", choices=("onpolicy", "synthetic"), nargs="+", default=["synthetic"],
                    help="which pairs (several: each, in one pool of --jobs)")
    ap.add_argument("--set", nargs="+", default=[],
                    help="more overrides for every arm (e.g. train.pref_reference=live)")
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(DEFAULT_ARMS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="the arms' train.seed, one run each")
    ap.add_argument("--jobs", type=int, default=1, help="runs trained at once (each a process, scored as it ends)")
    ap.add_argument("--device", default=None, help="hardware.device of every run (default: the presets' auto)")
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args()


def device_sets(a: argparse.Namespace) -> list[str]:
    return [f"hardware.device={a.device}"] if a.device else []


def prepare(a: argparse.Namespace, out: Path, chats: str) -> None:
    """The pretrained and the chat-tuned runs (kept if --out has them)."""
    base = [*chat_sft.COMMON, "train.optimizer=adamw", "train.schedule=cosine", "train.lr=2e-3",
            "train.warmup_iters=20"]
    if a.pretrain:
        chat_sft.train(out, f"pre{a.pretrain}", "builtin", [*base, f"train.max_iters={a.pretrain}",
                                                            f"train.eval_interval={a.pretrain}", *device_sets(a)])
    chat_sft.train(out, sft_name(a), chats, [*base, f"train.max_iters={a.sft}", f"train.eval_interval={a.sft}",
                                             *([] if a.pretrain else ["model.vocab_size=512",
                                                                      "data.chat_template=chatml"]), *device_sets(a)],
                   init_from=f"pre{a.pretrain}" if a.pretrain else None)


def sft_name(a: argparse.Namespace) -> str:
    """The chat-tuned run: named by its steps (and its pretraining's), so one --out holds several."""
    return f"sft{a.sft}" + (f"-pre{a.pretrain}" if a.pretrain != 400 else "")


def table(rows: list[tuple[str, list[dict]]], seeds: list[int]) -> None:
    kinds = ("all", "reverse", "sort", "colour")
    many = len(seeds) > 1
    print(f"| model | exact match{' (mean; each seed)' if many else ''} | reverse | sort | colour |")
    print("|---|---|---|---|---|")
    for label, scores in rows:
        if not scores:
            print(f"| {label} | failed | | | |")
            continue
        mean = {k: sum(s[k] for s in scores) / len(scores) for k in kinds}
        each = " (" + " / ".join(f"{s['all']:.1f}" for s in scores) + ")" if many and len(scores) > 1 else ""
        print(f"| {label} | {mean['all']:.1f} %{each} | "
              + " | ".join(f"{mean[k]:.1f} %" for k in kinds[1:]) + " |")


def main() -> int:
    a = parse()
    out = (a.out or Path(tempfile.mkdtemp(prefix="wb-pref-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train_recs = conversations(2000, seed=0)
    chats = str(write_jsonl(out / "chats.jsonl", train_recs))
    held = conversations(a.held, seed=1)
    print(f"runs in {out}", flush=True)
    prepare(a, out, chats)
    sft = sft_name(a)
    score_device = a.device or "cpu"
    corpora, n_pairs = {"chats": chats}, {}
    for kind in a.pairs:
        pairs, chosen = write_pairs(out, kind, sft, train_recs, score_device)
        corpora |= {("pairs", kind): str(pairs), ("chosen", kind): str(chosen)}
        n_pairs[kind] = sum(1 for _ in pairs.open())
    start = chat_sft.score(out / "runs" / sft, "latest", held, device=score_device)
    runs: dict[str, tuple[str, list[str]]] = {}   # name: (corpus, --set); sft's run serves every kind of pairs
    for kind in a.pairs:
        for lr in a.lr:
            for arm in a.arms:
                _, corpus, sets = ARMS[arm]
                sets = [*sets, f"train.pref_beta={a.beta:g}"] if arm.startswith("dpo") else sets
                sets = [*sets, f"train.dpop_lambda={a.dpop:g}"] if arm == "dpop" else sets
                sets = [*chat_sft.COMMON, "train.optimizer=adamw", "train.schedule=cosine", f"train.lr={lr:g}",
                        f"train.min_lr={lr:g}",  # cpu-small's min_lr is 1e-4: at 1e-4 the arms ran flat after warmup
                        "train.warmup_iters=10", f"train.max_iters={a.steps}", f"train.eval_interval={a.steps}",
                        f"train.batch_size={a.batch}", *device_sets(a), *sets, *a.set]
                for seed in a.seeds:
                    runs[arm_name(arm, a, kind, lr, seed)] = (
                        corpora[corpus if corpus == "chats" else (corpus, kind)], [*sets, f"train.seed={seed}"])

    def train_and_score(name: str) -> dict[str, float] | None:
        try:
            chat_sft.train(out, name, runs[name][0], runs[name][1], init_from=sft)
            got = chat_sft.score_in_process(out / "runs" / name, a.held, score_device)
        except SystemExit as e:  # one run's failure is said and left out of the table; the others go on
            print(f"    {name}: failed: {str(e)[-600:]}", flush=True)
            return None
        print(f"    {name}: exact match {got['all']:.1f} %", flush=True)
        return got

    with ThreadPoolExecutor(max(1, a.jobs)) as pool:  # each a subprocess: threads only wait
        scored = dict(zip(runs, pool.map(train_and_score, runs)))
    for kind in a.pairs:
        for lr in a.lr:
            rows = [("chat-tuned (the starting checkpoint)", [start])]
            rows += [(f"+{a.steps} steps: {ARMS[arm][0].replace('--dpop', f'{a.dpop:g}')}",
                      [got for seed in a.seeds if (got := scored[arm_name(arm, a, kind, lr, seed)]) is not None])
                     for arm in a.arms]
            print(f"\n{kind} pairs: {n_pairs[kind]:,}; lr {lr:g}, batch {a.batch}, DPO beta {a.beta:g}; "
                  f"seeds {a.seeds}{'; ' + ' '.join(a.set) if a.set else ''}")
            print(f"exact match on {a.held} held-out conversations (greedy):")
            table(rows, a.seeds)
    print("\ncommands:")
    for c in chat_sft.COMMANDS:
        print("  " + c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
