"""GRPO's step (workbench/train/grpo_step.py) on a tiny GPT: rollouts are G rows of one prompt, their rows train
only the completion's tokens, the same (seed, step) samples the same completions (what resume relies on), the KL
to a reference that is the policy is 0, and a few dozen steps raise the mean reward on a trivially learnable task.

Why a fixed-seed learning test is not flaky: the model, the prompts, every rollout's seed and the optimizer are
fixed, so on a CPU the run is the same computation every time; the margin asserted (mean reward from ~0.12 to
above 0.5) is far from where the run ends."""

from __future__ import annotations

import copy

import pytest
import torch

from workbench.config import ModelConfig, TrainConfig
from workbench.data.train_data import IGNORE
from workbench.train.generate import sample_rows
from workbench.train.grpo_step import GRPOSettings, reference_logps, rollout, rollout_loss, rollout_seed
from workbench.train.lora import apply_lora
from workbench.train.model import GPT

GOOD = set(range(3, 11))       # 8 of 64 tokens: a completion's reward is its share of these


def tiny(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=32))


def share_good(_i: int, ids: list[int]) -> float:
    return sum(t in GOOD for t in ids) / max(len(ids), 1)


PROMPTS = [[20, 21, 22], [30, 31], [40, 41, 42, 43], [50]]


def test_rollouts_are_groups_of_rows_trained_on_the_completion_only():
    model, s = tiny(), GRPOSettings(group=4, max_new_tokens=6)
    r = rollout(model, PROMPTS, share_good, s, seed=1, step=0, stops=frozenset({63}))
    assert r.inputs.shape[0] == len(PROMPTS) * 4 == len(r.rewards) == len(r.completions)
    for n, comp in enumerate(r.completions):
        prompt = PROMPTS[n // 4]
        trained = r.targets[n][r.targets[n] != IGNORE].tolist()
        assert trained == comp and 1 <= len(comp) <= 6
        assert r.inputs[n, :len(prompt)].tolist() == prompt
        assert r.rewards[n] == share_good(0, comp[:-1] if comp[-1] == 63 else comp)
    # the prompts (3, 2, 4 and 1 tokens) sampled together, left-padded: each prompt's G rows are what it samples
    # alone from its own seed (tests/train/test_generate_batched.py: to rounding; these fixed draws are equal)
    for i, prompt in enumerate(PROMPTS):
        alone = sample_rows(model, prompt, 4, s.sampling.replace(max_new_tokens=6), rollout_seed(1, 0, i),
                            frozenset({63}), keep_stop=True)
        assert r.completions[4 * i:4 * i + 4] == alone
    again = rollout(model, PROMPTS, share_good, s, seed=1, step=0, stops=frozenset({63}))
    assert again.completions == r.completions          # a step's rollouts: a function of weights, seed and step
    other = rollout(model, PROMPTS, share_good, s, seed=1, step=1, stops=frozenset({63}))
    assert other.completions != r.completions
    assert rollout_seed(1, 0, 0) != rollout_seed(1, 0, 1) != rollout_seed(1, 1, 0)


def test_the_kl_to_a_reference_that_is_the_policy_is_zero():
    model, s = tiny(), GRPOSettings(group=4, max_new_tokens=6, beta=0.04)
    frozen = copy.deepcopy(model).requires_grad_(False)
    r = rollout(model, PROMPTS, share_good, s, seed=3, step=0, stops=frozenset())
    model.train()
    loss, stats = rollout_loss(model, r, s, lambda x, y: frozen(x, y, logps=True)[1])
    loss.backward()
    assert stats.kl == 0.0 and stats.clipped == 0.0
    assert stats.completion_len == 6.0 and 0 <= stats.no_signal <= 1
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_the_reference_is_the_starting_model_and_the_kl_grows_once_the_policy_moves(kind):
    """A LoRA run's reference is the model with its adapters off, a full run's a frozen copy: 0 at step 0, above
    0 after two updates, and the reference itself never moves."""
    model, s = tiny(2), GRPOSettings(group=4, max_new_tokens=6, beta=0.04)
    if kind == "lora":
        apply_lora(model, TrainConfig(finetune="lora", lora_rank=4))
        ref = reference_logps(model)
    else:
        ref = reference_logps(model, copy.deepcopy(model).requires_grad_(False))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    kls, first = [], None
    for step in range(3):
        r = rollout(model, PROMPTS, share_good, s, seed=5, step=step, stops=frozenset())
        if first is None:
            first, start = r, ref(r.inputs, r.targets)
        model.train()
        loss, stats = rollout_loss(model, r, s, ref)
        opt.zero_grad()
        loss.backward()
        opt.step()
        kls.append(stats.kl)
    assert kls[0] == 0.0 and kls[-1] > 0, kls
    assert torch.equal(ref(first.inputs, first.targets), start)


@pytest.mark.parametrize("loss_type", ["dapo"])
def test_grpo_raises_the_mean_reward_of_a_learnable_task(loss_type):
    torch.set_num_threads(1)
    model = tiny(1)
    s = GRPOSettings(group=8, max_new_tokens=4, loss_type=loss_type)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    means = []
    for step in range(30):
        r = rollout(model, PROMPTS, share_good, s, seed=7, step=step, stops=frozenset())
        model.train()
        loss, stats = rollout_loss(model, r, s)
        opt.zero_grad()
        loss.backward()
        opt.step()
        means.append(stats.reward_mean)
    first, last = sum(means[:5]) / 5, sum(means[-5:]) / 5
    assert first < 0.3 and last > 0.5 and last > first + 0.3, means
