"""Every preference knob a user sets reaches the loss the trainer computes (issue 54's breaks 2-5 and 8), on real
tiny runs from a chat-tuned run, one pair (or one labelled answer) a step, so each step's record is one item's:
its recorded loss must be what the loss function gives, called directly with the user's values and the drifts the
run recorded. A default value in the trainer's call (the objective's own beta, no smoothing, SimPO's default gamma,
KTO's weights swapped) gives another number. Beside them: the step-0 check's tolerance refuses a reference whose
rewards are off by 9e-3 (the all-bf16 reference found on an H200), and two starting checkpoints trained on one
prepared pair set each get a precomputed reference of their own.

(The loss formulas themselves are checked against TRL and the papers: tests/train/test_preference.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.chat import conversations, pair_records, write_jsonl
from tests.support.cli import TINY, tiny, wb
from tests.support.runs import read_jsonl
from workbench import rundir
from workbench.config import resolve_preset
from workbench.data.preference.preference_data import PairBatch
from workbench.data.train_data import IGNORE
from workbench.faults import Faults
from workbench.plan.recipe.objective_plan import PRECOMPUTED, objective_plan
from workbench.train.model import GPT
from workbench.train.objective import ObjectiveCheckError, build_objective
from workbench.train.preference_losses import AnswerLogps, dpo_loss, kto_loss, simpo_loss

STEPS = ["model.seq_len=64", "train.eval_interval=4", "train.ckpt_interval=4", "train.eval_iters=1",
         "train.batch_size=1", "train.lr=1e-2", "train.warmup_iters=0"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A runs directory with a chat-tuned run (sft, checkpoints at steps 12 and 24), 120 pairs of its task and 120
    labelled answers."""
    root = tmp_path_factory.mktemp("pref-wiring")
    chats = write_jsonl(root.parent / "chats.jsonl", conversations(200, seed=2))
    pairs = write_jsonl(root.parent / "pairs.jsonl", pair_records(120))
    kto = write_jsonl(root.parent / "kto.jsonl", [
        {"prompt": r["prompt"], "completion": r["chosen"] if i % 2 else r["rejected"], "label": bool(i % 2)}
        for i, r in enumerate(pair_records(120))])
    wb("train", "cpu-small", "--name", "sft", "--corpus", str(chats), "--runs-dir", str(root),
       *tiny("model.seq_len=64", "train.eval_iters=1", "train.max_iters=24", "train.eval_interval=24",
             "train.ckpt_interval=12", "train.lr=3e-3"), check=True)
    return {"root": root, "pairs": pairs, "kto": kto}


def train(base, name, corpus, *sets, source="sft"):
    cp = wb("train", "cpu-small", "--init-from", source, "--name", name, "--corpus", str(base[corpus]),
            "--runs-dir", str(base["root"]), *tiny(*STEPS, *sets))
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    return base["root"] / name


def prefs(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / rundir.METRICS_FILE) if r.get("kind") == "pref" and r["split"] == "train"]


def one(value: float) -> AnswerLogps:
    """One answer whose summed (and, over one token, averaged) log-prob is ``value``."""
    t = torch.tensor([value], dtype=torch.float64)
    return AnswerLogps(t[:, None], torch.ones(1, 1, dtype=torch.float64), t, torch.ones(1, dtype=torch.float64))


ZERO = torch.zeros(1, dtype=torch.float64)


def test_dpo_beta_and_label_smoothing_reach_the_loss(base):
    d = train(base, "dpo", "pairs", "train.objective=dpo", "train.max_iters=3", "train.pref_beta=0.3",
              "train.pref_label_smoothing=0.2")
    moved = [r for r in prefs(d) if r["step"] > 1]   # step 1's pair was scored before any update: all zero
    assert [r["step"] for r in moved] == [2, 3]
    for r in moved:
        c, j = r["chosen_drift"], r["rejected_drift"]
        assert abs(c) > 1e-3 and abs(j) > 1e-3, r
        # rewards are beta times the drift from the reference
        assert r["chosen_reward"] == pytest.approx(0.3 * c, rel=1e-5) and \
            r["rejected_reward"] == pytest.approx(0.3 * j, rel=1e-5)
        want = dpo_loss(one(c), one(j), ZERO, ZERO, beta=0.3, label_smoothing=0.2).loss.item()
        assert r["loss"] == pytest.approx(want, rel=1e-5, abs=1e-6), (r, want)
    start = next(r for r in read_jsonl(d / rundir.METRICS_FILE) if r.get("event") == "start")
    assert start["objective"]["beta"] == 0.3   # and the start line says so


