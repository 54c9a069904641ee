"""Rewards: a number for a model's completion of a prompt, from a built-in check or the user's own function, and
what is made of them (preference pairs from the model's own samples, pass@k). Torch-free and data-side: the engine
samples, this package scores (TRL's reward functions, nanochat's answer checkers: plain functions).

``--reward`` takes (the one syntax, ``workbench pairs --help`` and ``workbench eval --help`` show it):

- ``exact[:FIELD]``        1 if the completion's first line, stripped, is the record's FIELD (default ``answer``)
- ``regex:PATTERN``        1 if the pattern is found in the completion (``re.search``)
- ``contains:TEXT``        1 if TEXT is in the completion
- ``length:TARGET``        graded, ``max(0, 1 - |chars - TARGET| / TARGET)``
- ``lexicon:POS[,NEG]``    graded, ``(positive - negative words) / words`` in [-1, 1], from word-list files
- ``FILE.py:FUNCTION``     the user's ``FUNCTION(prompt, completion, record) -> float``

A reward that raises, returns a non-number, NaN or infinity, or runs past ``--reward-timeout`` (5 s a call) stops
the command with one line naming the prompt and the completion (exit 2). Its name and digest (a file's sha256)
are recorded beside every result.

- ``builtin``   the built-in rewards, each a pure function made from its argument
- ``spec``      ``--reward SPEC`` made into a :class:`Reward`: a built-in or a user file loaded; each call guarded
                (exceptions, non-numbers, NaN, the time limit as a SIGALRM timer)
- ``prompts``   the prompts file (JSONL records with a ``prompt``, or text one prompt a line), read as corpora are
- ``prompt_data`` a prompts file as a GRPO run's data: encoded with the run's tokenizer (and chat template), split,
                drawn in the data layer's epoch order (resumable)
- ``pairs``     a prompt's samples into preference pairs (every two with different rewards), and the pairs file
                with its sidecar: written a prompt at a time, continued after a stop, refused with other settings
- ``scoring``   mean reward, pass@1 and pass@k (Chen et al.'s unbiased estimator)

May import: data, fs, fmt, errors. Never torch or textual.
"""

from workbench.reward.builtin import BUILTINS, RewardError
from workbench.reward.pairs import PairsFile, PromptPairs, meta_path, open_pairs, prompt_pairs
from workbench.reward.prompts import Prompt, Prompts, read_prompts
from workbench.reward.scoring import THRESHOLD, RewardSummary, pass_at_k, summarize
from workbench.reward.spec import TIMEOUT_S, Reward, parse_reward, shorten

__all__ = ["BUILTINS", "THRESHOLD", "TIMEOUT_S", "PairsFile", "Prompt", "PromptPairs", "Prompts", "Reward",
           "RewardError", "RewardSummary", "meta_path", "open_pairs", "parse_reward", "pass_at_k", "prompt_pairs",
           "read_prompts", "shorten", "summarize"]
