"""Chat fine-tuning's training side: the labels and targets a batch carries (prompt tokens never in the loss,
the end-of-turn token always, last_assistant only the last turn), packing (no cross-talk: a packed row gives
each conversation the logits it has alone; positions restart), the loss as the mean over a step's trained
targets (grad accumulation 4 x 1 = 1 x 4 on ragged masks, fused and plain loss), and real runs: resume after
kill -9 is bitwise, bad input is one line."""

from __future__ import annotations

import json
import lzma
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from tests.support.chat import conversations, write_jsonl
from tests.support.cli import TINY, wb
from tests.support.files import tokens_path
from tests.support.runs import losses, read_jsonl
from workbench import rundir
from workbench.config import DataConfig, ModelConfig, TrainConfig, preset_to_toml, resolve_preset
from workbench.data.chat.chat_data import IGNORE, LAST, PROMPT, TRAINED, ChatSampler, pack
from workbench.data.chat.chat_templates import CHATML_END, CHATML_START, run_template
from workbench.data.chat.conversations import ChatEncoder
from workbench.data.preset_data import prepare_data
from workbench.data.text.tokenizer import load_tokenizer
from workbench.train.chat_reply import reply
from workbench.train.checkpoint import load_run_model
from workbench.train.generate import generate
from workbench.train.loop import Trainer
from workbench.train.model import GPT, fused_cross_entropy

SEQ = 64
CHAT = [*TINY, f"model.seq_len={SEQ}", "model.vocab_size=400"]


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory):
    """400 generated conversations, a quarter of them with two exchanges (so last_assistant differs)."""
    recs = conversations(400, seed=1)
    for i in range(0, 400, 4):
        second = conversations(1, seed=1000 + i)[0]["messages"]
        recs[i] = {"messages": recs[i]["messages"] + [m for m in second if m["role"] != "system"]}
    return write_jsonl(tmp_path_factory.mktemp("chat") / "chat.jsonl", recs)


@pytest.fixture(scope="module")
def chat_data(chat_file):
    return prepare_data(DataConfig(corpus=str(chat_file)), 400, SEQ, log=lambda m: None)


def _targets_of(data, c: int, trains) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = data.offsets[c], data.offsets[c + 1]
    ids, lab = np.asarray(data.tokens[lo:hi], dtype=np.int64), np.asarray(data.labels[lo:hi])
    return ids, np.where(trains[lab[1:]], ids[1:], IGNORE)


def test_labels_train_answers_and_end_of_turn_never_the_prompt(chat_data, chat_file):
    d, tok = chat_data, chat_data.tokenizer
    records = [json.loads(line) for line in chat_file.read_text().splitlines()]
    start, end = (tok.sp.piece_to_id(p) for p in (CHATML_START, CHATML_END))
    assert d.format == "chat" and d.documents == 400 and d.index["skipped_records"] == 0
    for c in range(40):
        ids = np.asarray(d.tokens[d.offsets[c]:d.offsets[c + 1]])
        lab = np.asarray(d.labels[d.offsets[c]:d.offsets[c + 1]])
        # every run of trained tokens ends with <|im_end|>; no header or user token is trained
        runs = np.flatnonzero(np.diff(np.r_[0, lab > 0, 0]))
        pairs = runs.reshape(-1, 2)
        answers = [m["content"] for m in records[c]["messages"] if m["role"] == "assistant"]
        assert len(pairs) == len(answers)
        for (a, b), answer in zip(pairs, answers):
            assert ids[b - 1] == end
            assert tok.decode(ids[a:b - 1].tolist()) == answer   # the content and <|im_end|>, nothing else
            assert start not in ids[a:b]
            trained_text = tok.decode(ids[a:b].tolist())
            assert "user" not in trained_text and "Reverse" not in trained_text and "Sort" not in trained_text
        assert (lab[pairs[-1][0]:pairs[-1][1]] == LAST).all()
        assert set(lab[:pairs[-1][0]].tolist()) <= {PROMPT, TRAINED}
        # the prompt: the header of the last turn is not trained
        assert lab[pairs[-1][0] - 1] == PROMPT


