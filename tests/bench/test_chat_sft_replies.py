"""bench/chat_sft.py scores checkpoints with a batched greedy decoder (prompts of one length together, one KV cache):
its replies must be the ones `workbench chat` gives (workbench.train.chat_reply.reply), one conversation at a time."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.chat import conversations, write_jsonl
from tests.support.cli import TINY, wb

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import chat_sft  # noqa: E402


def test_batched_replies_are_the_chat_commands_replies(tmp_path):
    import torch

    from workbench.data.chat.chat_templates import load_chat_template
    from workbench.data.text.tokenizer import load_tokenizer
    from workbench.train.chat_reply import reply
    from workbench.train.checkpoint import load_run_model

    corpus = write_jsonl(tmp_path / "chat.jsonl", conversations(300, seed=0))
    wb("train", "cpu-small", "--corpus", str(corpus), "--runs-dir", str(tmp_path), "--name", "sft", "--set", *TINY,
       "model.seq_len=64", "model.vocab_size=400", "data.chat_template=chatml", "train.max_iters=150",
       "train.eval_interval=150", "train.lr=3e-3")
    held = conversations(40, seed=1)
    got = chat_sft.replies(tmp_path / "sft", "latest", held, batch=8)  # batches of 8: several per length too

    model, tok = load_run_model(tmp_path / "sft", "latest").model, load_tokenizer(tmp_path / "sft")
    template = load_chat_template("chatml")
    longest = 4 + max(len(tok.encode(r["messages"][-1]["content"])) for r in held)
    with torch.no_grad():
        want = [reply(model, tok, template, r["messages"][:-1], max_tokens=longest).text for r in held]
    assert got == want
    from workbench.data.chat.conversations import ChatEncoder
    enc = ChatEncoder(template, tok)
    batched = [r for r in held if len(enc.prompt_ids(r["messages"][:-1])) + longest <= 64]
    assert 20 <= len(batched) < len(held)  # most went through the batches; the rest through reply itself
    assert len(set(want)) > 10 and any(w in ("pink", "red", "blue") for w in want)  # replies, not one token
