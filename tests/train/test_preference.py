"""Preference losses (workbench/train/preference_losses.py) against an independent implementation: TRL's DPOTrainer
(sigmoid and robust DPO, the SFT term) on a tiny Llama built here, TRL's CPO (SimPO) and ORPO loss functions,
and KTO's formula written out in the test; on the Llama's own logits and on workbench's model with the Llama's
weights imported (loss, rewards and every gradient, fp32)."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.support.oracles import answer_logps
from workbench.config import ModelConfig
from workbench.interop.hf_layout import hf_state_dict, model_config, workbench_state_dict
from workbench.train.model import GPT
from workbench.train.preference_losses import (
    dpo_loss,
    kto_loss,
    orpo_loss,
    sft_term,
    simpo_loss,
)

V, T, PAIRS = 64, 12, 3


def llama(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).float()


@pytest.fixture(scope="module")
def pairs():
    """[chosen rows; rejected rows] as TRL collates them: a shared prompt, then an answer of its own length, right
    padded; completion_mask marks the answers."""
    g = torch.Generator().manual_seed(1)
    ids = torch.full((2 * PAIRS, T), 1, dtype=torch.long)
    attn = torch.zeros_like(ids)
    comp = torch.zeros_like(ids)
    for i in range(PAIRS):
        prompt = torch.randint(3, V, (3 + i,), generator=g)
        for row, n in ((i, 4 + i), (PAIRS + i, 2 + 2 * i)):
            answer = torch.randint(3, V, (n,), generator=g)
            seq = torch.cat([prompt, answer])
            ids[row, :len(seq)], attn[row, :len(seq)], comp[row, len(prompt):len(seq)] = seq, 1, 1
    return {"input_ids": ids, "attention_mask": attn, "completion_mask": comp}


def trl_dpo(policy, ref, batch, **config):
    """TRL's own DPOTrainer on ``batch``: (loss, its metrics, the policy's gradients)."""
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl import DPOConfig, DPOTrainer
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, "t0")),
                                  pad_token="t1", eos_token="t2")
    # fp32 throughout: TRL defaults to bf16, which runs its reference model under autocast
    args = DPOConfig(output_dir="/tmp/wb-trl-dpo", report_to=[], use_cpu=True, max_steps=1, bf16=False, fp16=False,
                     **config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = DPOTrainer(model=policy, ref_model=ref, args=args, processing_class=tok,
                        train_dataset=Dataset.from_list([{"prompt": "t3", "chosen": " t4", "rejected": " t5"}]))
    policy.zero_grad()
    loss = tr.compute_loss(policy, dict(batch))
    loss.backward()
    grads = {n: q.grad.detach().clone() for n, q in policy.named_parameters()}
    return loss.detach(), {k: v[-1] for k, v in tr._metrics["train"].items()}, grads


def ours(logits, ref_logits, batch):
    """Our log-probs of the answers, split into chosen and rejected (targets shifted by one, as a model predicts)."""
    targets, mask = batch["input_ids"][:, 1:], batch["completion_mask"][:, 1:]
    lp = answer_logps(logits[:, :-1], targets, mask)
    ref = answer_logps(ref_logits[:, :-1], targets, mask).total.detach()
    return lp.rows(slice(0, PAIRS)), lp.rows(slice(PAIRS, None)), ref[:PAIRS], ref[PAIRS:]


@pytest.mark.parametrize("kind", ["sigmoid", "robust", "sigmoid+sft"])
def test_dpo_equals_trls_dpo_trainer(pairs, kind):
    """Loss, rewards and every gradient equal TRL's DPOTrainer (fp32, 1e-5), on the Llama's logits and through
    workbench's model with its weights."""
    policy, ref = llama(0), llama(7)     # a reference other than the policy: rewards are not 0
    config = {"beta": 0.3, "loss_type": ["sigmoid"]}
    smoothing, sft = 0.0, 0.0
    if kind == "robust":
        config, smoothing = {"beta": 0.3, "loss_type": ["robust"], "label_smoothing": 0.2}, 0.2
    elif kind == "sigmoid+sft":
        config, sft = {"beta": 0.3, "loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]}, 0.5
    want_loss, metrics, want_grads = trl_dpo(policy, ref, pairs, **config)

    policy.zero_grad()
    with torch.no_grad():
        ref_logits = ref(input_ids=pairs["input_ids"], attention_mask=pairs["attention_mask"]).logits
    logits = policy(input_ids=pairs["input_ids"], attention_mask=pairs["attention_mask"]).logits
    c, r, rc, rr = ours(logits, ref_logits, pairs)
    got = dpo_loss(c, r, rc, rr, beta=0.3, label_smoothing=smoothing, sft_weight=sft)
    got.loss.backward()
    assert got.loss.item() == pytest.approx(want_loss.item(), abs=1e-5)
    assert got.chosen_rewards.mean().item() == pytest.approx(metrics["rewards/chosen"], abs=1e-5)
    assert got.rejected_rewards.mean().item() == pytest.approx(metrics["rewards/rejected"], abs=1e-5)
    assert got.accuracy.item() == pytest.approx(metrics["rewards/accuracies"])
    assert got.margin.mean().item() == pytest.approx(metrics["rewards/margins"], abs=1e-5)
    for name, q in policy.named_parameters():
        torch.testing.assert_close(q.grad, want_grads[name], atol=1e-5, rtol=1e-4, msg=name)

    # workbench's own model with the Llama's weights (q and k rows reordered on the way in and out)
    cfg = ModelConfig(**model_config(dict(policy.config.to_dict(), architectures=["LlamaForCausalLM"]), seq_len=32))
    wb_policy, wb_ref = GPT(cfg), GPT(cfg)
    wb_policy.load_state_dict(workbench_state_dict(policy.state_dict(), cfg))
    wb_ref.load_state_dict(workbench_state_dict(ref.state_dict(), cfg))
    idx = pairs["input_ids"]
    with torch.no_grad():
        wb_ref_logits = wb_ref(idx, idx)[0]
    c, r, rc, rr = ours(wb_policy(idx, idx)[0], wb_ref_logits, pairs)
    wb = dpo_loss(c, r, rc, rr, beta=0.3, label_smoothing=smoothing, sft_weight=sft)
    wb.loss.backward()
    assert wb.loss.item() == pytest.approx(want_loss.item(), abs=1e-5)
    assert wb.chosen_rewards.mean().item() == pytest.approx(metrics["rewards/chosen"], abs=1e-5)
    grads = hf_state_dict({n: q.grad for n, q in wb_policy.named_parameters()}, cfg)
    for name, g in grads.items():
        torch.testing.assert_close(g, want_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_dpo_at_the_first_step_is_ln2_with_zero_rewards(pairs):
    """Policy = reference: the loss is ln 2 and every reward 0 (what the trainer checks at step 0)."""
    m = llama(0)
    logits = m(input_ids=pairs["input_ids"]).logits
    c, r, rc, rr = ours(logits, logits.detach(), pairs)
    out = dpo_loss(c, r, rc, rr, beta=0.1)
    assert out.loss.item() == pytest.approx(math.log(2), abs=1e-6)
    assert out.chosen_rewards.abs().max().item() == 0 and out.rejected_rewards.abs().max().item() == 0


def trl_self(**kw):
    """The attributes TRL's loss methods read from their trainer."""
    return SimpleNamespace(accelerator=SimpleNamespace(device=torch.device("cpu")), alpha=0.0, **kw)


def test_simpo_equals_trls_cpo_simpo_loss(pairs):
    from trl.experimental.cpo import CPOTrainer
    m = llama(0)
    logits = m(input_ids=pairs["input_ids"]).logits
    c, r, _, _ = ours(logits, logits.detach(), pairs)
    got = simpo_loss(c, r, beta=2.0, gamma=1.0, label_smoothing=0.1)
    losses, cr, rr = CPOTrainer.cpo_loss(trl_self(beta=2.0, label_smoothing=0.1, loss_type="simpo", simpo_gamma=1.0),
                                         c.mean, r.mean)[:3]
    assert got.loss.item() == pytest.approx(losses.mean().item(), abs=1e-6)
    torch.testing.assert_close(got.chosen_rewards, cr.detach())
    torch.testing.assert_close(got.rejected_rewards, rr.detach())
    # averaged, not summed: the same pairs with the answers' sums give another loss
    assert simpo_loss(c, r, 2.0).loss.item() != pytest.approx(
        (-F.logsigmoid(2.0 * (c.total - r.total) - 1.0)).mean().item(), abs=1e-3)


def test_orpo_equals_trls_odds_ratio_plus_the_chosen_nll(pairs):
    from trl.experimental.orpo import ORPOTrainer
    m = llama(0)
    logits = m(input_ids=pairs["input_ids"]).logits
    c, r, _, _ = ours(logits, logits.detach(), pairs)
    got = orpo_loss(c, r, lam=0.1)
    ratio_losses, cr, rr = ORPOTrainer.odds_ratio_loss(trl_self(beta=0.1), c.mean, r.mean)[:3]
    labels = pairs["input_ids"][:PAIRS, 1:].masked_fill(pairs["completion_mask"][:PAIRS, 1:] == 0, -100)
    nll = F.cross_entropy(logits[:PAIRS, :-1].reshape(-1, V), labels.reshape(-1), ignore_index=-100)
    assert got.loss.item() == pytest.approx((nll - ratio_losses.mean()).item(), abs=1e-6)
    assert sft_term(c).item() == pytest.approx(nll.item(), abs=1e-6)
    torch.testing.assert_close(got.chosen_rewards, cr.detach())
    torch.testing.assert_close(got.rejected_rewards, rr.detach())


def test_kto_is_the_papers_formula(pairs):
    """KTO (Ethayarajh et al. 2024, eq. 7 as TRL writes it): desirable 1 − σ(β(r − z)), undesirable 1 − σ(β(z − r)),
    weighted, z clamped at 0 and not differentiated."""
    m, ref = llama(0), llama(7)
    idx, mask = pairs["input_ids"], pairs["completion_mask"]
    logits = m(input_ids=idx).logits
    with torch.no_grad():
        ref_logits = ref(input_ids=idx).logits
    lp = answer_logps(logits[:, :-1], idx[:, 1:], mask[:, 1:])
    ref_lp = answer_logps(ref_logits[:, :-1], idx[:, 1:], mask[:, 1:]).total
    desirable = torch.tensor([True, False, True, True, False, False])
    for kl in (torch.tensor(0.3), torch.tensor(-0.2)):
        got = kto_loss(lp, ref_lp, desirable, kl, beta=0.1, desirable_weight=1.0, undesirable_weight=1.33)
        z = max(kl.item(), 0.0)
        want = []
        for i in range(len(desirable)):
            r = lp.total[i].item() - ref_lp[i].item()
            want.append(1 - 1 / (1 + math.exp(-0.1 * (r - z))) if desirable[i]
                        else 1.33 * (1 - 1 / (1 + math.exp(-0.1 * (z - r)))))
        assert got.loss.item() == pytest.approx(sum(want) / len(want), abs=1e-6)
        assert got.chosen_rewards.shape == (3,) and got.rejected_rewards.shape == (3,)


def random_pairs(seed: int, n: int = 16):
    """Random answers' log-probs (a chosen and a rejected row per pair, answers of 1-9 tokens) and a reference
    that is above the policy's chosen answer for about half the pairs, below it for the rest."""
    g = torch.Generator().manual_seed(seed)
    per_token = -torch.rand(2 * n, 9, generator=g) * 3
    mask = (torch.arange(9) < torch.randint(1, 10, (2 * n, 1), generator=g)).float()
    per_token = (per_token * mask).requires_grad_()
    lp = answer_logps_of(per_token, mask)
    ref = lp.total.detach() + torch.randn(2 * n, generator=g) * 4
    return per_token, lp, ref, n


def answer_logps_of(per_token, mask):
    from workbench.train.preference_losses import AnswerLogps
    return AnswerLogps(per_token, mask, per_token.sum(-1), mask.sum(-1))


@pytest.mark.parametrize("lam", [0.5, 50.0])
def test_dpop_is_the_papers_formula(lam):
    """DPOP (Pal et al. 2024, eq. 3) written out pair by pair in float64: −log σ(β [(π_c − ref_c) − (π_r − ref_r)
    − λ max(0, ref_c − π_c)]), mean over the pairs; loss and gradient to 1e-6 (fp32)."""
    for seed in range(3):
        per_token, lp, ref, n = random_pairs(seed)
        got = dpo_loss(lp.rows(slice(0, n)), lp.rows(slice(n, None)), ref[:n], ref[n:], beta=0.1, dpop=lam)
        pc, pr = per_token[:n].double().sum(-1), per_token[n:].double().sum(-1)
        rc, rr = ref[:n].double(), ref[n:].double()
        assert ((rc > pc).sum() > 2) and ((rc < pc).sum() > 2)   # both sides of the hinge
        logits = 0.1 * ((pc - rc) - (pr - rr) - lam * torch.maximum(rc - pc, torch.zeros_like(pc)))
        want = (-torch.log(1 / (1 + torch.exp(-logits)))).mean()
        assert got.loss.item() == pytest.approx(want.item(), abs=1e-6)
        g_got, = torch.autograd.grad(got.loss, per_token)
        g_want, = torch.autograd.grad(want, per_token)
        torch.testing.assert_close(g_got, g_want.float(), atol=1e-6, rtol=1e-5)
        # the rewards stay DPO's, β (π − ref)
        torch.testing.assert_close(got.chosen_rewards, (0.1 * (pc - rc)).float().detach())


def test_dpop_zero_is_plain_dpo_and_its_penalty_is_zero_while_the_chosen_have_not_fallen(pairs):
    per_token, lp, ref, n = random_pairs(5)
    c, r = lp.rows(slice(0, n)), lp.rows(slice(n, None))
    for smoothing in (0.0, 0.2):
        plain = dpo_loss(c, r, ref[:n], ref[n:], 0.1, label_smoothing=smoothing)
        assert torch.equal(dpo_loss(c, r, ref[:n], ref[n:], 0.1, label_smoothing=smoothing, dpop=0.0).loss,
                           plain.loss)
        assert dpo_loss(c, r, ref[:n], ref[n:], 0.1, label_smoothing=smoothing, dpop=50.0).loss > plain.loss
    # every chosen answer at or above its reference: no penalty, whatever λ
    above = torch.minimum(ref[:n], c.total.detach())
    assert torch.equal(dpo_loss(c, r, above, ref[n:], 0.1, dpop=50.0).loss, dpo_loss(c, r, above, ref[n:], 0.1).loss)
    # the step-0 check: policy = reference gives ln 2 and zero rewards with DPOP too
    m = llama(0)
    logits = m(input_ids=pairs["input_ids"]).logits
    c, r, rc, rr = ours(logits, logits.detach(), pairs)
    out = dpo_loss(c, r, rc, rr, beta=0.1, dpop=50.0)
    assert out.loss.item() == pytest.approx(math.log(2), abs=1e-6)
    assert out.chosen_rewards.abs().max().item() == 0 and out.rejected_rewards.abs().max().item() == 0
    # ... and its gradient is DPO's: the hinge's subgradient at 0 is 0 (not 1, as clamp's would be), so the first
    # step is plain DPO's rather than one with λ times the chosen answers' gradient added
    g_dpop = torch.autograd.grad(out.loss, m.lm_head.weight, retain_graph=True)[0]
    g_dpo = torch.autograd.grad(dpo_loss(c, r, rc, rr, beta=0.1).loss, m.lm_head.weight)[0]
    assert g_dpo.abs().max() > 0 and torch.equal(g_dpop, g_dpo)
    with pytest.raises(ValueError, match="dpop -1"):
        dpo_loss(c, r, rc, rr, beta=0.1, dpop=-1.0)
