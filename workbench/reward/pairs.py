"""Preference pairs from a prompt's scored samples, and the pairs file ``workbench pairs`` writes and continues.

**Which pairs** (the DPO paper's recipe, Rafailov et al. 2023, App. C.1): every two of a prompt's K samples whose
rewards differ, the higher-rewarded one chosen (4 samples give up to 6 pairs), in sample order (i < j). Two kinds are
left out, because the preference reader refuses them (:mod:`workbench.data.preference.preference_records`): two samples
with the same text, and a sample that is empty or only whitespace. They are counted (``skipped``), never silently lost.

**The file** is the pairs format the preference trainer reads, one JSON object a line:
``{"prompt", "chosen", "rejected", "chosen_reward", "rejected_reward"}`` (and ``system`` when the prompt's record
has one), so ``workbench train ... --init-from RUN --corpus pairs.jsonl --set train.objective=dpo`` trains on
it. Beside it, ``PATH.meta.json`` (:func:`meta_path`) says how it was made (``settings``: the run and its
checkpoint, the prompts file's digest, the reward's name and digest, the samples a prompt, the sampling settings)
and how far it got (``done`` prompts, the pairs file's ``bytes`` after them, counts and the reward's sum).

**Continuing.** The pairs of one prompt are appended, flushed, and only then the sidecar replaced (atomically)
with the new ``done`` and ``bytes``: the sidecar never counts pairs that are not in the file. A run that stopped
(a failing reward, Ctrl-C, kill -9) is continued by running the same command again: pairs past the sidecar's
``bytes`` (a prompt half written) are cut off, and sampling goes on at the next prompt, each prompt sampled with
its own seed (``seed + its index``), so a continued file equals one written in one go. Other settings are refused
in one line that says how to start over; so is an existing file without a sidecar (it is not ours to append to).
Nothing is created until the first prompt's pairs are ready.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.fs import read_json, write_atomic
from workbench.reward.builtin import RewardError
from workbench.reward.prompts import Prompt

VERSION = 1


def meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".meta.json")


@dataclass(frozen=True)
class PromptPairs:
    """One prompt's pairs (records as written) and the pairs left out (same text, or an empty answer)."""
    records: list[dict[str, Any]]
    skipped: int


def prompt_pairs(prompt: Prompt, completions: list[str], rewards: list[float]) -> PromptPairs:
    """Every two samples with different rewards, as pair records (chosen = the higher reward)."""
    out: list[dict[str, Any]] = []
    skipped = 0
    head: dict[str, Any] = {"prompt": prompt.text}
    if prompt.system:
        head["system"] = prompt.system
    for i in range(len(completions)):
        for j in range(i + 1, len(completions)):
            if rewards[i] == rewards[j]:
                continue
            hi, lo = (i, j) if rewards[i] > rewards[j] else (j, i)
            if completions[hi] == completions[lo] or not completions[hi].strip() or not completions[lo].strip():
                skipped += 1
                continue
            out.append({**head, "chosen": completions[hi], "rejected": completions[lo],
                        "chosen_reward": rewards[hi], "rejected_reward": rewards[lo]})
    return PromptPairs(out, skipped)


def _first_difference(old: Any, new: Any, key: str = "") -> str | None:
    """Where two settings differ, as 'key: OLD then, NEW now' (None: they do not)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in list(old) + [k for k in new if k not in old]:
            found = _first_difference(old.get(k), new.get(k), f"{key}.{k}" if key else k)
            if found:
                return found
        return None
    return None if old == new else f"{key}: {json.dumps(old)} then, {json.dumps(new)} now"


@dataclass
class PairsFile:
    """The pairs file being written: where it is, the settings it is made with, and how far it is."""
    path: Path
    settings: dict[str, Any]
    total: int                     # prompts in all
    done: int = 0                  # prompts whose pairs are in the file
    bytes: int = 0
    pairs: int = 0
    skipped: int = 0
    no_signal: int = 0             # prompts whose samples all scored the same (no pair)
    reward_sum: float = 0.0
    scored: int = 0                # samples scored
    started: float = field(default_factory=time.time)
    info: dict[str, Any] = field(default_factory=dict)   # recorded, not compared: paths, the device, the time limit

    @property
    def meta(self) -> Path:
        return meta_path(self.path)

    @property
    def complete(self) -> bool:
        return self.done >= self.total

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.scored if self.scored else None

    def record(self) -> dict[str, Any]:
        return {"version": VERSION, "settings": self.settings, **self.info, "prompts_total": self.total,
                "done": self.done, "bytes": self.bytes, "pairs": self.pairs, "skipped": self.skipped,
                "no_signal": self.no_signal,
                "samples_scored": self.scored, "reward_sum": self.reward_sum, "mean_reward": self.mean_reward,
                "complete": self.complete, "started": self.started, "updated": time.time()}

    def add(self, found: PromptPairs, rewards: list[float]) -> None:
        """One more prompt done: its pairs appended and flushed, then the sidecar replaced to count them."""
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in found.records).encode("utf-8")
        with open(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.done += 1
        self.bytes += len(data)
        self.pairs += len(found.records)
        self.skipped += found.skipped
        self.no_signal += len(set(rewards)) <= 1
        self.reward_sum += sum(rewards)
        self.scored += len(rewards)
        write_atomic(self.meta, json.dumps(self.record(), indent=1) + "\n")


def open_pairs(path: Path, settings: dict[str, Any], total: int) -> PairsFile:
    """The pairs file at ``path``: a new one (nothing created yet), or the one a run of these ``settings`` left,
    to continue (a half-written prompt at its end cut off); one line refusing anything else."""
    path = Path(path)
    meta = meta_path(path)
    start_over = f"delete {path} and {meta.name} (or give another --out) to start over"
    if not meta.exists():
        if path.exists():
            raise RewardError(f"{path} exists and was not written by `workbench pairs` (no {meta.name} beside it); "
                              "give another --out, or delete it")
        return PairsFile(path, settings, total)
    rec = read_json(meta)
    if not isinstance(rec, dict) or rec.get("version") != VERSION or not isinstance(rec.get("settings"), dict):
        raise RewardError(f"{meta} is not a pairs sidecar this version reads; {start_over}")
    diff = _first_difference(rec["settings"], settings)
    if diff:
        raise RewardError(f"{path} was made with other settings ({diff}); run the same command to continue it, or "
                          f"{start_over}")
    size = path.stat().st_size if path.exists() else -1
    if size < int(rec["bytes"]):
        raise RewardError(f"{path} is shorter than {meta.name} says ({max(size, 0)} bytes, not {rec['bytes']}): it "
                          f"was changed since; {start_over}")
    if size > rec["bytes"]:
        os.truncate(path, rec["bytes"])   # a prompt whose pairs were being written when the run stopped
    return PairsFile(path, settings, total, done=int(rec["done"]), bytes=int(rec["bytes"]), pairs=int(rec["pairs"]),
                     skipped=int(rec["skipped"]), no_signal=int(rec["no_signal"]),
                     reward_sum=float(rec["reward_sum"]), scored=int(rec["samples_scored"]),
                     started=float(rec["started"]))


__all__ = ["PairsFile", "PromptPairs", "VERSION", "meta_path", "open_pairs", "prompt_pairs"]