@pytest.mark.parametrize("loss_on", ["assistant", "last_assistant", "all"])
def test_batches_carry_exactly_the_trained_targets(chat_data, loss_on):
    s = ChatSampler(chat_data, "train", SEQ, 8, seed=3, loss_on=loss_on)
    trains = s.trains
    seen = 0
    for _ in range(6):
        rows = s.order.order[s.order.pos:s.order.pos + 8].tolist()
        batch = s.next_batch()
        assert batch.masked
        x, y, pos, seg = batch.inputs, batch.targets, batch.positions, batch.segments
        for b, r in enumerate(rows):
            at = 0
            for k, c in enumerate(s.rows.items[s.rows.starts[r]:s.rows.starts[r + 1]].tolist()):
                ids, want = _targets_of(chat_data, c, trains)
                n = min(len(ids) - 1, SEQ)
                assert (x[b, at:at + n] == ids[:n]).all()
                assert (y[b, at:at + n] == want[:n]).all()
                assert (pos[b, at:at + n] == np.arange(n)).all()      # positions restart in each conversation
                assert (seg[b, at:at + n] == k).all()
                at += n
                seen += 1
            assert (y[b, at:] == IGNORE).all() and (seg[b, at:] == -1).all()
    assert seen > 48
    n_two_turns = 0
    for c in range(0, 40, 4):  # the two-exchange conversations: last_assistant leaves the first answer out
        ids, want = _targets_of(chat_data, c, trains)
        _, every = _targets_of(chat_data, c, np.array([True, True, True]))
        answers = (np.asarray(chat_data.labels[chat_data.offsets[c] + 1:chat_data.offsets[c + 1]]) > 0).sum()
        trained = (want != IGNORE).sum()
        if loss_on == "all":
            assert trained == len(ids) - 1 and (want == every).all()
        elif loss_on == "assistant":
            assert trained == answers
        else:
            lab = np.asarray(chat_data.labels[chat_data.offsets[c]:chat_data.offsets[c + 1]])
            assert trained == (lab[1:] == LAST).sum() < answers
            n_two_turns += 1
    assert loss_on != "last_assistant" or n_two_turns == 10


def test_packing_is_best_fit_and_counts_what_does_not_fit():
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 50, size=500).astype(np.uint32)
    lengths[:5] = 90                                   # longer than a row
    p = pack(lengths, 64)
    placed = p.items.tolist()
    assert sorted(placed) == list(range(500))          # every conversation once
    for r in range(p.rows):
        assert sum(min(int(lengths[c]) - 1, 64) for c in p.items[p.starts[r]:p.starts[r + 1]]) <= 64
    assert p.truncated == 5 and p.dropped == 0 and p.efficiency > 0.95
    d = pack(lengths, 64, overlong="drop")
    assert d.dropped == 5 and d.truncated == 0 and sorted(d.items.tolist()) == list(range(5, 500))
    u = pack(lengths, 64, packing=False)
    assert u.rows == 500 and u.efficiency < 0.5


def _tiny_model(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=SEQ), **kw).eval()


def test_a_packed_row_gives_each_conversation_its_logits_alone():
    m = _tiny_model()
    g = torch.Generator().manual_seed(1)
    convs = [torch.randint(0, 97, (n,), generator=g) for n in (9, 17, 5, 20)]
    x = torch.cat(convs)[None]
    pos = torch.cat([torch.arange(len(c)) for c in convs])[None]
    seg = torch.cat([torch.full((len(c),), k) for k, c in enumerate(convs)])[None]
    y = torch.zeros_like(x)
    with torch.no_grad():
        packed = m(x, y, positions=pos, segments=seg)[0][0]
        no_mask = m(x, y, positions=pos)[0][0]
        at = 0
        for c in convs:
            alone = m(c[None], torch.zeros_like(c[None]))[0][0]
            assert torch.allclose(packed[at:at + len(c)], alone, atol=1e-5)
            if at:  # the same row without the mask is not the same (RoPE is relative: inside the mask, a shift
                # of every position changes nothing but rounding; the batches' positions are checked above)
                assert not torch.allclose(no_mask[at:at + len(c)], alone, atol=1e-3)
            at += len(c)


