"""Preference tuning teaches: on bench/chat_sft.py's checkable task, a model chat-tuned briefly, then tuned for the
same number of extra steps three ways from that checkpoint: SFT on the correct answers alone, DPO on pairs of the
correct and a wrong answer, and SimPO (reference-free) on the same pairs. Greedy exact match on held-out
conversations before and after.

    python bench/preference.py [--out DIR] [--pretrain 150] [--sft 200] [--steps 100] [--held 100]

1. Pretrains cpu-small (model.seq_len 128) on the built-in corpus, then chat-tunes it (`--init-from`) on 2,000
   generated conversations (tests/support/chat.py, seed 0).
2. Writes a pair for each of those conversations: the correct answer chosen, a wrong one rejected (generated:
   the words not reversed, the numbers reversed instead of sorted, another colour of the table).
3. From the chat-tuned checkpoint, --steps more steps each: SFT on the conversations; train.objective = dpo on
   the pairs; the same with an SFT term on the chosen answers (``train.pref_sft_weight = 1``, RPO's recipe);
   train.objective = simpo on the pairs. The same learning rate and seed.
4. Exact match on --held held-out conversations (seed 1): the chat-tuned checkpoint and each arm's last.

Every run goes through the real CLI in a subprocess; the commands are printed at the end.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import chat_sft  # noqa: E402

from tests.support.chat import COLOURS, conversations, write_jsonl  # noqa: E402

ARMS = (("SFT on the correct answers", "chats", []),
        ("DPO on correct vs wrong pairs", "pairs", ["train.objective=dpo"]),
        ("DPO + an SFT term on the chosen (weight 1)", "pairs", ["train.objective=dpo", "train.pref_sft_weight=1"]),
        ("SimPO on the same pairs (no reference)", "pairs", ["train.objective=simpo"]))


def wrong_answer(rec: dict, rng: random.Random) -> str:
    """A plausible wrong answer to a conversation of the task."""
    msgs = rec["messages"]
    ask, ans = msgs[-2]["content"], msgs[-1]["content"]
    if ask.startswith("Reverse the words: "):
        return ask.removeprefix("Reverse the words: ")          # not reversed
    if ask.startswith("Sort: "):
        wrong = " ".join(sorted(ans.split(), key=int, reverse=True))  # the wrong order
        return wrong if wrong != ans else ans + " 0"
    return rng.choice([c for c in COLOURS if c != ans])          # another colour


def pairs_of(recs: list[dict], seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": r["messages"][:-1], "chosen": [r["messages"][-1]], "rejected": wrong_answer(r, rng)}
            for r in recs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pretrain", type=int, default=150, help="pretraining steps; 0: chat-tune from scratch")
    ap.add_argument("--sft", type=int, default=200, help="chat-tuning steps before the comparison")
    ap.add_argument("--steps", type=int, default=100, help="extra steps of each arm")
    ap.add_argument("--held", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3, help="each arm's learning rate")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="wb-pref-"))
    out.mkdir(parents=True, exist_ok=True)
    train_recs = conversations(2000, seed=0)
    chats = str(write_jsonl(out / "chats.jsonl", train_recs))
    pairs = str(write_jsonl(out / "pairs.jsonl", pairs_of(train_recs)))
    held = conversations(a.held, seed=1)
    base = [*chat_sft.COMMON, "train.optimizer=adamw", "train.schedule=cosine", "train.lr=2e-3",
            "train.warmup_iters=20"]
    print(f"runs in {out}", flush=True)
    if a.pretrain:
        chat_sft.train(out, "pre", "builtin", [*base, f"train.max_iters={a.pretrain}",
                                               f"train.eval_interval={a.pretrain}"])
    chat_sft.train(out, "sft", chats, [*base, f"train.max_iters={a.sft}", f"train.eval_interval={a.sft}",
                                       *([] if a.pretrain else ["model.vocab_size=512", "data.chat_template=chatml"])],
                   init_from="pre" if a.pretrain else None)
    before = chat_sft.score(out / "runs" / "sft", "latest", held)
    rows = [("chat-tuned (the starting checkpoint)", before)]
    arm_sets = [*chat_sft.COMMON, "train.optimizer=adamw", "train.schedule=cosine", f"train.lr={a.lr:g}",
                "train.warmup_iters=10", f"train.max_iters={a.steps}", f"train.eval_interval={a.steps}",
                "train.batch_size=8"]
    for k, (label, corpus, sets) in enumerate(ARMS):
        name = f"arm{k}"
        chat_sft.train(out, name, chats if corpus == "chats" else pairs, [*arm_sets, *sets], init_from="sft")
        rows.append((f"+{a.steps} steps: {label}", chat_sft.score(out / "runs" / name, "latest", held)))
    print(f"\nexact match on {a.held} held-out conversations (greedy):")
    print(f"  {'model':<52} {'all':>6} {'reverse':>8} {'sort':>6} {'colour':>7}")
    for label, s in rows:
        print(f"  {label:<52} {s['all']:>5.1f}% {s['reverse']:>7.1f}% {s['sort']:>5.1f}% {s['colour']:>6.1f}%")
    print("\ncommands:")
    for c in chat_sft.COMMANDS:
        print("  " + c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
