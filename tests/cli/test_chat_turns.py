"""`workbench chat` passes the model the whole conversation: a model that learned to answer a question from an
earlier turn (or from the system message) answers it right only when the front end gave it that turn. Interactive
turns keep the history and /reset forgets it; --conversation passes every message; --system comes first."""

from __future__ import annotations

import json

import pytest

from tests.support.chat import MEMORY_WORDS, RECALL, REMEMBER, WHAT_WORD, memory_conversations, write_jsonl
from tests.support.cli import TINY, wb

SETS = [*TINY, "model.seq_len=96", "model.vocab_size=400", "train.batch_size=8", "train.warmup_iters=5",
        "train.log_interval=50", "train.max_iters=300", "train.eval_interval=300", "train.ckpt_interval=300",
        "train.lr=3e-3"]


@pytest.fixture(scope="module")
def memory(tmp_path_factory):
    """A tiny chat model that learned the memory task (300 steps, ~5 s), and its reply to the recall question
    asked alone (what it says with no earlier turn to answer from)."""
    d = tmp_path_factory.mktemp("memory")
    f = write_jsonl(d / "memory.jsonl", memory_conversations())
    wb("train", "cpu-small", "--corpus", str(f), "--runs-dir", str(d), "--name", "m", "--set", *SETS, check=True)
    alone = _reply(d, "--message", RECALL)
    return d, alone


def _reply(root, *args: str) -> str:
    return wb("chat", "m", "--runs-dir", str(root), "--max-new-tokens", "8", *args, check=True).stdout.rstrip("\n")


def _other_words(alone: str, n: int) -> list[str]:
    """Words the model does not say without the turn that holds them."""
    return [w for w in MEMORY_WORDS if w != alone][:n]


def test_interactive_turns_keep_the_conversation_and_reset_forgets_it(memory):
    root, alone = memory
    a, b = _other_words(alone, 2)
    said = f"{REMEMBER.format(a)}\n{RECALL}\n/reset\n{REMEMBER.format(b)}\n{RECALL}\n/reset\n{RECALL}\n\n"
    cp = wb("chat", "m", "--runs-dir", str(root), "--max-new-tokens", "8", input=said, check=True)
    replies = [part.split("\n")[0] for part in cp.stdout.split("model> ")[1:]]
    # the second answer of each conversation is its first turn's word; after /reset the model has no turn to go on
    assert replies == ["OK.", a, "OK.", b, alone], cp.stdout


def test_a_conversation_file_passes_every_message(memory, tmp_path):
    root, alone = memory
    for w in _other_words(alone, 3):
        f = tmp_path / f"{w}.json"
        f.write_text(json.dumps({"messages": [{"role": "user", "content": REMEMBER.format(w)},
                                              {"role": "assistant", "content": "OK."},
                                              {"role": "user", "content": RECALL}]}))
        assert _reply(root, "--conversation", str(f)) == w
        out = json.loads(_reply(root, "--conversation", str(f), "--json"))
        assert out["reply"] == w and out["stopped"]


def test_the_system_message_comes_first_in_every_mode(memory):
    root, _ = memory
    plain = _reply(root, "--message", WHAT_WORD)
    words = [w for w in MEMORY_WORDS if w != plain][:3]
    for w in words:
        assert _reply(root, "--system", f"The word is {w}.", "--message", WHAT_WORD) == w
    # interactive: the system message stays through /reset
    cp = wb("chat", "m", "--runs-dir", str(root), "--max-new-tokens", "8", "--system", f"The word is {words[0]}.",
            input=f"{WHAT_WORD}\n/reset\n{WHAT_WORD}\n\n", check=True)
    assert [part.split("\n")[0] for part in cp.stdout.split("model> ")[1:]] == [words[0], words[0]]
