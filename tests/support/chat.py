"""A generated instruction set whose answers can be checked: reverse a list of words, sort numbers, look up a
fact from a table given in the system prompt. Made from a seed, so tests and bench/chat_sft.py share it."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.support.cli import TINY

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lamp", "green", "bread", "salt", "piano", "ocean", "chair",
         "ember", "violet", "maple", "copper", "frost", "honey", "kite", "lemon")
NAMES = ("Ada", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivo", "Juno", "Kai", "Lea")
COLOURS = ("red", "blue", "green", "amber", "white", "black", "grey", "pink")


def conversation(rng: random.Random) -> dict:
    """One OpenAI-style record: {"messages": [...]}; the last assistant message is the checkable answer."""
    kind = rng.randrange(3)
    if kind == 0:
        words = rng.sample(WORDS, rng.randint(3, 6))
        return {"messages": [{"role": "user", "content": "Reverse the words: " + " ".join(words)},
                             {"role": "assistant", "content": " ".join(reversed(words))}]}
    if kind == 1:
        nums = [rng.randint(0, 99) for _ in range(rng.randint(3, 6))]
        return {"messages": [{"role": "user", "content": "Sort: " + " ".join(map(str, nums))},
                             {"role": "assistant", "content": " ".join(map(str, sorted(nums)))}]}
    names = rng.sample(NAMES, 4)
    table = {n: rng.choice(COLOURS) for n in names}
    who = rng.choice(names)
    system = "Colours: " + ", ".join(f"{n}={c}" for n, c in table.items())
    return {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": f"Colour of {who}?"},
                         {"role": "assistant", "content": table[who]}]}


# The Sample pane's chat tests' run (tests/tui/conftest.py chat_sft_once): 60 steps of a tiny model on 300 of these
# conversations (seed 1), a checkpoint every 10 steps, all kept (the tests pick replies of steps 30, 40 and 60).
CHAT_SFT = [*TINY, "model.seq_len=64", "model.vocab_size=400", "train.batch_size=8", "train.log_interval=10",
            "train.max_iters=60", "train.eval_interval=60", "train.ckpt_interval=10", "train.keep_last=6",
            "train.lr=6e-3"]


def conversations(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(n)]


def pair_records(n: int, seed: int = 1) -> list[dict]:
    """Preference pairs of the generated task: the correct answer chosen, a wrong one (its words reversed, or a
    word added) rejected."""
    out = []
    for c in conversations(n, seed=seed):
        msgs = c["messages"]
        ans = msgs[-1]["content"]
        wrong = " ".join(reversed(ans.split())) if len(set(ans.split())) > 1 else ans + " red"
        out.append({"prompt": msgs[:-1], "chosen": [{"role": "assistant", "content": ans}], "rejected": wrong})
    return out


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# A task whose answer only the earlier turns (or the system message) hold: a model that learned it answers the
# second question with the word of the first turn, so what a chat front end passed to it can be read off its reply.
MEMORY_WORDS = ("apple", "river", "stone", "cloud", "tiger", "lamp", "maple", "ocean")
REMEMBER, RECALL, WHAT_WORD = "Remember {}.", "What did I ask you to remember?", "What is the word?"


def memory_conversations(copies: int = 40, seed: int = 0) -> list[dict]:
    """Two conversations a word, ``copies`` times each, shuffled: "Remember apple." / "OK." / "What did I ask you to
    remember?" / "apple"; and a system message "The word is apple." / "What is the word?" / "apple"."""
    one = []
    for w in MEMORY_WORDS:
        one.append({"messages": [{"role": "user", "content": REMEMBER.format(w)},
                                 {"role": "assistant", "content": "OK."},
                                 {"role": "user", "content": RECALL}, {"role": "assistant", "content": w}]})
        one.append({"messages": [{"role": "system", "content": f"The word is {w}."},
                                 {"role": "user", "content": WHAT_WORD}, {"role": "assistant", "content": w}]})
    out = one * copies
    random.Random(seed).shuffle(out)
    return out
