"""How a checkpoint is sampled: one definition of the settings and their defaults, read by every front
(``workbench sample`` and ``workbench chat``, the Sample pane's text and chat modes, the trainer's eval-time
samples, an export's ``generation_config.json``), so the same checkpoint, prompt and settings give the same
tokens wherever they are asked for (nanochat's Engine: one engine, one set of defaults). Torch-free: the TUI
reads it. The tokens themselves come from ``workbench.train.generate``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from workbench.errors import WorkbenchError


class SamplingError(WorkbenchError):
    exit_code = 2


def flag(key: str) -> str:
    """A setting as the command line spells it (``top_p`` -> ``--top-p``)."""
    return "--" + key.replace("_", "-")


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.8      # 0: greedy (the most likely token each step; seed, top-k and top-p do nothing)
    top_k: int = 50                # sample among the k most likely tokens only; 0: off
    top_p: float = 0.95            # ... and the fewest whose probability reaches p (nucleus); 1: off
    seed: int = 1337               # the generator's seed: the same seed, the same tokens
    max_new_tokens: int = 200

    def check(self, name: Callable[[str], str] = flag) -> "Sampling":
        """Itself, or :class:`SamplingError` naming the first bad setting as ``name(key)`` spells it."""
        if self.max_new_tokens < 1:
            raise SamplingError(f"{name('max_new_tokens')} must be at least 1")
        if self.temperature < 0:
            raise SamplingError(f"{name('temperature')} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise SamplingError(f"{name('top_k')} must be >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            raise SamplingError(f"{name('top_p')} must be in (0, 1] (1 = off)")
        return self

    def generate_args(self) -> dict[str, Any]:
        """The keyword arguments ``workbench.train.generate.generate`` takes for these settings."""
        return {"temperature": self.temperature, "top_k": self.top_k or None,
                "top_p": self.top_p if self.top_p < 1 else None, "seed": self.seed}

    def replace(self, **changes: Any) -> "Sampling":
        return dataclasses.replace(self, **changes)


# Text: a continuation of the prompt. Chat: greedy, so the same conversation gets the same reply (as the exported
# model gives it in llama.cpp or transformers with greedy decoding), and a reply has room for a few sentences.
TEXT = Sampling()
CHAT = Sampling(temperature=0.0, max_new_tokens=256)

__all__ = ["CHAT", "TEXT", "Sampling", "SamplingError", "flag"]
