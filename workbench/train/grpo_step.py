"""GRPO's step in the engine: the rollouts of a batch of prompts from the current policy, their rewards, and the
loss of one policy-gradient step (:mod:`workbench.train.grpo`'s), with what the run logs of it.

* **Rollouts**: every prompt's G completions are sampled together, prompts x G rows of one KV cache, the prompts
  left-padded to one length (:func:`workbench.train.generate.sample_prompts`, generation's batched case), from the
  policy as it is at this step (eval mode, no dropout, its own dtype). A completion that ends at a stop id keeps it,
  so the policy learns to stop; the prompt is cropped from the left so that prompt and completion fit one window of
  the context.
* **Seeds, not a saved generator**: prompt i of step s is sampled with a generator of its own seeded from
  (train.seed, s, i), in the batch as alone (which prompts share the batch changes only the rounding of the
  logits, not the random stream), so the rollouts of a step are a function of the weights and the step alone; a
  resumed run (kill -9 included) samples exactly what the run it continues would have, with nothing more in the
  checkpoint than its step.
* **One inner iteration** (TRL's ``num_iterations = 1``): the loss is taken once per rollout, so the old
  log-probs are the policy's own, detached (the ratio is 1 and its gradient the plain policy gradient; the clip
  only bites when rollouts are reused, which this step does not).
* **Logged**: mean reward, reward std over the batch's completions, the share of groups with no signal (every
  reward of the group equal, so every advantage 0), the k3 KL to the reference (beta > 0), mean completion length
  in tokens, the share of tokens clipped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import torch

from workbench.data.train_data import IGNORE
from workbench.plan.sampling import Sampling
from workbench.train.generate import sample_prompts
from workbench.train.grpo import group_advantages, grpo_loss
from workbench.train.lora import adapters_off

# A completion's score: (the prompt's index in the batch, the completion's ids without its stop id) -> reward.
Score = Callable[[int, list[int]], float]
# The reference's per-token log-probs of rows (inputs, targets) -> [N, L], no gradient (beta > 0).
RefLogps = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class GRPOSettings:
    group: int = 8                  # G: completions a prompt (TRL's num_generations)
    max_new_tokens: int = 64        # the longest completion; dr_grpo's constant
    clip: float = 0.2               # epsilon low (PPO's, DeepSeekMath's, TRL's)
    clip_high: float | None = None  # epsilon high (None: = clip; DAPO's 0.28 lets unlikely tokens rise)
    beta: float = 0.0               # the k3 KL's weight (TRL's default 0: no reference forward)
    loss_type: str = "dapo"         # the normalisation (workbench.train.grpo.LOSS_TYPES)
    scale_std: bool = True          # divide advantages by the group's std (False: Dr. GRPO)
    # the policy's own distribution: temperature 1, no top-k or top-p (TRL's defaults; the policy gradient assumes
    # the completions were drawn from the policy it differentiates)
    sampling: Sampling = Sampling(temperature=1.0, top_k=0, top_p=1.0, seed=0, max_new_tokens=64)


def rollout_seed(seed: int, step: int, index: int) -> int:
    """The seed of prompt ``index``'s rollouts at ``step`` of a run seeded ``seed`` (63 bits)."""
    return int.from_bytes(hashlib.sha256(f"grpo:{seed}:{step}:{index}".encode()).digest()[:8], "little") >> 1


