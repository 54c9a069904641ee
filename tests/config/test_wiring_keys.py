"""Preset keys that change what a run computes reach the run (issue 54, round 4): each is set to a value other than
its default on a real tiny run, and its effect is read back from what the run recorded (the checkpoint's optimizer
state and weights, the first eval's loss, the start record), so a key dropped on its way from the preset to the
trainer fails here. The keys no test set before are listed by bench/wiring_audit.py.

The first eval (step 0) scores the starting weights: the same seed gives the same weights and the same eval batches,
so two runs whose step-0 losses differ computed different forward passes. Keys that only change the optimizer are
read from its saved state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.chat import conversations, pair_records, write_jsonl
from tests.support.cli import tiny, wb
from tests.support.runs import read_jsonl

# One step, an eval before it (step 0) and after it, one checkpoint.
ONE_STEP = ["train.max_iters=1", "train.warmup_iters=0", "train.eval_interval=1", "train.ckpt_interval=1",
            "train.eval_iters=1"]


class Runs:
    """Tiny runs made when a test first asks for them, by name, in one runs directory for the module."""

    def __init__(self, root: Path):
        self.root = root
        self.made: dict[str, tuple[Path, tuple]] = {}

    def __call__(self, name: str, *sets: str, args: tuple[str, ...] = ()) -> Path:
        if name in self.made:   # a name stands for one set of settings
            assert self.made[name][1] == (sets, args), (name, self.made[name][1], (sets, args))
        else:
            wb("train", "cpu-small", "--name", name, "--runs-dir", str(self.root), *args, *tiny(*ONE_STEP, *sets),
               check=True)
            self.made[name] = (self.root / name, (sets, args))
        return self.made[name][0]

    def base(self) -> Path:
        """Every key at TINY's values (AdamW, seed 1337, no RoPE scaling)."""
        return self("base")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("wiring-keys"))


def first_eval(run: Path) -> float:
    return next(r["val_loss"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "eval" and r["step"] == 0)


def start_record(run: Path) -> dict:
    return next(r for r in read_jsonl(run / "metrics.jsonl") if r.get("event") == "start")


def checkpoint(run: Path) -> Path:
    return max((run / "checkpoints").iterdir())


def optimizer(run: Path) -> dict:
    return torch.load(checkpoint(run) / "state.pt", weights_only=False)["optimizer"]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint(run) / "model.pt", weights_only=True)


# ----------------------------------------------------------------------------- the optimizers