def test_the_trainers_packed_step_trains_each_conversation_as_if_alone(chat_file, tmp_path):
    """The trainer's own step (train/loop.py) on packed rows, two micro-batches: its loss and every gradient equal
    those of the same conversations run one a row, each alone with its own positions, the loss the mean over the
    step's trained targets (fp32, 1e-5). The model's masking is tested above; this is what reaches it in training:
    a step that left the segments out (conversations attending to each other) trained on cross-talk."""
    run_dir = tmp_path / "packed"
    run_dir.mkdir()
    p = resolve_preset("cpu-small", [*CHAT, "model.seq_len=192", "train.batch_size=4", "train.grad_accum=2",
                                     "model.dropout=0.0"], {"data": {"corpus": str(chat_file)}})
    (run_dir / "preset.toml").write_text(preset_to_toml(p))
    trainer = Trainer(run_dir, echo=False)
    try:
        trainer.setup()
        assert trainer.sampler.packed and trainer.settings.precision == "fp32"
        model = trainer.built.model
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        at = trainer.sampler.state()
        batches = [trainer.sampler.next_batch() for _ in range(2)]   # what the step will draw
        trainer.sampler.set_state(at)
        grads: dict[str, torch.Tensor] = {}
        for name, q in model.named_parameters():
            q.register_post_accumulate_grad_hook(lambda q, n=name: grads.__setitem__(n, q.grad.detach().clone()))
        trainer.train_step()
        trainer.skips.settle()  # the loss read back (a step late with the non-finite check on the device)
        step_loss = trainer.skips.result.loss
    finally:
        trainer.lock.release()
        trainer.report.close()
    # several conversations share a row in these batches (else packing proves nothing)
    assert max(len(set(b.segments[b.segments >= 0].tolist())) for b in batches) >= 3
    ref = GPT(p.model)
    ref.load_state_dict(before)
    trained = sum(int((b.targets != IGNORE).sum()) for b in batches)
    loss = torch.zeros(())
    for x, y, seg in ((b.inputs, b.targets, b.segments) for b in batches):
        for b in range(len(x)):
            for k in sorted(set(seg[b][seg[b] >= 0].tolist())):
                cols = seg[b] == k
                xc, yc = (torch.from_numpy(a[b][cols])[None] for a in (x, y))
                loss = loss + ref(xc, yc, loss_tokens=float(trained))[1]  # positions 0.. by default: alone
    loss.backward()
    assert step_loss == pytest.approx(loss.item(), abs=1e-5)
    assert set(grads) == {n for n, _ in ref.named_parameters()}
    for name, q in ref.named_parameters():
        torch.testing.assert_close(grads[name], q.grad, atol=1e-5, rtol=0, msg=name)


def test_fused_loss_skips_ignored_targets_as_the_plain_loss_does():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 50, (40,), generator=g)
    t[::3] = IGNORE
    fused = fused_cross_entropy(x, w, t, 7, denom=13.0)
    fused.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    plain = torch.nn.functional.cross_entropy(x @ w.t(), t, ignore_index=IGNORE, reduction="sum") / 13.0
    plain.backward()
    assert torch.allclose(fused, plain, atol=1e-5)
    assert torch.allclose(gx, x.grad, atol=1e-6) and torch.allclose(gw, w.grad, atol=1e-6)


def _run(root, chat_file, name, *sets, env=None, check=True):
    return wb("train", "cpu-small", "--corpus", str(chat_file), "--runs-dir", str(root), "--name", name,
              "--set", *CHAT, *sets, env=env, check=check)


@pytest.mark.parametrize("chunked", ["true", "false"])
def test_grad_accumulation_weighs_every_trained_token_alike(chat_file, tmp_path, chunked):
    """4 micro-batches of 1 row and 1 of 4 rows: the same rows, ragged masks; the same losses and weights."""
    common = ["train.max_iters=3", "train.warmup_iters=1", "train.eval_interval=3", "train.ckpt_interval=3",
              f"hardware.chunked_loss={chunked}"]
    _run(tmp_path, chat_file, "one", "train.batch_size=4", "train.grad_accum=1", *common)
    _run(tmp_path, chat_file, "four", "train.batch_size=1", "train.grad_accum=4", *common)
    a, b = losses(tmp_path / "one"), losses(tmp_path / "four")
    assert sorted(a) == [1, 2, 3]
    for step in a:
        assert a[step] == pytest.approx(b[step], abs=1e-5)
    ma, mb = (load_run_model(tmp_path / n, "latest").state_dict for n in ("one", "four"))
    for k in ma:
        assert torch.allclose(ma[k], mb[k], atol=1e-5), k


def test_chat_run_killed_and_resumed_is_bitwise(chat_file, tmp_path):
    sets = ["train.max_iters=12", "train.lr_decay_iters=12", "train.ckpt_interval=5", "train.eval_interval=8",
            "model.dropout=0.1"]
    _run(tmp_path, chat_file, "straight", *sets)
    cp = _run(tmp_path, chat_file, "killed", *sets, env={"WORKBENCH_TEST_KILL_AT_STEP": "7"}, check=False)
    assert cp.returncode == -signal.SIGKILL
    assert [c["step"] for c in rundir.list_checkpoints(tmp_path / "killed")] == [5]
    res = wb("resume", "killed", "--runs-dir", str(tmp_path), check=True)
    assert "resumed from checkpoint step_0000005" in res.stdout
    straight, after = losses(tmp_path / "straight"), losses(tmp_path / "killed")
    assert sorted(straight) == list(range(1, 13)) and after == straight
    assert (tmp_path / "straight" / "chat_template.jinja").read_text().startswith("{%- for message in messages")


