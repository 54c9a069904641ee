"""GRPO's loss (workbench/train/grpo.py) against TRL's own code.

What is compared: on one fixed batch (2 prompts x G = 4 completions of ragged lengths, per-token log-probs of the
policy as a leaf that requires grad, old log-probs that differ from them by up to ±0.5 so that both sides of the
clip bite, reference log-probs, rewards of which one group is all equal), TRL's
``GRPOTrainer._compute_loss`` itself — the installed trainer's method, called on a stand-in ``self`` carrying the
attributes it reads (loss_type, epsilons, beta, the accelerator's gather/reduce for one process), whose
``_get_per_token_logps_and_entropies`` returns our leaf — gives the loss and the gradient with respect to the
policy's log-probs; ``grpo_loss`` must give both to 1e-5 (fp32), for each shipped ``loss_type`` (dapo, grpo, bnpo,
dr_grpo), with beta 0 and 0.04, with old log-probs given and with TRL's one-iteration case (old = the policy's,
detached). The advantages TRL's ``_compute_loss`` takes are computed inside its ``_generate_and_score_completions``
(with generation and reward calls around it), so ``group_advantages`` is compared with those lines of it written
out here over TRL's own ``nanstd`` — that part is a copy of TRL's formula, not a call of its code.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from workbench.train.grpo import LOSS_TYPES, group_advantages, grpo_loss

G, B, T, MAX_LEN = 4, 8, 7, 9


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([7, 3, 5, 1, 6, 7, 2, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    logps = -torch.rand(B, T, generator=g) * 3 - 0.05
    old = logps + (torch.rand(B, T, generator=g) - 0.5)
    ref = logps + (torch.rand(B, T, generator=g) - 0.5) * 0.6
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.25, 0.25, 0.25, 0.25])   # the second group: no signal
    return {"mask": mask, "logps": logps, "old": old, "ref": ref, "rewards": rewards}


def trl_loss(loss_type: str, beta: float, logps: torch.Tensor, inputs: dict, clip=(0.2, 0.28)):
    """The loss and d loss / d logps by TRL's GRPOTrainer._compute_loss, called on a stand-in trainer."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    leaf = logps.clone().requires_grad_(True)
    acc = SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda x: x, gather_for_metrics=lambda x: x,
                          reduce=lambda x, reduction="sum": x)
    me = SimpleNamespace(
        loss_type=loss_type, beta=beta, epsilon_low=clip[0], epsilon_high=clip[1], top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level="token", use_vllm=False,
        vllm_importance_sampling_correction=False, _entropy_bonus_enabled=False, aux_loss_enabled=False,
        current_gradient_accumulation_steps=1, max_completion_length=MAX_LEN, accelerator=acc,
        model=SimpleNamespace(training=True), _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (leaf, torch.zeros_like(leaf), None))
    loss = GRPOTrainer._compute_loss(me, None, {**inputs, "prompt_ids": torch.ones(B, 2, dtype=torch.long),
                                                "prompt_mask": torch.ones(B, 2, dtype=torch.long)})
    loss.backward()
    return loss.detach(), leaf.grad, me._metrics["train"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("given_old", [True, False])
def test_the_loss_and_its_gradient_equal_trls_grpo_trainer(batch, loss_type, beta, given_old):
    adv = group_advantages(batch["rewards"], G).advantages
    mask = batch["mask"]
    inputs = {"completion_ids": torch.ones(B, T, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "num_items_in_batch": mask.sum(), "ref_per_token_logps": batch["ref"]}
    if given_old:
        inputs["old_per_token_logps"] = batch["old"]
    want, want_grad, metrics = trl_loss(loss_type, beta, batch["logps"], inputs)

    leaf = batch["logps"].clone().requires_grad_(True)
    old = batch["old"] if given_old else leaf.detach()
    got = grpo_loss(leaf, old, adv, mask, batch["ref"] if beta else None, beta, 0.2, 0.28, loss_type,
                    max_completion=MAX_LEN)
    got.loss.backward()
    assert torch.allclose(got.loss.detach(), want, atol=1e-5, rtol=0), (float(got.loss), float(want))
    assert torch.allclose(leaf.grad, want_grad, atol=1e-5, rtol=0), (leaf.grad - want_grad).abs().max()
    assert abs(float(got.clipped) - metrics["clip_ratio/region_mean"][-1]) < 1e-6
    if beta:
        assert abs(float(got.kl) - metrics["kl"][-1]) < 1e-5
    else:
        assert got.kl is None
    if not given_old:   # one inner iteration: every ratio is 1, nothing is clipped
        assert float(got.clipped) == 0


def test_the_advantages_are_trls_group_normalisation(batch):
    from trl.trainer.utils import nanstd
    r = batch["rewards"]
    mean = torch.nanmean(r.view(-1, G), dim=1).repeat_interleave(G)
    std = nanstd(r.view(-1, G), dim=1).repeat_interleave(G)
    for scale in (True, False):
        want = (r - mean) / (std + 1e-4) if scale else r - mean
        got = group_advantages(r, G, scale_std=scale)
        assert torch.allclose(got.advantages, want, atol=1e-6, rtol=0)
    got = group_advantages(r, G)
    assert got.no_signal.tolist() == [False, True] and got.no_signal_share == 0.5
    assert got.advantages[G:].abs().max() == 0      # a group of equal rewards teaches nothing


def test_bad_groups_and_loss_types_are_refused(batch):
    with pytest.raises(ValueError, match="not groups of 3"):
        group_advantages(batch["rewards"], 3)
    with pytest.raises(ValueError, match="not one of"):
        grpo_loss(batch["logps"], batch["old"], torch.zeros(B), batch["mask"], loss_type="ppo")
    with pytest.raises(ValueError, match="max_completion"):
        grpo_loss(batch["logps"], batch["old"], torch.zeros(B), batch["mask"], loss_type="dr_grpo")
