"""Evals score fixed batches drawn once a run and kept on the device: the records are those the batches drawn
anew at every eval gave (the evaluation before them), to the bit, on real tiny runs of text and of chat; with
train.eval_iters = 0 (auto) the trainer scores as many batches as plan.schedule.evals decides for its val split."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from tests.support.chat import conversations, write_jsonl
from tests.support.cli import tiny, wb
from tests.support.runs import read_jsonl
from workbench.data.preset_data import prepare_data
from workbench.data.train_data import IGNORE
from workbench.plan.schedule.evals import eval_batches
from workbench.rundir.records import EventRecord, StartRecord
from workbench.train import runtime
from workbench.train.checkpoint import load_run_model
from workbench.train.dist import Dist
from workbench.train.evaluation import EvalBatches, evaluate
from workbench.train.model import FusedLinearCrossEntropy, fused_cross_entropy

CPU = torch.device("cpu")


def _start(run: Path) -> dict:
    return next(r for r in read_jsonl(run / "metrics.jsonl") if r.get("event") == "start")


def _evals(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "eval"}


def _setup(run: Path, step: int):
    """The run's preset, data and token bytes, and its model at ``step`` with the trainer's loss (fused on CPU)."""
    lm = load_run_model(run, step)
    p = lm.preset
    lm.model.loss_chunk_tokens = _start(run)["loss_chunk_tokens"]
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=lambda m: None, loss_on=p.train.loss_on)
    return p, data, torch.from_numpy(data.tokenizer.byte_lengths()), lm.model


def _draw(sampler):
    return runtime.batch_to_device(sampler.next_batch(), CPU)


@torch.no_grad()
def drawn_anew(model, p, data, token_bytes, n: int) -> tuple[float, float, float, float]:
    """(train loss, val loss, train bpb, val bpb) as the evaluation before kept batches computed them: each batch
    drawn anew from a sampler seeded train.seed + 1, the sums in float32 batch by batch, and the fused loss
    handed the output weight as it is (it also computed that weight's gradient, which the eval now skips)."""
    model.eval()
    loss, bpb = [], []
    for part in ("train", "val"):
        s = data.sampler(part, p, seed=p.train.seed + 1)
        nats, count, nbytes = (torch.zeros(()) for _ in range(3))
        for _ in range(n):
            b = _draw(s)
            x, y, pos, seg = b.inputs, b.targets, b.positions, b.segments
            trained = y != IGNORE
            if model.loss_chunk_tokens:
                h = model.hidden(x, None, pos, seg)
                rows = h.shape[0] * h.shape[1]
                nats += FusedLinearCrossEntropy.apply(h.reshape(rows, -1), model.output_weight(), y.reshape(-1),
                                                      model.loss_chunk_tokens, 1.0).float()
            else:
                nats += model(x, y, positions=pos, segments=seg, loss_tokens=1.0)[1].float()
            count += trained.sum()
            nbytes += token_bytes[y.clamp_min(0)][trained].sum()
        vec = torch.stack([nats, count.float(), nbytes.float()])
        loss.append(vec[0].item() / max(1.0, vec[1].item()))
        bpb.append(vec[0].item() / math.log(2) / max(1.0, vec[2].item()))
    model.train()
    return loss[0], loss[1], bpb[0], bpb[1]


def _numbers(ev) -> tuple[float, float, float, float]:
    return ev["train_loss"], ev["val_loss"], ev["train_bpb"], ev["val_bpb"]


def test_kept_eval_batches_give_the_records_of_batches_drawn_anew(trained_run):
    """The tiny text run's evals at steps 20, 40 and 60 (each with a checkpoint of the same weights): the trainer's
    records are, to the bit, what drawing the batches anew gives; and one EvalBatches scored twice gives them
    again (nothing in it is used up)."""
    recs = _evals(trained_run)
    n = _start(trained_run)["eval_iters"]
    assert n == 2  # tests.support.cli.TINY's explicit train.eval_iters
    for step in (20, 40, 60):
        p, data, token_bytes, model = _setup(trained_run, step)
        assert drawn_anew(model, p, data, token_bytes, n) == _numbers(recs[step]), step
        kept = EvalBatches.draw(p, data, n, token_bytes, CPU, _draw)
        for _ in range(2):
            ev = evaluate(model, kept, Dist(), contextlib.nullcontext(), step)
            assert (ev.train_loss, ev.val_loss, ev.train_bpb, ev.val_bpb) == _numbers(recs[step]), step


def test_auto_eval_batches_on_a_small_val_split_of_chat(tmp_path):
    """A chat run (packed rows: positions and segments too) with train.eval_iters = 0 and a val split smaller than auto
    would like: the trainer scores the batches plan.schedule.evals picks for that split, fewer than for a split that
    does not limit it, says so in train.log, and its records are those of the batches drawn anew, to the bit."""
    path = write_jsonl(tmp_path / "chat.jsonl", conversations(300, seed=3))
    runs = tmp_path / "runs"
    wb("train", "cpu-small", "--corpus", str(path), "--name", "c", "--runs-dir", str(runs),
       *tiny("model.seq_len=64", "model.vocab_size=400", "train.eval_iters=0", "data.val_fraction=0.05",
             "train.max_iters=6", "train.eval_interval=3", "train.ckpt_interval=3"), check=True)
    run = runs / "c"
    p, data, token_bytes, model = _setup(run, 6)
    assert data.format == "chat" and p.train.eval_iters == 0
    val_tokens = data.split_tokens()[1]
    n, why = eval_batches(p, val_tokens)
    assert _start(run)["eval_iters"] == n and _start(run)["val_tokens"] == val_tokens
    # the start event is a typed record: read back, it says the same again (the chat facts beside the rest)
    start = StartRecord.of(EventRecord.from_dict(_start(run)))
    assert start.data["chat"]["conversations"] == data.n_train and start.val_tokens == val_tokens
    assert start.event(False, 0, _start(run)["time"]).to_dict() == _start(run)
    assert n < eval_batches(p)[0]                                   # the split limits it ...
    assert n <= math.ceil(val_tokens // p.model.seq_len / p.train.batch_size)  # ... to at most its windows
    assert f"eval: {why}" in (run / "train.log").read_text()
    assert drawn_anew(model, p, data, token_bytes, n) == _numbers(_evals(run)[6])


def test_auto_eval_batches_of_a_text_run_and_an_explicit_count(tmp_path):
    """The same preset on the built-in corpus: auto picks from the split (a larger val_fraction, more batches, up
    to what a split that does not limit it gets); an explicit train.eval_iters is scored as it is."""
    runs = tmp_path / "runs"
    counts = {}
    for name, extra in (("small", ["train.eval_iters=0", "data.val_fraction=0.01"]),
                        ("large", ["train.eval_iters=0", "data.val_fraction=0.1"]),
                        ("fixed", ["train.eval_iters=3", "data.val_fraction=0.01"])):
        wb("train", "cpu-small", "--name", name, "--runs-dir", str(runs),
           *tiny("train.max_iters=3", "train.eval_interval=3", *extra), check=True)
        start = _start(runs / name)
        p = load_run_model(runs / name, 3).preset
        assert start["eval_iters"] == eval_batches(p, start["val_tokens"])[0], name
        counts[name] = start["eval_iters"]
    p = dataclasses.replace(p, train=dataclasses.replace(p.train, eval_iters=0))
    assert counts["small"] < counts["large"] <= eval_batches(p)[0]
    assert counts["fixed"] == 3
    fixed, data, token_bytes, model = _setup(runs / "fixed", 3)
    assert drawn_anew(model, fixed, data, token_bytes, 3) == _numbers(_evals(runs / "fixed")[3])


@pytest.mark.parametrize("grad", [False, True])
def test_an_eval_skips_the_output_weights_gradient_in_the_fused_loss(monkeypatch, grad):
    """Under no_grad (an eval) the fused loss is not asked for the output weight's gradient (inside the Function
    grad mode is always off, and the weight requires grad: it computed it for nothing); in training it is. The
    loss is the same to the bit either way."""
    asked = []
    forward = FusedLinearCrossEntropy.forward

    def spy(ctx, *args):
        asked.append(ctx.needs_input_grad[:2])
        return forward(ctx, *args)
    monkeypatch.setattr(FusedLinearCrossEntropy, "forward", staticmethod(spy))
    torch.manual_seed(0)
    x, w = torch.randn(96, 16), torch.randn(50, 16, requires_grad=True)
    t = torch.randint(0, 50, (96,))
    with torch.set_grad_enabled(grad):
        got = fused_cross_entropy(x, w, t, 32, 1.0)
    assert asked == [(False, grad)] and got.requires_grad == grad
    assert torch.equal(got.detach(), FusedLinearCrossEntropy.apply(x, w.detach(), t, 32, 1.0))