def test_text_data_with_loss_on_is_one_line(tmp_path):
    (tmp_path / "t.txt").write_text("plain text, not conversations\n" * 200)
    cp = wb("train", "cpu-small", "--corpus", str(tmp_path / "t.txt"), "--runs-dir", str(tmp_path / "runs"),
            "--set", *CHAT, "data.format=text", "train.loss_on=all")
    assert cp.returncode == 2
    assert "train.loss_on = all applies to chat data, but data.format = text" in cp.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_one_conversation_a_row_in_a_real_run(chat_file, chat_data, tmp_path):
    """data.packing = false (README): a run trains one conversation a row, padded, and its start says so."""
    _run(tmp_path, chat_file, "rows", "data.packing=false", "train.max_iters=4", "train.eval_interval=4",
         "train.ckpt_interval=4")
    d = tmp_path / "rows"
    assert rundir.read_status(d).state == "finished" and sorted(losses(d)) == [1, 2, 3, 4]
    facts = next(r for r in read_jsonl(d / "metrics.jsonl") if r.get("event") == "start")["chat"]
    one, packed = pack(chat_data.lengths("train"), SEQ, packing=False), pack(chat_data.lengths("train"), SEQ)
    assert facts["packing"] is False and facts["conversations"] == one.rows == 380
    assert facts["row_fill"] == pytest.approx(one.efficiency, abs=1e-4) and one.efficiency < packed.efficiency
    assert "one a row into 380 rows of 64" in (d / "train.log").read_text()


def test_a_chat_task_is_scored_while_training_at_each_checkpoint_interval_by_default(chat_file, tmp_path):
    """train.eval_tasks with a chat task file (README): scored through the run's template at step 0, at each
    checkpoint interval (train.task_eval_every = 0, the default) and at the end; the last score is the one
    `workbench eval` gives the final checkpoint."""
    assert TrainConfig().task_eval_every == 0
    task = write_jsonl(tmp_path / "held.jsonl", conversations(6, seed=99))
    _run(tmp_path, chat_file, "tasks", "train.max_iters=10", "train.ckpt_interval=4", "train.eval_interval=10",
         f"train.eval_tasks=['{task}']")
    recs = [r for r in read_jsonl(tmp_path / "tasks" / "metrics.jsonl") if r["kind"] == "task"]
    assert sorted({r["step"] for r in recs}) == [0, 4, 8, 10]
    assert {(r["task"], r["metric"], r["n"]) for r in recs} == {("held", "exact", 6), ("held", "contains", 6)}
    out = json.loads(wb("eval", "tasks", "--runs-dir", str(tmp_path), "--task", str(task), "--json", "--no-save",
                        check=True).stdout)["checkpoints"][0]
    assert out["step"] == 10
    last = {r["metric"]: r["value"] for r in recs if r["step"] == 10}
    assert last == {"exact": out["tasks"][0]["exact"], "contains": out["tasks"][0]["contains"]}


def test_an_xz_sharegpt_file_with_its_own_role_names_reads_as_the_openai_one(chat_file, tmp_path):
    """README: chat JSONL may be .xz-compressed, and data.chat_roles = "bot=assistant,human2=user" (the string form)
    adds role names: such a file renders and trains the same conversations as the plain OpenAI-style file."""
    recs = [json.loads(line) for line in chat_file.read_text().splitlines()[:60]]
    names = {"system": "system", "user": "human2", "assistant": "bot"}
    with lzma.open(tmp_path / "share.jsonl.xz", "wt", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps({"conversations": [{"from": names[m["role"]], "value": m["content"]}
                                                  for m in r["messages"]]}) + "\n")
    plain = write_jsonl(tmp_path / "plain.jsonl", recs)
    sets = ["--set", *CHAT[1:]]
    roles = 'data.chat_roles="bot=assistant,human2=user"'
    xz = json.loads(wb("data", "prepare", str(tmp_path / "share.jsonl.xz"), "--json", *sets, roles, check=True).stdout)
    ref = json.loads(wb("data", "prepare", str(plain), "--json", *sets, check=True).stdout)
    assert xz["format"] == ref["format"] == "chat" and xz["conversations"] == ref["conversations"] == 60
    for key in ("tokens", "trained_tokens", "truncated", "row_fill"):
        assert xz[key] == ref[key], key
    shown = [json.loads(wb("data", "inspect", str(f), "-n", "3", "--json", *sets, *extra, check=True).stdout)["shown"]
             for f, extra in ((tmp_path / "share.jsonl.xz", [roles]), (plain, []))]
    assert shown[0] == shown[1]
    cp = wb("data", "prepare", str(tmp_path / "share.jsonl.xz"), *sets)   # without the role names: one line
    assert cp.returncode == 2 and "share.jsonl.xz, line 1" in cp.stderr and "data.chat_roles" in cp.stderr


