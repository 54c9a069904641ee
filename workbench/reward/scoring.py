"""A reward's scores over a prompts file summed up, as ``workbench eval --reward`` reports them: the mean reward,
pass@1 and pass@k.

A sample *passes* when its reward is at least the threshold (default 1.0: an exact reward's "right"). pass@k is
the chance that at least one of k samples of a prompt passes, estimated without bias from n >= k samples of which
c passed (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1 and its numerically stable
form): ``1 - C(n - c, k) / C(n, k)``, averaged over the prompts. pass@1 is then the share of samples that pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from workbench.reward.builtin import RewardError

THRESHOLD = 1.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s unbiased estimator: 1 - C(n-c, k) / C(n, k), as the product 1 - prod(1 - k/i, i = n-c+1..n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class RewardSummary:
    """Scores of n samples for each of the prompts: the mean reward and its spread, pass@1 and pass@k."""
    prompts: int
    samples: int            # a prompt
    k: int
    threshold: float
    mean: float
    sd: float               # over every sample
    pass_at_1: float
    pass_at_k: float
    no_signal: int          # prompts whose samples all scored the same

    def to_dict(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "samples": self.samples, "k": self.k, "threshold": self.threshold,
                "mean_reward": self.mean, "reward_sd": self.sd, "pass@1": self.pass_at_1,
                f"pass@{self.k}": self.pass_at_k, "pass@k": self.pass_at_k, "no_signal": self.no_signal}


def summarize(rewards: list[list[float]], k: int | None = None, threshold: float = THRESHOLD) -> RewardSummary:
    """``rewards[i]``: prompt i's n samples' rewards (the same n for every prompt); ``k`` defaults to n."""
    if not rewards or not rewards[0]:
        raise RewardError("no rewards to summarize")
    n = len(rewards[0])
    if any(len(r) != n for r in rewards):
        raise ValueError("every prompt needs the same number of samples")
    k = n if k is None else k
    if not 1 <= k <= n:
        raise RewardError(f"--pass-k {k} needs at least as many samples a prompt (--samples {n}), and k >= 1")
    flat = [x for r in rewards for x in r]
    mean = sum(flat) / len(flat)
    sd = math.sqrt(sum((x - mean) ** 2 for x in flat) / len(flat))
    passed = [sum(x >= threshold for x in r) for r in rewards]
    return RewardSummary(prompts=len(rewards), samples=n, k=k, threshold=threshold, mean=mean, sd=sd,
                         pass_at_1=sum(pass_at_k(n, c, 1) for c in passed) / len(rewards),
                         pass_at_k=sum(pass_at_k(n, c, k) for c in passed) / len(rewards),
                         no_signal=sum(len(set(r)) <= 1 for r in rewards))


__all__ = ["THRESHOLD", "RewardSummary", "pass_at_k", "summarize"]