def reference_logps(model: torch.nn.Module, frozen: torch.nn.Module | None = None) -> RefLogps:
    """The reference a preference run gets, per token: ``model`` with its adapters off (a LoRA run: the weights
    it started from, no second copy), or ``frozen``, a frozen copy of the starting weights (a full fine-tune)."""
    @torch.no_grad()
    def logps(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if frozen is not None:
            return frozen(inputs, targets, logps=True)[1]
        with adapters_off(model):
            return model(inputs, targets, logps=True)[1]
    return logps


@dataclass(frozen=True)
class Rollouts:
    """A batch's completions as training rows: G consecutive rows a prompt."""
    inputs: torch.Tensor            # [N, L] prompt + completion, shifted; 0 after the row's end
    targets: torch.Tensor           # [N, L] the completion's tokens, IGNORE elsewhere
    rewards: torch.Tensor           # [N]
    completions: list[list[int]]    # each completion's ids (its stop id kept)

    @property
    def mask(self) -> torch.Tensor:
        return (self.targets != IGNORE).to(torch.float32)

    def rows(self, start: int, stop: int) -> Rollouts:
        """Rows ``[start, stop)`` (whole groups: a micro-batch of a step's rollouts)."""
        return Rollouts(self.inputs[start:stop], self.targets[start:stop], self.rewards[start:stop],
                        self.completions[start:stop])


@torch.no_grad()
def rollout(model: torch.nn.Module, prompts: list[list[int]], score: Score, s: GRPOSettings, seed: int, step: int,
            stops: frozenset[int], places: list[int] | None = None) -> Rollouts:
    """G completions of each prompt from ``model`` as it is now, scored (``score`` gets them without the stop id).
    ``places``: each prompt's place in the step, which seeds it (default its place in ``prompts``; a rank of a
    several-process run rolls out its share of the step's prompts, seeded where they stand in the whole step)."""
    ctx = model.cfg.seq_len
    keep = ctx - s.max_new_tokens     # prompt tokens that fit beside the longest completion (validated > 0)
    sampling = s.sampling.replace(max_new_tokens=s.max_new_tokens)
    rows: list[list[int]] = []
    starts: list[int] = []
    completions: list[list[int]] = []
    rewards: list[float] = []
    cropped = [list(ids)[-keep:] or [0] for ids in prompts]
    seeds = [rollout_seed(seed, step, i) for i in (places if places is not None else range(len(prompts)))]
    sampled = sample_prompts(model, cropped, s.group, sampling, seeds, stops, keep_stop=True)
    for i, (prompt, comps) in enumerate(zip(cropped, sampled)):
        for comp in comps:
            rows.append(prompt + comp)
            starts.append(len(prompt))
            completions.append(comp)
            rewards.append(float(score(i, comp[:-1] if comp and comp[-1] in stops else comp)))
    device = next(model.parameters()).device
    width = max(len(r) for r in rows) - 1
    inputs = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for n, (r, start) in enumerate(zip(rows, starts)):
        seq = torch.tensor(r)
        inputs[n, :len(r) - 1] = seq[:-1]
        targets[n, start - 1:len(r) - 1] = seq[start:]
    return Rollouts(inputs.to(device), targets.to(device), torch.tensor(rewards, device=device), completions)


@dataclass(frozen=True)
class GRPOStats:
    loss: float
    reward_mean: float
    reward_std: float
    no_signal: float                # share of groups whose rewards were all equal
    kl: float | None                # mean k3 KL to the reference (beta > 0)
    completion_len: float           # mean completion length in tokens (the stop id counted)
    clipped: float

    def as_record(self) -> dict[str, float | None]:
        return {"reward": self.reward_mean, "reward_std": self.reward_std, "no_signal": self.no_signal,
                "kl": self.kl, "completion_len": self.completion_len, "clipped": self.clipped}


def rollout_loss(forward: Callable, r: Rollouts, s: GRPOSettings, reference: RefLogps | None = None,
                 tokens: torch.Tensor | float | None = None) -> tuple[torch.Tensor, GRPOStats]:
    """The loss of one policy-gradient step on ``r`` (``forward``: the model's, with gradient) and its stats;
    ``tokens``: dapo's count of the whole step's completion tokens, when ``r`` is one micro-batch of several."""
    _, logps = forward(r.inputs, r.targets, logps=True)
    old = logps.detach()            # one inner iteration: the sampling policy is this one
    ref = reference(r.inputs, r.targets) if s.beta > 0 and reference is not None else None
    adv = group_advantages(r.rewards, s.group, s.scale_std)
    mask = r.mask
    res = grpo_loss(logps, old, adv.advantages, mask, ref, s.beta, s.clip, s.clip_high, s.loss_type,
                    max_completion=s.max_new_tokens, tokens=tokens)
    rewards = r.rewards.float()
    stats = GRPOStats(loss=float(res.loss.detach()), reward_mean=float(rewards.mean()),
                      reward_std=float(rewards.std()) if rewards.numel() > 1 else 0.0,
                      no_signal=adv.no_signal_share, kl=None if res.kl is None else float(res.kl),
                      completion_len=float(mask.sum(-1).mean()), clipped=float(res.clipped))
    return res.loss, stats


__all__ = ["GRPOSettings", "GRPOStats", "RefLogps", "Rollouts", "Score", "reference_logps", "rollout", "rollout_loss",
           "rollout_seed"]