@pytest.mark.parametrize("detach", [False, True])
def test_loss_on_for_a_corpus_read_as_text_is_one_line(tmp_path, detach):
    """data.format = auto took the file as text (its records are not conversations): the loss on the answers
    asked for would fall on every token, so the start is refused, naming what a conversation record looks like."""
    import inspect
    import textwrap
    paragraphs = [p for m in (json.decoder, textwrap, inspect) for p in inspect.getsource(m).split("\n\n") if p]
    path = write_jsonl(tmp_path / "notes.jsonl", [{"text": p} for p in paragraphs])
    cp = wb("train", "cpu-small", "--corpus", str(path), "--runs-dir", str(tmp_path / "runs"),
            *(["--detach"] if detach else []), "--set", *CHAT, "train.max_iters=4", "train.loss_on=assistant")
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    [line] = cp.stderr.strip().splitlines()
    assert line == (f"workbench: error: train.loss_on = assistant applies to chat data, but {path} was read as "
                    "text (data.format = auto: its first record is not a conversation); give records of "
                    "messages, conversations, instruction/output or prompt/completion, or leave train.loss_on "
                    "out to train every token of the text")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_every_conversation_dropped_as_overlong_is_one_line(chat_file, tmp_path):
    """data.overlong = "drop" with a model.seq_len no conversation fits: bad input, refused before a run directory
    exists (exit 2), with the seq_len that would keep some. (Detached, the trainer encodes the conversations: the
    run fails at its start with the same line, which the TUI shows.)"""
    cp = wb("train", "cpu-small", "--corpus", str(chat_file), "--runs-dir", str(tmp_path / "runs"), "--set", *CHAT,
            "model.seq_len=8", "data.overlong=drop", "train.max_iters=4")
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    [line] = cp.stderr.strip().splitlines()
    assert line == ('workbench: error: every train conversation (380) is longer than model.seq_len = 8 and '
                    'data.overlong = "drop" dropped them all; raise model.seq_len (the shortest needs 29) or set '
                    'data.overlong = "truncate"')
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# ----------------------------------------------------------------------------- the CLI around it

@pytest.fixture(scope="module")
def chat_run(chat_file, tmp_path_factory):
    root = tmp_path_factory.mktemp("chatruns")
    _run(root, chat_file, "sft", "train.max_iters=30", "train.eval_interval=30", "train.lr=3e-3")
    return root


def test_chat_message_replies_through_the_template_and_stops(chat_run):
    cp = wb("chat", "sft", "--runs-dir", str(chat_run), "--message", "Sort: 3 1 2", "--json", "--max-new-tokens", "24",
            check=True)
    out = json.loads(cp.stdout)
    assert out["checkpoint"] == "step_0000030" and len(out["ids"]) <= 24
    # the reply is what greedy decoding from the rendered prompt gives, the end-of-turn token left out
    run_dir = chat_run / "sft"
    tok, template = load_tokenizer(run_dir), run_template(run_dir)
    enc = ChatEncoder(template, tok)
    prompt = enc.prompt_ids([{"role": "user", "content": "Sort: 3 1 2"}])
    assert tok.decode(prompt).startswith("user\nSort: 3 1 2")  # control pieces decode to nothing
    model = load_run_model(run_dir, "latest").model
    want = []
    for t in generate(model, prompt, 24, temperature=0):
        if t == enc.end_id:
            break
        want.append(t)
    assert out["ids"] == want and out["reply"] == tok.decode(want)
    assert out["stopped"] == (len(want) < 24)
    plain = wb("chat", "sft", "--runs-dir", str(chat_run), "--message", "Sort: 3 1 2", "--max-new-tokens", "24",
               check=True)
    assert plain.stdout == out["reply"] + "\n"
    assert ("no end-of-turn token" in plain.stderr) == (not out["stopped"])
    assert want, "the model answers before it ends its turn"
    cut = wb("chat", "sft", "--runs-dir", str(chat_run), "--message", "Sort: 3 1 2", "--max-new-tokens", "1",
             check=True)
    assert cut.stdout == tok.decode(want[:1]) + "\n"  # the reply alone on stdout; the cut said on stderr
    assert "note: no end-of-turn token: the reply was cut at --max-new-tokens 1" in cut.stderr