def test_adamw_beta1_beta2_weight_decay_and_grad_clip_reach_adamw(runs):
    run = runs("adamw", "train.beta1=0.5", "train.beta2=0.9", "train.weight_decay=0.3", "train.grad_clip=0.05")
    opt = optimizer(run)   # AdamW alone: its own state dict (with Muon: one per part)
    decay, no_decay = opt["param_groups"]
    assert decay["betas"] == (0.5, 0.9) and no_decay["betas"] == (0.5, 0.9)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.3, 0.0)
    # and the step used them: after one step, m = (1 - beta1) g and v = (1 - beta2) g^2, so m^2 / v is
    # (1 - beta1)^2 / (1 - beta2) wherever the gradient was not zero: 2.5 here, 0.2 at the defaults (0.9, 0.95)
    ratios = []
    for st in opt["state"].values():
        m, v = st["exp_avg"].double(), st["exp_avg_sq"].double()
        nz = v > 1e-30
        ratios.append((m[nz] ** 2 / v[nz]))
    r = torch.cat([x.flatten() for x in ratios])
    assert r.numel() > 1000 and torch.allclose(r, torch.full_like(r, 2.5), rtol=1e-3), (r.min(), r.max())
    # grad_clip: the step's gradient (norm ~1.5, recorded before clipping) was scaled to norm 0.05, so m's norm
    # over every parameter is (1 - beta1) x 0.05 (AdamW's update hardly shows a clip: it divides the scale out)
    (step1,) = [r["grad_norm"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    m_norm = torch.cat([st["exp_avg"].double().flatten() for st in opt["state"].values()]).norm().item()
    assert step1 > 0.5 and m_norm == pytest.approx(0.5 * 0.05, rel=1e-3), (step1, m_norm)


def test_muon_lr_momentum_and_weight_decay_reach_muon(runs):
    run = runs("muon", "train.optimizer=muon", "train.muon_lr=0.01", "train.muon_momentum=0.8",
               "train.muon_weight_decay=0.05", "train.max_iters=2", "train.ckpt_interval=2")
    (g,) = optimizer(run)["muon"]["param_groups"]
    assert (g["base_lr"], g["momentum"], g["weight_decay"]) == (0.01, 0.8, 0.05)
    # the schedule scales both optimizers alike: Muon's lr is muon_lr in the proportion AdamW's is train.lr
    assert g["lr"] == pytest.approx(0.01 * optimizer(run)["adamw"]["param_groups"][0]["lr"]
                                    / optimizer(run)["adamw"]["param_groups"][0]["base_lr"])


def test_muon_ns_changes_the_update(runs):
    """The same Muon run with Keller Jordan's coefficients instead of cpu-small's polar-express: the same first
    eval (the same weights), another loss once Muon has stepped."""
    sets = ("train.optimizer=muon", "train.muon_lr=0.01", "train.muon_momentum=0.8", "train.muon_weight_decay=0.05",
            "train.max_iters=2", "train.ckpt_interval=2")
    polar, jordan = runs("muon", *sets), runs("muon-jordan", *sets, "train.muon_ns=jordan")
    assert first_eval(jordan) == first_eval(polar)
    after = [{r["step"]: r["val_loss"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "eval"}[1]
             for d in (polar, jordan)]
    assert after[0] != pytest.approx(after[1], abs=1e-6), after


# ----------------------------------------------------------------------------- the model's shape

def test_head_size_attn_bias_and_qk_norm_shape_the_attention(runs):
    run = runs("heads", "model.head_size=32", "model.attn_bias=true", "model.qk_norm=false")
    w = weights(run)
    # attn_bias: q, k and v have biases (o has none); qk_norm off (cpu-small's is on): no q_norm / k_norm
    assert tuple(w["layers.0.attn.wq.bias"].shape) == (128,) and tuple(w["layers.1.attn.wv.bias"].shape) == (64,)
    assert "layers.0.attn.wo.bias" not in w
    assert not [k for k in w if "q_norm" in k or "k_norm" in k]
    assert [k for k in weights(runs.base()) if "q_norm" in k] and not [k for k in weights(runs.base()) if "bias" in k]
    # 4 query heads and 2 KV heads of 32 (not dim / n_heads = 16): wq [128, 64], wk [64, 64], wo [64, 128]
    assert tuple(w["layers.0.attn.wq.weight"].shape) == (128, 64)
    assert tuple(w["layers.0.attn.wk.weight"].shape) == (64, 64)
    assert tuple(w["layers.0.attn.wo.weight"].shape) == (64, 128)
    assert start_record(run)["params"] > start_record(runs.base())["params"]


# ----------------------------------------------------------------------------- the forward pass

@pytest.mark.parametrize("sets", [
    ("model.rope_theta=100",),
    ("model.norm_eps=0.5",),
    ("model.zero_init_out=true",),
    ("train.seed=7",),
    # linear scaling with factor 1 is no scaling: the first eval moves only if both keys arrive
    ("model.rope_scaling=linear", "model.rope_factor=4"),
], ids=["rope_theta", "norm_eps", "zero_init_out", "seed", "rope_scaling_linear+rope_factor"])
def test_a_key_of_the_forward_pass_changes_the_first_eval(runs, sets):
    run = runs("fwd-" + "-".join(s.split("=")[0].split(".")[1] for s in sets), *sets)
    assert first_eval(run) != pytest.approx(first_eval(runs.base()), abs=1e-6)


def test_zero_init_out_starts_the_output_projections_at_zero(runs):
    """The first eval of a model whose blocks start as the identity is the embedding -> head map's alone: its
    loss is the same for any other draw of the blocks' inner weights; one step later wo and w2 have moved off
    zero by about one learning rate."""
    run = runs("fwd-zero_init_out", "model.zero_init_out=true")
    w = weights(run)
    assert w["layers.0.attn.wo.weight"].abs().max() < 6e-3   # one AdamW step moves a weight by about lr (3e-3)
    assert weights(runs.base())["layers.0.attn.wo.weight"].abs().max() > 0.01


# llama3 scaling with seq 32 and heads of 16: the wavelengths are 6.3, 19.9, 62.8, 199 ... With an original
# context of 64, low 1 and high 4 keep 6.3, smooth 19.9 and 62.8 and divide the rest by 8; each variant below
# moves one frequency band across a boundary, so the first eval moves from the llama3 run's.
LLAMA3 = ("model.rope_scaling=llama3", "model.rope_factor=8", "model.rope_original_context=64")


@pytest.mark.parametrize("key", ["model.rope_low_freq_factor=2", "model.rope_high_freq_factor=2",
                                 "model.rope_original_context=128"])
def test_a_llama3_rope_key_changes_the_first_eval(runs, key):
    llama3 = runs("llama3", *LLAMA3)
    assert first_eval(llama3) != pytest.approx(first_eval(runs.base()), abs=1e-6)
    run = runs("llama3-" + key.split(".")[1].split("=")[0], *LLAMA3, key)
    assert first_eval(run) != pytest.approx(first_eval(llama3), abs=1e-6)


# ----------------------------------------------------------------------------- the data and the machine

def test_text_field_reads_the_documents_from_that_field(runs, tmp_path_factory):
    """A JSONL corpus whose text is under "body": read with data.text_field = body (without it the run stops at
    the first record, which has no "text")."""
    d = tmp_path_factory.mktemp("text-field")
    corpus = d / "docs.jsonl"
    line = "The quick brown fox jumps over the lazy dog while the river keeps running to the sea. "
    corpus.write_text("".join(json.dumps({"body": f"{i} " + line * 6, "n": i}) + "\n" for i in range(300)))
    run = runs("text-field", "data.text_field=body", "model.vocab_size=300", args=("--corpus", str(corpus)))
    start = start_record(run)
    # every document's ~560 characters were read: the whole corpus is ~170 000 characters, ~40 000+ tokens
    assert start["train_tokens"] + start["val_tokens"] > 20_000, start


def test_num_threads_sets_the_trainers_threads(runs):
    """hardware.num_threads: torch's threads in the trainer (its calibration ran with them; the suite's own
    processes run with one)."""
    run = runs("threads", "hardware.num_threads=2")
    assert start_record(run)["calibration"]["threads"] == 2


def test_messages_field_reads_the_conversations_from_that_field(tmp_path):
    """data.messages_field on the smallest call that reads a chat corpus (`data inspect --chat`, the reader a
    run uses): conversations under "dialog" are rendered with it and refused without it."""
    corpus = write_jsonl(tmp_path / "dialog.jsonl", [{"dialog": c["messages"]} for c in conversations(20, seed=1)])
    args = ["data", "inspect", str(corpus), "--chat", "--json", "-n", "2"]
    refused = wb(*args, cwd=tmp_path)
    assert refused.returncode != 0 and "dialog" in refused.stderr
    cp = wb(*args, "--set", "data.messages_field=dialog", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    shown = json.loads(cp.stdout)["shown"]
    first = conversations(20, seed=1)[0]["messages"]
    assert len(shown) == 2 and all(m["content"] in shown[0]["text"] for m in first)
    assert shown[0]["trained_spans"]   # the assistant's answer is what trains


def test_pref_sft_weight_adds_the_chosen_answers_nll_to_the_loss(runs, tmp_path_factory):
    """train.pref_sft_weight on a SimPO run (reference-free, so from scratch), one pair a step: each step's
    recorded loss is SimPO's (beta 2, gamma 1: the defaults) plus the weight times the chosen answer's token-mean
    NLL, which for one pair is minus its length-averaged log-prob (the record's chosen_logps)."""
    pairs = write_jsonl(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", pair_records(120))
    run = runs("sft-weight", "train.objective=simpo", "train.pref_sft_weight=0.5", "train.batch_size=1",
               "model.seq_len=64", "model.vocab_size=400", "train.max_iters=2", "train.ckpt_interval=2",
               args=("--corpus", str(pairs)))
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "pref" and r["split"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        c, j = r["chosen_logps"], r["rejected_logps"]
        simpo = -torch.nn.functional.logsigmoid(torch.tensor(2.0 * (c - j) - 1.0, dtype=torch.float64)).item()
        assert r["loss"] == pytest.approx(simpo + 0.5 * -c, rel=1e-5, abs=1e-6), (r, simpo)
        assert abs(0.5 * c) > 1   # the term is large: without it the loss would be ~1.3, not ~4
