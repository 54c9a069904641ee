"""A chain of chat fine-tunes from a model saved by transformers (its template in chat_template.jinja): import,
SFT, SFT again from that run (LoRA, detached as the TUI starts it), a full SFT with another template, and one
more from that: each link trains through the template the link before it trained with and keeps it. A chat
fine-tune that cannot find a template is refused before any run directory exists."""

from __future__ import annotations

import pytest

from tests.support.chat import conversations, write_jsonl
from tests.support.cli import wb
from tests.support.hf import CHAT_TEMPLATE, FT
from tests.support.runs import tree, wait_until
from workbench import rundir
from workbench.data.chat_templates import CHATML_TEMPLATE, run_template

STEPS = ["model.seq_len=64", "train.max_iters=4", "train.eval_interval=4", "train.ckpt_interval=4",
         "train.eval_iters=1"]


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("chain") / "chats.jsonl", conversations(120, seed=3))


def sft(root, source: str, name: str, chats, *sets: str, detach: bool = False):
    return wb("train", "cpu-small", "--init-from", source, "--name", name, "--corpus", str(chats),
              "--runs-dir", str(root), *(["--detach"] if detach else []), "--set", *FT, *STEPS, *sets)


def finished(run_dir):
    st = rundir.read_status(run_dir)
    return st if st.state in ("finished", "failed") else None


def test_a_chain_of_chat_fine_tunes_keeps_the_template(hf_chat_model, chats, tmp_path):
    root = tmp_path / "runs"
    assert wb("import", str(hf_chat_model), "--name", "base", "--runs-dir", str(root)).returncode == 0
    cp = sft(root, "base", "sft1", chats)
    assert cp.returncode == 0, cp.stderr
    cp = sft(root, "sft1", "sft2", chats, "train.finetune=lora", detach=True)  # as the TUI's ctrl+s starts it
    assert cp.returncode == 0, cp.stderr
    st = wait_until(lambda: finished(root / "sft2"), 120, "sft2 to end")
    assert st.state == "finished", (root / "sft2" / "train.log").read_text()[-2000:]
    for run in ("base", "sft1", "sft2"):
        assert (root / run / "chat_template.jinja").read_text(encoding="utf-8") == CHAT_TEMPLATE, run
    assert "template" in (root / "sft2" / "train.log").read_text()
    # another template chosen for one link is what the next link trains with
    cp = sft(root, "sft2", "sft3", chats, "data.chat_template=chatml")
    assert cp.returncode == 0, cp.stderr
    cp = sft(root, "sft3", "sft4", chats)
    assert cp.returncode == 0, cp.stderr
    for run in ("sft3", "sft4"):
        assert run_template(root / run).text == CHATML_TEMPLATE, run
    chat = wb("chat", "sft4", "--runs-dir", str(root), "--message", "Sort: 3 1 2", "--max-new-tokens", "4")
    assert chat.returncode == 0, chat.stderr
    # the imported base is scored on a chat task through its own template: the fine-tune's card has a Δ from it
    task = write_jsonl(tmp_path / "held-out.jsonl", conversations(5, seed=99))
    for run in ("base", "sft1"):
        cp = wb("eval", run, "--task", str(task), "--runs-dir", str(root), "--json")
        assert cp.returncode == 0, cp.stderr
    card = wb("eval", "sft1", "--task", str(task), "--runs-dir", str(root), check=True).stdout
    head = card.index("Δ source base@0")
    row = next(ln for ln in card[head:].splitlines() if ln.strip().startswith("held-out"))  # the card's row
    assert not row.rstrip().endswith("—"), card


@pytest.mark.parametrize("detach", [False, True])
def test_a_chat_fine_tune_without_a_template_leaves_nothing(imported, chats, tmp_path, detach):
    """An imported model with no template (and no ChatML pieces): one line, exit 2, no run directory, in the
    foreground and detached (the TUI's way)."""
    root = imported
    before = tree(root)
    cp = sft(root, "llama-gqa-tied", "nope", chats, detach=detach)
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert cp.stderr.strip().splitlines() == [cp.stderr.strip()] and "has no chat template" in cp.stderr
    assert 'data.chat_template = "chatml"' in cp.stderr
    assert tree(root) == before