def test_chat_interactive_keeps_the_conversation(chat_run):
    cp = wb("chat", "sft", "--runs-dir", str(chat_run), "--max-new-tokens", "6", "--system", "Colours: Ada=red",
            input="Colour of Ada?\n/reset\nSort: 2 1\n\n", timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count("model> ") == 2 and cp.stdout.count("you> ") == 4
    assert "template" in cp.stderr and "chat_template.jinja" in cp.stderr


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A run trained on text (the built-in corpus): no chat template."""
    root = tmp_path_factory.mktemp("textruns")
    wb("train", "cpu-small", "--runs-dir", str(root), "--name", "txt", "--set", *TINY, "train.max_iters=3",
       check=True)
    return root


def test_chat_with_a_text_run_is_one_line(text_run):
    cp = wb("chat", "txt", "--runs-dir", str(text_run), "--message", "hi")
    assert cp.returncode == 2 and cp.stderr.strip().splitlines() == [
        "workbench: error: run txt was not trained on conversations (it has no chat_template.jinja); use a run "
        "trained with data.format = chat"]


def test_data_inspect_chat_marks_the_trained_tokens(chat_file, chat_run):
    cp = wb("data", "inspect", str(chat_file), "-n", "2", "--set", *CHAT[1:], check=True)
    records = [json.loads(line) for line in chat_file.read_text().splitlines()[:2]]
    assert "[[trained]] = in the loss" in cp.stdout and "\x1b[" not in cp.stdout
    for rec in records:
        user = next(m["content"] for m in rec["messages"] if m["role"] == "user")
        answer = rec["messages"][-1]["content"]
        assert f"<|im_start|>user\n{user}<|im_end|>" in cp.stdout           # the prompt, not marked
        assert f"<|im_start|>assistant\n[[{answer}<|im_end|>]]" in cp.stdout  # the answer and its end, marked
    js = json.loads(wb("data", "inspect", str(chat_file), "-n", "1", "--json", "--set", *CHAT[1:],
                       check=True).stdout)
    shown = js["shown"][0]
    (a, b), = shown["trained_spans"][-1:]
    assert shown["text"][a:b] == records[0]["messages"][-1]["content"] + "<|im_end|>"
    assert js["conversations"] == 400 and 0.1 < js["trained_fraction"] < 0.4 and js["loss_on"] == "assistant"
    allj = json.loads(wb("data", "inspect", str(chat_file), "-n", "1", "--json", "--set", *CHAT[1:],
                         "train.loss_on=all", check=True).stdout)
    assert allj["trained_fraction"] == 1.0 and allj["shown"][0]["trained_spans"][0][0] > 0


def test_data_inspect_of_a_small_chat_file_without_a_tokenizer_shows_it_by_characters(tmp_path):
    """30 conversations are too few to fit the preset's 8,192-piece tokenizer: inspect still shows each one through
    the template with the trained characters marked (the mask comes from the rendering), and says how to see the
    tokens (--init-from, or a vocabulary the file can fit)."""
    path = write_jsonl(tmp_path / "small.jsonl", conversations(30, seed=1))
    cp = wb("data", "inspect", str(path), "-n", "2", env={"WORKBENCH_CACHE_DIR": str(tmp_path / "cache")})
    assert cp.returncode == 0, cp.stderr
    first = conversations(30, seed=1)[0]["messages"]
    user = next(m["content"] for m in first if m["role"] == "user")
    assert f"<|im_start|>user\n{user}<|im_end|>" in cp.stdout
    assert f"<|im_start|>assistant\n[[{first[-1]['content']}<|im_end|>]]" in cp.stdout
    assert "--- conversation 2 " in cp.stdout and "--- conversation 3 " not in cp.stdout
    note = next(ln for ln in cp.stdout.splitlines() if "too small" in ln)
    assert "--init-from RUN" in note and "--set model.vocab_size=625" in note, note
    assert not (tmp_path / "runs").exists()
    # the new-run form's ctrl+d shows the same (data inspect --json)
    from workbench.tui.screens.new_run import preview_text
    out = json.loads(wb("data", "inspect", str(path), "-n", "1", "--json",
                        env={"WORKBENCH_CACHE_DIR": str(tmp_path / "cache")}, check=True).stdout)
    shown = preview_text(out).plain
    assert "shown by characters" in shown and f"{first[-1]['content']}<|im_end|>" in shown


def test_data_commands_init_from_use_that_runs_tokenizer_as_train_does(chat_file, text_run, tmp_path):
    """`data prepare|inspect --init-from RUN` prepare what `train --init-from RUN` will train on: the run's
    tokenizer (the run plan's data.tokenizer), not a new one; with --vocab-size it is one line."""
    env = {"WORKBENCH_CACHE_DIR": str(tmp_path / "cache")}
    common = [str(chat_file), "--runs-dir", str(text_run), "--json", "--set", "model.seq_len=64"]
    via_run = json.loads(wb("data", "prepare", *common, "--init-from", "txt", env=env, check=True).stdout)
    explicit = json.loads(wb("data", "prepare", *common, f"data.tokenizer={text_run / 'txt' / 'tokenizer.model'}",
                             env=env, check=True).stdout)
    fresh = json.loads(wb("data", "prepare", *common, "model.vocab_size=400", env=env, check=True).stdout)
    assert via_run["cached"] is False and explicit["cached"] is True   # the same tokens: the second from the cache
    assert via_run["cache_dir"] == explicit["cache_dir"] != fresh["cache_dir"]
    assert via_run["tokens"] == explicit["tokens"] != fresh["tokens"]
    shown = json.loads(wb("data", "inspect", *common, "--init-from", "txt", "-n", "1", env=env, check=True).stdout)
    assert shown["cache_dir"] == via_run["cache_dir"] and shown["cached"] is True
    cp = wb("data", "prepare", str(chat_file), "--runs-dir", str(text_run), "--init-from", "txt", "--vocab-size",
            "300", env=env)
    assert cp.returncode == 2 and cp.stderr.strip().splitlines() == [
        "workbench: error: --vocab-size and --init-from: the vocabulary is that run's; leave --vocab-size out"]
    cp = wb("data", "inspect", str(chat_file), "--runs-dir", str(text_run), "--init-from", "nope", env=env)
    assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1 and "nope" in cp.stderr


def test_data_inspect_json_of_text_documents(tmp_path):
    f = tmp_path / "notes.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in
                         ("first note", "second note, which is longer than twenty characters", "third")))
    js = json.loads(wb("data", "inspect", str(f), "--json", "-n", "2", "--chars", "20", check=True).stdout)
    assert js["format"] == "text" and js["files"] == 1 and js["bytes"] == f.stat().st_size
    assert js["shown"] == [{"index": 0, "text": "first note", "cut": False},
                           {"index": 1, "text": "second note, which i", "cut": True}]


