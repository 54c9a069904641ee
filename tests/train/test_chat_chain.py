"""A chain of chat fine-tunes from a model saved by transformers (its template in chat_template.jinja): import,
SFT, SFT again from that run (LoRA, detached as the TUI starts it), a full SFT with another template, and one
more from that: each link trains through the template the link before it trained with and keeps it. A chat
fine-tune that cannot find a template is refused before any run directory exists."""

from __future__ import annotations

import json
import random

import pytest

from tests.support.chat import conversations, write_jsonl
from tests.support.cli import wb
from tests.support.hf import CHAT_TEMPLATE, FT
from tests.support.runs import tree, wait_until
from workbench import rundir
from workbench.data.chat.chat_templates import CHATML_TEMPLATE, run_template

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


# ----------------------------------------------------------------------------- the README's chat flow, end to end

# A fixed mapping a tiny model learns in a hundred steps: the colour of a thing, asked in one of five ways. Five
# (question, thing) pairs are held out: each thing and each way of asking is trained, never those pairs.
COLOURS = {"apple": "red", "river": "blue", "stone": "grey", "cloud": "white", "tiger": "orange", "lamp": "yellow",
           "maple": "green", "ocean": "teal", "coal": "black", "rose": "pink", "plum": "purple", "sand": "beige"}
ASKS = ("What colour is {}?", "Colour of {}?", "Tell me the colour of {}.", "Which colour has {}?",
        "Name the colour of {}.")
HELD_OUT = (("Name the colour of {}.", "apple"), ("Tell me the colour of {}.", "rose"), ("Colour of {}?", "sand"),
            ("What colour is {}?", "maple"), ("Which colour has {}?", "coal"))
LEARN = ["model.seq_len=64", "train.batch_size=16", "train.warmup_iters=5", "train.eval_iters=1",
         "train.log_interval=10", "hardware.nproc=1", "hardware.compile=false", "data.val_fraction=0.05",
         "train.lr=3e-3"]


def _colour_chat(ask: str, thing: str) -> dict:
    return {"messages": [{"role": "user", "content": ask.format(thing)},
                         {"role": "assistant", "content": COLOURS[thing]}]}


@pytest.fixture(scope="module")
def learned(hf_chat_model, tmp_path_factory):
    """The README's chat flow up to `workbench chat`: a model saved by transformers (its template in
    chat_template.jinja) imported, chat-tuned through that template on the colours (100 steps), and tuned again from
    that run (20 steps): (runs directory, the second tune's run id)."""
    d = tmp_path_factory.mktemp("colours")
    root = d / "runs"
    pairs = [(a, t) for a in ASKS for t in COLOURS if (a, t) not in HELD_OUT]
    random.Random(0).shuffle(pairs)
    chats = write_jsonl(d / "colours.jsonl", [_colour_chat(a, t) for a, t in pairs] * 12)
    wb("import", str(hf_chat_model), "--name", "tiny", "--runs-dir", str(root), check=True)
    for source, name, steps in (("tiny", "colours", 100), ("colours", "colours-more", 20)):
        wb("train", "cpu-small", "--init-from", source, "--name", name, "--corpus", str(chats), "--runs-dir", str(root),
           "--set", *LEARN, f"train.max_iters={steps}", f"train.eval_interval={steps}", f"train.ckpt_interval={steps}",
           check=True)
        assert (root / name / "chat_template.jinja").read_text(encoding="utf-8") == CHAT_TEMPLATE, name
    return root, "colours-more"


def test_the_readme_chat_flow_gives_llama_cpp_the_replies_workbench_chat_gives(learned, tmp_path):
    """Import, a chat tune with the model's own template, a second from it, `workbench chat`, export HF and GGUF:
    on five held-out conversations the replies are the right colours and stop at the end-of-turn token, and
    llama.cpp (greedy, from the GGUF alone, through the template it carries) and transformers (from the HF
    directory) give the same ones."""
    import llama_cpp
    import torch
    import transformers

    root, run = learned
    replies = []
    for ask, thing in HELD_OUT:
        cp = wb("chat", run, "--runs-dir", str(root), "--message", ask.format(thing), "--json", "--max-new-tokens", "8",
                check=True)
        out = json.loads(cp.stdout)
        replies.append(out)
        assert (out["reply"], out["stopped"]) == (COLOURS[thing], True), (ask.format(thing), out)
    wb("export", run, str(tmp_path / "hf"), "--runs-dir", str(root), "--format", "hf", check=True)
    wb("export", run, str(tmp_path / "gguf"), "--runs-dir", str(root), "--format", "gguf", "--gguf-type", "f32",
       check=True)
    llm = llama_cpp.Llama(model_path=str(tmp_path / "gguf" / "model.gguf"), n_ctx=64, verbose=False)
    assert llm.metadata["tokenizer.chat_template"] == CHAT_TEMPLATE
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    end = hf_tok.convert_tokens_to_ids("<|im_end|>")  # the end of a turn ends generation in the export
    assert end in hf.generation_config.eos_token_id
    for (ask, thing), ours in zip(HELD_OUT, replies):
        messages = [{"role": "user", "content": ask.format(thing)}]
        got = llm.create_chat_completion(messages=messages, temperature=0, max_tokens=8)["choices"][0]
        assert (got["message"]["content"], got["finish_reason"]) == (ours["reply"], "stop"), (messages, got, ours)
        ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        gen = hf.generate(**ids, max_new_tokens=8, do_sample=False)[0, ids["input_ids"].shape[1]:].tolist()
        assert gen == ours["ids"] + [end], (messages, gen, ours)