def test_simpo_gamma_beta_and_label_smoothing_reach_the_loss(base):
    d = train(base, "simpo", "pairs", "train.objective=simpo", "train.max_iters=2", "train.pref_beta=1.5",
              "train.simpo_gamma=0.4", "train.pref_label_smoothing=0.1")
    rows = prefs(d)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        c, j = r["chosen_logps"], r["rejected_logps"]   # length-averaged (one pair: its own)
        assert r["chosen_reward"] == pytest.approx(1.5 * c, rel=1e-5)
        want = simpo_loss(one(c), one(j), beta=1.5, gamma=0.4, label_smoothing=0.1).loss.item()
        assert r["loss"] == pytest.approx(want, rel=1e-5, abs=1e-6), (r, want)


def test_kto_weights_reach_the_loss(base):
    d = train(base, "kto", "kto", "train.objective=kto", "train.max_iters=4", "train.pref_beta=0.2",
              "train.kto_desirable_weight=2.0", "train.kto_undesirable_weight=0.5")
    rows = prefs(d)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    labels = set()
    for r in rows:
        good = r["chosen_reward"] is not None   # the step's one answer: desirable (chosen) or not (rejected)
        labels.add(good)
        drift = r["chosen_drift"] if good else r["rejected_drift"]
        want = kto_loss(one(drift), ZERO, torch.tensor([good]), torch.tensor(r["kl"], dtype=torch.float64),
                        beta=0.2, desirable_weight=2.0, undesirable_weight=0.5).loss.item()
        assert r["loss"] == pytest.approx(want, rel=1e-5, abs=1e-6), (r, want)
    assert rows[0]["loss"] == pytest.approx(0.5 * (2.0 if rows[0]["chosen_reward"] is not None else 0.5))
    assert labels == {True, False}   # both weights were used


def test_two_starting_checkpoints_on_one_pair_set_each_get_their_own_reference(base):
    """The precomputed table is keyed by the starting weights: a run from step 12 and one from step 24 of the same
    run, on the same prepared pairs, each compute theirs (and each starts at ln 2 with zero rewards)."""
    tables = []
    for step in (12, 24):
        d = train(base, f"pre{step}", "pairs", "train.objective=dpo", "train.pref_reference=precompute",
                  "train.max_iters=1", source=f"sft:{step}")
        start = next(r for r in read_jsonl(d / rundir.METRICS_FILE) if r.get("event") == "start")
        why = start["objective"]["reference_why"]
        assert f"run sft step {step}" in why, why
        tables.append(Path(why.split("cached in ")[1].split("; ")[0]))
        first = prefs(d)[0]
        assert first["chosen_reward"] == 0 and first["rejected_reward"] == 0, first
    assert tables[0].parent == tables[1].parent and tables[0] != tables[1]   # one prepared set, two tables
    sides = [json.loads(t.with_suffix(".json").read_text()) for t in tables]
    assert sides[0]["reference_sha256"] != sides[1]["reference_sha256"]   # each its starting weights' digest
    assert sides[0]["sha256"] != sides[1]["sha256"]                       # and its own numbers


# ----------------------------------------------------------------------------- the step-0 check's tolerance

def step0(offset: torch.Tensor) -> None:
    """A fresh DPO run's first batch through the trainer's objective, its precomputed reference the policy's own
    log-probs plus ``offset`` (one per row: the chosen answers', then the rejected ones')."""
    p = resolve_preset("cpu-small", [*TINY, "train.objective=dpo", "train.pref_reference=precompute"])
    p.init = {"run": "sft", "step": 24}
    plan = objective_plan(p)
    assert plan.reference == PRECOMPUTED and plan.beta == 0.1
    torch.manual_seed(0)
    model = GPT(p.model).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, p.model.vocab_size, (4, p.model.seq_len), generator=g)
    y = torch.randint(0, p.model.vocab_size, (4, p.model.seq_len), generator=g)
    y[:, :10] = IGNORE   # the prompt's tokens are not trained
    with torch.no_grad():
        _, lp = model(x, y, logps=True)
    ref = lp.sum(-1) + offset
    batch = PairBatch(x[:2], y[:2], rejected_inputs=x[2:], rejected_targets=y[2:], ref_chosen=ref[:2],
                      ref_rejected=ref[2:])
    objective = build_objective(p, plan, model, torch.device("cpu"), None, None, Faults())
    objective.at_step(0, 1e-3, fresh=True)
    objective.loss(model, batch, None)


def test_the_step0_check_refuses_a_reference_off_by_the_bf16_bugs_rewards_and_takes_rounding():
    step0(torch.zeros(4))                                              # the policy is its reference: ln 2
    step0(torch.tensor([4e-3, -4e-3, 4e-3, -4e-3]))                    # rounding: rewards of 4e-4
    # the all-bf16 frozen copy's step-0 rewards (9e-3 on an H200): beta 0.1 times 0.09 nats, on both answers
    # alike, so the DPO loss stays ln 2 and only the rewards show it
    with pytest.raises(ObjectiveCheckError, match=r"step-0 check failed.*largest \|reward\| 9\.00e-03"):
        step0(torch.tensor([0.09, -0.09, 0.09, -0.09]))