def test_hf_export_chats_as_workbench_does(chat_run, tmp_path):
    """transformers, given the exported directory alone: the same prompt ids from its chat template, and greedy
    generate stops at the end-of-turn token with the reply `workbench chat --message` gives."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "hf"
    wb("export", "sft", str(out), "--runs-dir", str(chat_run), "--format", "hf", check=True)
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["eos_token"] == CHATML_END
    assert tc["chat_template"] == (chat_run / "sft" / "chat_template.jinja").read_text()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    end_id = hf_tok.convert_tokens_to_ids(CHATML_END)
    assert model.generation_config.eos_token_id == end_id
    enc = ChatEncoder(run_template(chat_run / "sft"), load_tokenizer(chat_run / "sft"))
    wb_model = load_run_model(chat_run / "sft", "latest").model
    for k, conv in enumerate(conversations(5, seed=77)):
        prompt = conv["messages"][:-1]
        ids = hf_tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert list(ids) == enc.prompt_ids(prompt)
        # workbench chat --message's reply (the same function; the CLI's equality to it is tested above)
        ours = reply(wb_model, enc.tok, enc.template, prompt, max_tokens=16)
        with torch.no_grad():
            got = model.generate(torch.tensor([list(ids)]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
        if got and got[-1] == end_id:
            got = got[:-1]
            assert ours.stopped
        assert got == ours.ids, k



def test_eval_scores_chat_tasks_through_the_run_template(chat_run, text_run, tmp_path):
    """A chat task file (conversations ending with the answer): `workbench eval` replies through the run's template;
    each output is the reply `workbench chat` gives; a text run is refused in one line."""
    task = write_jsonl(tmp_path / "held.jsonl", conversations(6, seed=99))
    cp = wb("eval", "sft", "--runs-dir", str(chat_run), "--task", str(task), "--json", "--no-save",
            "--dump", str(tmp_path / "dump.jsonl"), check=True)
    out = json.loads(cp.stdout)
    dump = [json.loads(line) for line in (tmp_path / "dump.jsonl").read_text().splitlines()]
    assert len(dump) == 6
    run_dir = chat_run / "sft"
    tok, template = load_tokenizer(run_dir), run_template(run_dir)
    model = load_run_model(run_dir, "latest").model
    exact = 0
    for rec, conv in zip(dump, conversations(6, seed=99)):
        want = reply(model, tok, template, conv["messages"][:-1], max_tokens=32).text
        assert rec["output"] == want and rec["answers"] == [conv["messages"][-1]["content"]]
        exact += " ".join(want.split()) == conv["messages"][-1]["content"]
    scored = out["checkpoints"][0]["tasks"][0]
    assert scored["shape"] == "chat" and scored["kind"] == "gen" and scored["n"] == 6
    assert scored["exact"] == pytest.approx(exact / 6)
    cp = wb("eval", "txt", "--runs-dir", str(text_run), "--task", str(task))
    assert cp.returncode == 2 and cp.stderr.startswith("workbench: error: held is a chat task, but run txt was not "
                                                       "trained on conversations")


def test_data_prepare_reports_what_the_chat_data_will_train(chat_file, chat_data):
    out = json.loads(wb("data", "prepare", str(chat_file), "--json", "--set", *CHAT[1:], "model.seq_len=48",
                        check=True).stdout)
    rows = pack(chat_data.lengths("train"), 48)
    assert out["format"] == "chat" and out["conversations"] == 400 and out["train_conversations"] == 380
    assert out["trained_tokens"] == int((np.asarray(chat_data.labels) > 0).sum())
    assert out["truncated"] == rows.truncated > 0 and out["row_fill"] == pytest.approx(rows.efficiency, abs=1e-4)
    text = wb("data", "prepare", str(chat_file), "--set", *CHAT[1:], "model.seq_len=48", "data.overlong=drop",
              check=True).stdout
    assert f"{rows.truncated:,} longer than seq_len 48 (dropped)" in text and "packed: " in text


def test_gguf_export_chats_the_same_in_llama_cpp(chat_run, tmp_path):
    """llama.cpp (llama-cpp-python), given the GGUF alone, applies its chat template, encodes the prompt to our ids
    and replies greedily with our reply, stopping at the end-of-turn token."""
    llama_cpp = pytest.importorskip("llama_cpp")
    wb("export", "sft", str(tmp_path / "g"), "--runs-dir", str(chat_run), "--format", "gguf", "--gguf-type", "f32",
       check=True)
    llm = llama_cpp.Llama(model_path=str(tmp_path / "g" / "model.gguf"), n_ctx=SEQ, verbose=False)
    run_dir = chat_run / "sft"
    tok, template = load_tokenizer(run_dir), run_template(run_dir)
    enc = ChatEncoder(template, tok)
    assert llm.metadata["tokenizer.chat_template"] == template.text
    assert int(llm.metadata["tokenizer.ggml.eos_token_id"]) == enc.end_id
    model = load_run_model(run_dir, "latest").model
    stopped = 0
    for conv in conversations(5, seed=77):
        prompt = conv["messages"][:-1]
        text = template.render(prompt, add_generation_prompt=True)
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == enc.prompt_ids(prompt)
        ours = reply(model, tok, template, prompt, max_tokens=16)
        got = llm.create_chat_completion(messages=prompt, temperature=0, max_tokens=16)["choices"][0]
        assert got["message"]["content"] == ours.text
        assert (got["finish_reason"] == "stop") == ours.stopped
        stopped += ours.stopped
    print(f"{stopped} of 5 replies ended with the end-of-turn token")


_PREPARE = """
import sys
from workbench.config import DataConfig
from workbench.data.preset_data import prepare_data
from workbench.faults import Faults
d = prepare_data(DataConfig(corpus=sys.argv[1]), 400, 64, log=lambda m: print(m, flush=True), workers=int(sys.argv[2]),
                 shard_chars=64 << 10, faults=Faults.from_env())
