"""A preset from parsed TOML, validated: each value against its field's type, choices and limits
(``workbench.config.schema``), then the rules between keys; unknown keys are errors. Every failure is a
:class:`PresetError` whose message names the file, the key, the value and what is allowed, and where a
pair of keys conflicts, which one to change. Also the parsers of the list-valued keys (LoRA targets,
chat roles).

This module imports neither torch nor textual.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import fields
from typing import Any, Callable, Iterable, NoReturn

from workbench.config.duration import DurationError
from workbench.config.objectives import key_readers, objective_spec
from workbench.config.schema import SECTIONS, Preset, PresetError


def _type_name(t: Any) -> str:
    return {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
            "str | list[str]": "a string or a list of strings",
            "str | list[float]": "a list of numbers or a comma-separated string of them",
            "list[dict]": "a list of tables"}[t]


def _check_value(where: str, section: str, f: dataclasses.Field, value: Any) -> Any:
    t = f.type if isinstance(f.type, str) else f.type.__name__
    key = f"{section}.{f.name}"
    if t == "bool":
        if not isinstance(value, bool):
            raise PresetError(f"{where}: {key} = {value!r} must be {_type_name(t)}")
    elif t == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise PresetError(f"{where}: {key} = {value!r} must be {_type_name(t)}")
    elif t == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PresetError(f"{where}: {key} = {value!r} must be {_type_name(t)}")
        value = float(value)
    elif t == "str":
        if isinstance(value, bool) and f.metadata["choices"] and str(value).lower() in f.metadata["choices"]:
            value = str(value).lower()  # compile = true is natural TOML
        if key == "train.time_budget" and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = f"{value:g}"  # --time-budget 45 and time_budget = 45 reach here as numbers: minutes, as "45"
        if not isinstance(value, str):
            raise PresetError(f"{where}: {key} = {value!r} must be {_type_name(t)}")
    elif t == "str | list[str]":
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        ok = isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value))
        if not ok:
            raise PresetError(f"{where}: {key} = {value!r} must be {_type_name(t)}")
    elif t == "str | list[float]":
        value = _share_list(where, key, value)
    elif t == "list[dict]":
        value = mixture_list(where, key, value)
    m = f.metadata
    if m["choices"] and value not in m["choices"]:
        raise PresetError(f"{where}: {key} = {value!r} is not one of {', '.join(m['choices'])}")
    if m["min"] is not None:
        lo = m["min"]
        if (value <= lo) if m["min_exclusive"] else (value < lo):
            rel = ">" if m["min_exclusive"] else ">="
            raise PresetError(f"{where}: {key} = {value!r} must be {rel} {lo:g}")
    if m["max"] is not None and value > m["max"]:
        raise PresetError(f"{where}: {key} = {value!r} must be <= {m['max']:g}")
    return value


_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


Bad = Callable[[str], NoReturn]
Fix = Callable[[str, str, Any], str]


def _check_constraints(p: Preset, where: str, user_set: frozenset[str] = frozenset()) -> None:
    """Rules between keys, in named parts (the first broken rule is the message). Where a pair conflicts, the
    message suggests a value for the key the user did not set just now (with --set), since that is the one they
    did not mean to change."""
    def bad(msg: str) -> NoReturn:
        raise PresetError(f"{where}: {msg}")

    def fix(chosen: str, other: str, value: Any) -> str:
        """'; set train.warmup_iters = 5 (--set train.warmup_iters=5)' for the key to change."""
        key = other if chosen in user_set and other not in user_set else chosen if other in user_set else other
        v = value[key] if isinstance(value, dict) else value
        return f"; set {key} = {v} (--set {key}={v})"

    _model_rules(p, bad, user_set)
    _schedule_rules(p, bad, fix)
    _data_rules(p, bad, user_set)
    _objective_rules(p, bad)
    m, h = p.model, p.hardware
    if m.vocab_size > 2**31:
        bad(f"model.vocab_size = {m.vocab_size} is too large")
    if not _DEVICE_RE.match(h.device):
        bad(f"hardware.device = {h.device!r} must be auto, cpu, cuda, cuda:N or mps")


def _model_rules(p: Preset, bad: Bad, user_set: frozenset[str]) -> None:
    """The model's shape (heads, GQA, RoPE) and LoRA's adapters on it."""
    m, t = p.model, p.train
    if m.dim % m.n_heads and not m.head_size:
        bad(f"model.dim = {m.dim} must be divisible by model.n_heads = {m.n_heads} "
            f"(e.g. n_heads = {_nearest_divisor(m.dim, m.n_heads)})")
    if m.n_heads % m.n_kv_heads:
        bad(f"model.n_heads = {m.n_heads} must be divisible by model.n_kv_heads = {m.n_kv_heads} "
            f"(e.g. n_kv_heads = {_nearest_divisor(m.n_heads, m.n_kv_heads)})")
    if m.head_dim % 2:
        what = "model.head_size" if m.head_size else "head dim = model.dim / model.n_heads"
        bad(f"{what} = {m.head_dim} must be even for RoPE")
    if t.finetune == "lora":
        if t.lora_rank > m.dim:
            bad(f"train.lora_rank = {t.lora_rank} must be at most model.dim = {m.dim} (a low-rank adapter; "
                "8-64 is usual)")
        unknown = [x for x in lora_target_list(t.lora_targets) if x not in LORA_TARGETS]
        if unknown or not lora_target_list(t.lora_targets):
            bad(f"train.lora_targets = {t.lora_targets!r}: {', '.join(unknown) or 'none given'} is not a projection; "
                f"choose from {', '.join(LORA_TARGETS)}")
        if t.optimizer == "muon" and "train.optimizer" in user_set:  # a preset's own Muon: the fine-tune takes AdamW
            bad("train.optimizer = muon does not apply to LoRA adapters (low-rank factors, not whole matrices); "
                "use train.optimizer = adamw with train.finetune = lora")


def _schedule_rules(p: Preset, bad: Bad, fix: Fix) -> None:
    """Warmup, the learning rates and the decay against each other."""
    t = p.train
    # with a time budget max_iters is not the run's length (its warmup is a share of the steps the budget buys)
    if t.warmup_iters >= t.max_iters and t.time_budget_s is None:
        bad(f"train.warmup_iters = {t.warmup_iters} must be < train.max_iters = {t.max_iters}"
            + fix("train.max_iters", "train.warmup_iters", {"train.warmup_iters": max(0, t.max_iters // 10),
                                                            "train.max_iters": t.warmup_iters * 2 or 1}))
    if t.min_lr > t.lr:
        bad(f"train.min_lr = {t.min_lr:g} must be <= train.lr = {t.lr:g}"
            + fix("train.lr", "train.min_lr", {"train.min_lr": f"{t.lr / 10:g}", "train.lr": f"{t.min_lr:g}"}))
    if t.lr_decay_iters and t.lr_decay_iters <= t.warmup_iters:
        bad(f"train.lr_decay_iters = {t.lr_decay_iters} must be > train.warmup_iters = {t.warmup_iters} "
            "(or 0 for max_iters)"
            + fix("train.lr_decay_iters", "train.warmup_iters", {"train.warmup_iters": t.lr_decay_iters // 10,
                                                                 "train.lr_decay_iters": 0}))


def _data_rules(p: Preset, bad: Bad, user_set: frozenset[str]) -> None:
    """Chat roles, the time budget's duration, loss_on against the data's format."""
    t = p.train
    try:
        chat_role_map(p.data.chat_roles)
    except PresetError as e:
        bad(str(e))
    try:
        t.time_budget_s  # parsed to check it (DurationError says how to write one)
    except DurationError as e:
        bad(str(e))
    if "train.loss_on" in user_set and p.data.format == "text":
        bad(f"train.loss_on = {t.loss_on} applies to chat data, but data.format = text; set data.format = chat "
            "(or auto) for conversations")


def _objective_rules(p: Preset, bad: Bad) -> None:
    """What the objective's row of the table (config.objectives) allows: its own keys, a reward, the model and
    hardware it runs with."""
    m, t, h = p.model, p.train, p.hardware
    objective = objective_spec(t.objective)
    if t.dpop_lambda and "dpop_lambda" not in objective.keys:
        bad(f"train.dpop_lambda = {t.dpop_lambda:g} is DPOP's penalty on DPO's chosen answers, but train.objective = "
            f"{t.objective}; set train.objective = {' or '.join(key_readers('dpop_lambda'))} (or "
            "train.dpop_lambda = 0)")
    if objective.takes_reward and not t.reward.strip():
        bad(f"train.objective = {t.objective} learns from a reward of its own samples, and train.reward is not set; "
            "set train.reward = exact:answer (or regex:, contains:, length:, lexicon:, FILE.py:FUNCTION) "
            "(--set train.reward=exact:answer)")
    if t.reward.strip() and not objective.takes_reward:
        bad(f"train.reward = {t.reward!r} scores samples, but train.objective = {t.objective} trains on given data; "
            f"set train.objective = {' or '.join(key_readers('reward'))} (or train.reward = '')")
    if objective.samples and t.grpo_max_new_tokens and t.grpo_max_new_tokens >= m.seq_len:
        bad(f"train.grpo_max_new_tokens = {t.grpo_max_new_tokens} must be < model.seq_len = {m.seq_len} (a prompt "
            f"and its completion share one window); set train.grpo_max_new_tokens = {max(1, m.seq_len // 2)} "
            f"(--set train.grpo_max_new_tokens={max(1, m.seq_len // 2)})")
    if objective.samples and h.nproc > 1 and h.shard:  # each rank rolls out its prompts with the whole model
        bad(f"train.objective = {t.objective} runs on several processes with DDP, not sharded: set "
            "hardware.shard = false (--set hardware.shard=false) or hardware.nproc = 1")
    if objective.preference or objective.samples:
        if m.dropout > 0:
            bad(f"train.objective = {t.objective} trains without dropout (its reference and the step-0 check need a "
                f"forward that gives the same log-probs twice, as TRL's disable_dropout); set model.dropout = 0 "
                f"(--set model.dropout=0)")
        if t.pref_reference == "precompute" and objective.reference and objective.no_precompute:
            bad(f"train.pref_reference = precompute cannot serve {t.objective}: {objective.no_precompute}; set "
                "train.pref_reference = live (or auto)")
        if h.shard:
            bad(f"train.objective = {t.objective} is not supported with hardware.shard = true (FSDP2) yet; use "
                "hardware.shard = false (DDP)")


# LoRA target names: workbench's projection names, Hugging Face's, and the two groups.
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "attention": ("wq", "wk", "wv", "wo"), "mlp": ("w1", "w2", "w3"),
    **{n: (n,) for n in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")},
    "q_proj": ("wq",), "k_proj": ("wk",), "v_proj": ("wv",), "o_proj": ("wo",),
    "gate_proj": ("w1",), "up_proj": ("w3",), "down_proj": ("w2",),
}


def chat_role_map(roles: str | list[str]) -> dict[str, str]:
    """data.chat_roles as {name: role}; a PresetError for an entry that is not name=role of a known role."""
    out = {}
    for item in lora_target_list(roles):
        name, eq, role = item.partition("=")
        if not eq or not name or role not in ("system", "user", "assistant"):
            raise PresetError(f"data.chat_roles entry {item!r} must be name=role, the role one of system, user, "
                              "assistant (e.g. 'bot=assistant')")
        out[name] = role
    return out


def _share_list(where: str, key: str, value: Any) -> str | list[float]:
    """A list of shares in (0, 1), from a number, a list of numbers or "0.25,0.5" (sorted, without repeats);
    '' or [] stays '' (none)."""
    items: list[Any]
    if isinstance(value, str):
        items = [v for v in re.split(r"[,\s]+", value.strip()) if v]
    elif isinstance(value, list):
        items = value
    else:
        items = [value]
    shares = []
    for v in items:
        try:
            x = float(v) if not isinstance(v, bool) else None
        except (TypeError, ValueError):
            x = None
        if x is None or not 0 < x < 1:
            raise PresetError(f"{where}: {key} = {value!r}: {v!r} is not a share between 0 and 1 (exclusive); "
                              f"give e.g. {key.split('.')[1]} = [0.25, 0.5]")
        shares.append(x)
    return sorted(set(shares)) or ""


_SOURCE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,39}$")
_SOURCE_KEYS = ("name", "corpus", "weight", "max_repeat")


def mixture_list(where: str, key: str, value: Any) -> list[dict]:
    """data.mixture's tables, checked: each a name (letters, digits, _ . -; unique), a corpus (a path, glob or a
    list of them, or builtin), a weight >= 0 and a max_repeat >= 0 (0: no limit); some weight above 0. Returns them
    with every key (max_repeat 0 where not given)."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise PresetError(f"{where}: {key} must be [[data.mixture]] tables of name, corpus, weight (and max_repeat)")
    out: list[dict] = []
    for i, src in enumerate(value):
        what = f"{where}: {key} source {src.get('name', i + 1)!r}"
        unknown = [k for k in src if k not in _SOURCE_KEYS]
        if unknown:
            raise PresetError(f"{what}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], _SOURCE_KEYS)}; a source "
                              f"has {', '.join(_SOURCE_KEYS)}")
        missing = [k for k in ("name", "corpus", "weight") if k not in src]
        if missing:
            raise PresetError(f"{what} has no {missing[0]}; give name, corpus and weight, e.g. "
                              "{ name = \"code\", corpus = \"code/*.py\", weight = 0.3 }")
        name, corpus, weight, cap = src["name"], src["corpus"], src["weight"], src.get("max_repeat", 0)
        if not isinstance(name, str) or not _SOURCE_NAME.match(name):
            raise PresetError(f"{what}: name must be letters, digits, _ . or - (up to 40), e.g. code")
        if name in (o["name"] for o in out):
            raise PresetError(f"{what}: the name {name!r} is given twice; name each source once")
        if isinstance(corpus, list) and len(corpus) == 1:
            corpus = corpus[0]
        if not ((isinstance(corpus, str) and corpus) or (isinstance(corpus, list) and corpus
                                                        and all(isinstance(c, str) and c for c in corpus))):
            raise PresetError(f"{what}: corpus = {corpus!r} must be a path, a glob, a list of them, or builtin")
        for k, v in (("weight", weight), ("max_repeat", cap)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise PresetError(f"{what}: {k} = {v!r} must be a number >= 0"
                                  + (" (0 leaves the source out)" if k == "weight" else " (0: no limit)"))
        out.append({"name": name, "corpus": corpus, "weight": float(weight), "max_repeat": float(cap)})
    if out and not any(o["weight"] > 0 for o in out):
        raise PresetError(f"{where}: {key}: every weight is 0; give at least one source a weight above 0")
    return out


def eval_share_list(value: str | list[float]) -> tuple[float, ...]:
    """train.eval_shares as validated (a list of shares, or '' for none) -> a tuple."""
    return tuple(value) if isinstance(value, list) else ()


def lora_target_list(targets: str | list[str]) -> list[str]:
    """train.lora_targets as a list of the names given (a comma- or space-separated string, or a list)."""
    items = targets if isinstance(targets, list) else [targets]
    return [x for item in items for x in item.replace(",", " ").split()]


def lora_projections(targets: str | list[str]) -> tuple[str, ...]:
    """The workbench projections (wq, ..., w3) that train.lora_targets names, in a fixed order."""
    want = {p for x in lora_target_list(targets) for p in LORA_TARGETS.get(x, ())}
    return tuple(p for p in LORA_TARGETS["attention"] + LORA_TARGETS["mlp"] if p in want)


def _nearest_divisor(n: int, near: int) -> int:
    divs = [d for d in range(1, n + 1) if n % d == 0]
    return min(divs, key=lambda d: (abs(d - near), d))


def preset_from_dict(data: dict[str, Any], where: str = "preset", name: str | None = None,
                     user_set: frozenset[str] = frozenset()) -> Preset:
    """Build and validate a Preset from parsed TOML. Unknown keys are errors. ``user_set``: the keys
    given with --set just now (conflict messages then suggest changing the other key of a pair)."""
    kwargs: dict[str, Any] = {}
    top_known = set(SECTIONS) | {"name", "description", "parent", "init", "source"}
    for key, value in data.items():
        if key not in top_known:
            hint = did_you_mean(key, top_known)
            raise PresetError(f"{where}: unknown key {key!r}{hint}; allowed top-level keys: "
                              f"{', '.join(sorted(top_known))}")
        if key in ("name", "description"):
            if not isinstance(value, str):
                raise PresetError(f"{where}: {key} = {value!r} must be a string")
            kwargs[key] = value
        if key in ("parent", "init"):
            # [init] may say the source carried LoRA adapters (merged into the run's init weights): adapter = true
            extra = {"adapter"} if key == "init" else set()
            ok = (isinstance(value, dict) and {"run", "step"} <= set(value) <= {"run", "step"} | extra
                  and isinstance(value["run"], str) and isinstance(value["step"], int)
                  and not isinstance(value["step"], bool) and value["step"] >= 0
                  and isinstance(value.get("adapter", False), bool))
            if not ok:
                raise PresetError(f"{where}: [{key}] must hold run (a run id) and step (a step number), "
                                  f"got {value!r}")
            kwargs[key] = dict(value)
        if key == "source":
            ok = isinstance(value, dict) and isinstance(value.get("model"), str) and all(
                isinstance(v, (str, int, float, bool)) for v in value.values())
            if not ok:
                raise PresetError(f"{where}: [source] must hold model (where the weights came from) and plain "
                                  f"values, got {value!r}")
            kwargs[key] = dict(value)
    for sec, cls in SECTIONS.items():
        raw = data.get(sec, {})
        if not isinstance(raw, dict):
            raise PresetError(f"{where}: [{sec}] must be a table, got {raw!r}")
        known = {f.name: f for f in fields(cls)}
        vals = {}
        for key, value in raw.items():
            if key not in known:
                hint = did_you_mean(key, known)
                raise PresetError(f"{where}: unknown key {sec}.{key}{hint}; see `workbench presets show` for the keys")
            # a value given with --set is blamed on --set, not on the preset file it was applied to
            vals[key] = _check_value("--set" if f"{sec}.{key}" in user_set else where, sec, known[key], value)
        kwargs[sec] = cls(**vals)
    if name is not None:
        kwargs["name"] = name
    p = Preset(**kwargs)
    _check_constraints(p, where, user_set)
    return p


def did_you_mean(key: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