print("TOKENS", d.tokenizer_path.parent / "tokens.bin", flush=True)
"""


def _prepare_in_subprocess(corpus, cache, workers: int, env: dict | None = None, wait: bool = True):
    e = dict(os.environ, WORKBENCH_CACHE_DIR=str(cache), **(env or {}))
    proc = subprocess.Popen([sys.executable, "-c", _PREPARE, str(corpus), str(workers)], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out


@pytest.mark.slow
def test_chat_preparation_is_parallel_and_a_killed_one_resumes_bit_for_bit(tmp_path):
    """Shards of ~64 K characters: 2 workers give the bytes 1 worker gives; kill -9 after 3 shards, start again:
    it continues after the finished shards and ends with the same tokens and labels."""
    corpus = write_jsonl(tmp_path / "c.jsonl", conversations(3000, seed=5))
    serial_dir = tokens_path(_prepare_in_subprocess(corpus, tmp_path / "c1", workers=1)).parent
    serial = [(serial_dir / f).read_bytes() for f in ("tokens.bin", "labels.bin", "lengths.bin")]
    par_dir = tokens_path(_prepare_in_subprocess(corpus, tmp_path / "c2", workers=2)).parent
    assert [(par_dir / f).read_bytes() for f in ("tokens.bin", "labels.bin", "lengths.bin")] == serial
    assert json.loads((par_dir / "index.json").read_text())["conversations"] == 3000
    marker = tmp_path / "paused"
    proc = _prepare_in_subprocess(corpus, tmp_path / "c3", workers=2, wait=False, env={
        "WORKBENCH_TEST_PAUSE_AFTER_SHARD": "3", "WORKBENCH_TEST_PAUSE_MARKER": str(marker),
        "WORKBENCH_TEST_PAUSE_SECONDS": "60"})
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)
    finished = sorted((tmp_path / "c3" / "data").glob("chat-*.shards/*.json"))
    assert len(finished) >= 3 and not list((tmp_path / "c3").rglob("tokens.bin"))
    out = _prepare_in_subprocess(corpus, tmp_path / "c3", workers=2)
    assert f"continuing after {len(finished)} finished shard(s)" in out
    again = tokens_path(out).parent
    assert [(again / f).read_bytes() for f in ("tokens.bin", "labels.bin", "lengths.bin")] == serial
    assert not list((tmp_path / "c3" / "data").glob("chat-*.shards"))
