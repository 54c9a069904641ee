"""A sweep's spec: a TOML file, or the quick form on the command line (``sweep PRESET --set-grid
train.lr=1e-3,3e-3 ...``); both become one checked :class:`SweepSpec`. The shape follows W&B sweeps' (method,
metric, parameters, early termination), with workbench's own keys (preset, set, corpus, time budget)::

    preset = "cpu-small"
    method = "grid"                 # grid | random | tpe
    trials = 12                     # random and tpe (grid: every point of the grid)
    time_budget = "60s"             # each trial's: trials compare by what they reach in the same time
    set = ["train.eval_interval=50"]
    metric = "val_loss"             # val_loss | val_bpb | val_reward | task:NAME[:METRIC]; or { name, goal }
    pruner = "median"               # median | halving; or { type = "median", startup = 2, shares = [0.25, 0.5, 0.75] }

    [parameters]
    "train.lr" = [1e-3, 3e-3, 1e-2]                   # values
    "train.warmup_iters" = { min = 0, max = 100 }     # a range (random, tpe): integers when both ends are
    "train.muon_lr" = { min = 0.005, max = 0.05, log = true }

The metric left out is the trials' eval: ``val_loss``, or for GRPO trials (``train.objective = "grpo"``) their
held-out prompts' mean reward, ``val_reward`` (maximize); a sweep whose trials mix GRPO and other objectives is
refused (no one metric ranks them), as is a metric the trials do not record.

Every bad key or value is one line naming it (a key that does not exist with its closest name).
"""

from __future__ import annotations

import difflib
import json
import math
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import PresetError, parse_override, resolve_preset
from workbench.config.duration import budget_seconds
from workbench.config.objectives import OBJECTIVES
from workbench.errors import WorkbenchError
from workbench.fs import read_toml
from workbench.plan.run_plan import corpus_values
from workbench.queue.outcome import VAL_LOSS, VAL_REWARD, Metric, parse_metric
from workbench.rundir import sanitize_run_name

METHODS = ("grid", "random", "tpe")
PRUNERS = ("none", "median", "halving")
TOP_KEYS = ("name", "preset", "method", "trials", "time_budget", "seed", "set", "corpus", "metric", "pruner",
            "parameters")
DEFAULT_SHARES = (0.25, 0.5, 0.75)   # the pruner compares trials at these shares of their budget
DEFAULT_STARTUP = 2                   # trials that run to their end before the pruner stops any


class SpecError(WorkbenchError):
    pass


Value = bool | int | float | str


@dataclass(frozen=True)
class Param:
    key: str                               # section.key
    values: tuple[Value, ...] = ()         # the values to try (a grid's axis, or a categorical choice)
    low: float | None = None               # or a range (random, tpe)
    high: float | None = None
    log: bool = False
    integer: bool = False

    def to_dict(self) -> dict[str, Any]:
        if self.values:
            return {"key": self.key, "values": list(self.values)}
        return {"key": self.key, "low": self.low, "high": self.high, "log": self.log, "integer": self.integer}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Param":
        return cls(d["key"], tuple(d.get("values", ())), d.get("low"), d.get("high"), d.get("log", False),
                   d.get("integer", False))

    def describe(self) -> str:
        if self.values:
            return f"{self.key} in {', '.join(toml_literal(v) for v in self.values)}"
        return f"{self.key} in [{self.low:g}, {self.high:g}]{' (log)' if self.log else ''}"


@dataclass(frozen=True)
class SweepSpec:
    name: str
    preset: str
    method: str
    params: tuple[Param, ...]
    trials: int                            # how many trials (grid: the grid's size)
    time_budget: str | None = None
    sets: tuple[str, ...] = ()
    corpus: tuple[str, ...] = ()
    metric: Metric = field(default_factory=lambda: Metric("val_loss", "minimize"))
    pruner: str = "none"
    prune_startup: int = DEFAULT_STARTUP
    prune_shares: tuple[float, ...] = DEFAULT_SHARES
    seed: int = 0
    force: bool = False                    # queue trials whose time budget is too short to buy a complete run

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "preset": self.preset, "method": self.method,
                "params": [p.to_dict() for p in self.params], "trials": self.trials, "time_budget": self.time_budget,
                "sets": list(self.sets), "corpus": list(self.corpus), "metric": self.metric.name,
                "goal": self.metric.goal, "pruner": self.pruner, "prune_startup": self.prune_startup,
                "prune_shares": list(self.prune_shares), "seed": self.seed, "force": self.force}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SweepSpec":
        return cls(d["name"], d["preset"], d["method"], tuple(Param.from_dict(p) for p in d["params"]), d["trials"],
                   d.get("time_budget"), tuple(d.get("sets", ())), tuple(d.get("corpus", ())),
                   Metric(d["metric"], d["goal"]), d.get("pruner", "none"), d.get("prune_startup", DEFAULT_STARTUP),
                   tuple(d.get("prune_shares", DEFAULT_SHARES)), d.get("seed", 0), bool(d.get("force", False)))

    def grid(self) -> list[dict[str, Value]]:
        """Every point of a grid, the first key slowest (the order the trials are numbered in)."""
        points: list[dict[str, Value]] = [{}]
        for p in self.params:
            points = [{**pt, p.key: v} for pt in points for v in p.values]
        return points

    def points(self) -> list[dict[str, Value]] | None:
        """The trials' settings when they are known before any trial runs: a grid's every point; a random search
        over values alone (no range), ``trials`` of the grid's points drawn without replacement by the seed (a
        sampler drawing each value on its own repeated points: 2 of 3 trials alike on a 6-point grid); None for
        a random search over a range and for TPE (Optuna draws them)."""
        if self.method == "grid":
            return self.grid()
        if self.method == "random" and all(p.values for p in self.params):
            return random.Random(self.seed).sample(self.grid(), self.trials)
        return None


def toml_literal(v: Value) -> str:
    """A value as --set takes it (TOML), exactly: a float keeps every digit."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        text = repr(v)
        return text if re.search(r"[.eE]|inf|nan", text) else text + ".0"
    if isinstance(v, int):
        return str(v)
    return json.dumps(v)


def rung_sets(spec: "SweepSpec") -> tuple[str, ...]:
    """A pruned sweep's trials evaluate at its rungs (train.eval_shares), so every trial's value at a rung is an
    eval at that share of its budget (of its steps), however many evals its own plan would have chosen."""
    if spec.pruner == "none":
        return ()
    return (f"train.eval_shares=[{','.join(f'{s:g}' for s in spec.prune_shares)}]",)


def point_sets(point: dict[str, Value]) -> tuple[str, ...]:
    """A trial's --set values."""
    return tuple(f"{k}={toml_literal(v)}" for k, v in point.items())


def _check_key(key: str, value: Value) -> None:
    try:
        parse_override(f"{key}={toml_literal(value)}")
    except PresetError as e:
        why = str(e).split(": ", 1)[-1]
        raise SpecError(f"sweep parameter {key!r}: {why}") from None


def parse_value(key: str, text: str) -> Value:
    """One value of ``--set-grid KEY=V1,V2``, read as TOML (a bare word is a string), as --set reads it."""
    if not text.strip():
        raise SpecError(f"--set-grid {key}: an empty value; give values separated by commas, e.g. {key}=1e-3,3e-3")
    try:
        return parse_override(f"{key}={text.strip()}")[2]
    except PresetError as e:
        raise SpecError(f"--set-grid {key}: {str(e).split(': ', 1)[-1]}") from None


def parse_set_grid(items: list[str]) -> list[Param]:
    """``train.lr=1e-3,3e-3,1e-2`` ... -> grid parameters."""
    params = []
    for item in items:
        if "=" not in item:
            raise SpecError(f"--set-grid {item!r}: expected section.key=v1,v2,..., e.g. train.lr=1e-3,3e-3,1e-2")
        key, rhs = item.split("=", 1)
        key = key.strip()
        values = tuple(parse_value(key, v) for v in rhs.split(","))
        params.append(_values_param(key, values, "--set-grid"))
    return params


def _values_param(key: str, values: tuple, where: str) -> Param:
    if not values:
        raise SpecError(f"{where} {key}: no values to try; give at least one")
    for v in values:
        if not isinstance(v, (bool, int, float, str)):
            raise SpecError(f"{where} {key}: {v!r} is not a single value (a number, true/false or a string)")
        _check_key(key, v)
    if len(set(map(toml_literal, values))) != len(values):
        raise SpecError(f"{where} {key}: a value is given twice ({', '.join(map(toml_literal, values))})")
    return Param(key, tuple(values))


def _range_param(key: str, d: dict, method: str) -> Param:
    unknown = set(d) - {"min", "max", "log", "values"}
    if unknown:
        raise SpecError(f"parameters.{key!r}: unknown field {sorted(unknown)[0]!r}; a range is "
                        "{ min = ..., max = ..., log = true|false }")
    if "values" in d:
        return _values_param(key, tuple(d["values"]), "parameters")
    if method == "grid":
        raise SpecError(f"parameters.{key!r}: a grid takes values (\"{key}\" = [a, b, c]), not a range; use "
                        "method = \"random\" or \"tpe\" for a range")
    lo, hi = d.get("min"), d.get("max")
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float))) or isinstance(lo, bool) \
            or isinstance(hi, bool):
        raise SpecError(f"parameters.{key!r}: a range needs numbers min and max, e.g. {{ min = 1e-4, max = 1e-2 }}")
    if not lo < hi:
        raise SpecError(f"parameters.{key!r}: min {lo} is not below max {hi}")
    log = d.get("log", False)
    if not isinstance(log, bool) or (log and lo <= 0):
        raise SpecError(f"parameters.{key!r}: log = true needs a range above 0 (and log is true or false)")
    integer = isinstance(lo, int) and isinstance(hi, int)
    for v in (lo, hi):
        _check_key(key, v)
    return Param(key, (), float(lo) if not integer else lo, float(hi) if not integer else hi, log, integer)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise SpecError(f"{where} must be a string or a list of strings")


def build_spec(*, name: str, preset: str, method: str = "grid", params: list[Param], trials: int | None = None,
               time_budget: str | None = None, sets: tuple[str, ...] = (), corpus: tuple[str, ...] = (),
               metric: Metric | None = None, pruner: str = "none", prune_startup: int = DEFAULT_STARTUP,
               prune_shares: tuple[float, ...] = DEFAULT_SHARES, seed: int = 0) -> SweepSpec:
    """The checked spec (a SpecError naming the first problem)."""
    try:
        name = sanitize_run_name(name)
    except WorkbenchError as e:
        raise SpecError(f"sweep name: {e}") from None
    if method not in METHODS:
        raise SpecError(f"method {method!r} is not one of {', '.join(METHODS)}{_dym(method, METHODS)}")
    if not params:
        raise SpecError("nothing to search: give parameters (--set-grid train.lr=1e-3,3e-3, or [parameters] "
                        "in the spec)")
    keys = [p.key for p in params]
    if len(set(keys)) != len(keys):
        raise SpecError(f"parameter {next(k for k in keys if keys.count(k) > 1)!r} is given twice")
    fixed = {s.split("=", 1)[0].strip() for s in sets}
    if (both := fixed & set(keys)):
        raise SpecError(f"{sorted(both)[0]} is both searched and set; drop it from --set (or from set)")
    if "train.time_budget" in keys or "train.time_budget" in fixed:
        raise SpecError("give the trials' time budget with --time-budget (time_budget in the spec), not as a "
                        "searched or --set key: every trial gets the same")
    if time_budget is not None:
        try:
            budget_seconds(time_budget)
        except WorkbenchError as e:
            raise SpecError(f"time budget: {e}") from None
    size = math.prod(len(p.values) for p in params) if method == "grid" else None
    if method == "grid":
        if trials is not None and trials != size:
            raise SpecError(f"a grid of {size} points runs {size} trials; drop trials = {trials} (or use "
                            "method = \"random\" to run some of them)")
        trials = size
    if trials is None or trials < 1:
        raise SpecError(f"method {method} needs the number of trials (trials = 12, or --trials 12)")
    if trials > 10_000:
        raise SpecError(f"{trials:,} trials is more than a queue should hold; search fewer points")
    points = math.prod(len(p.values) for p in params)
    if method == "random" and all(p.values for p in params) and trials > points:
        raise SpecError(f"a random search over {points} points cannot draw {trials} different trials; ask for "
                        f"{points} or fewer, or use method = \"grid\"")
    objectives = trial_objectives(preset, tuple(sets), tuple(corpus), params)
    metric = metric or default_metric(objectives)
    if (problem := metric_problem(name, objectives, metric)):
        raise SpecError(problem)
    if pruner not in PRUNERS:
        raise SpecError(f"pruner {pruner!r} is not one of {', '.join(PRUNERS)}{_dym(pruner, PRUNERS)}")
    if pruner != "none":
        if metric.task is not None:
            raise SpecError(f"the pruner compares evals along the way; metric {metric.name} is scored at the end "
                            "only: use val_loss or val_bpb with a pruner")
        if not prune_shares or not all(0 < s < 1 for s in prune_shares):
            raise SpecError("pruner shares must be between 0 and 1, e.g. [0.25, 0.5, 0.75]")
        if prune_startup < 1:
            raise SpecError("pruner startup must be at least 1 trial")
    return SweepSpec(name, preset, method, tuple(params), trials, time_budget, tuple(sets), tuple(corpus), metric,
                     pruner, prune_startup, tuple(sorted(prune_shares)), seed)


def trial_objectives(preset: str, sets: tuple[str, ...], corpus: tuple[str, ...], params: Iterable[Param]
                     ) -> tuple[str, ...]:
    """The train.objective values the sweep's trials train with: a searched train.objective's values, else the
    preset's with the sweep's --set values; () when the preset does not resolve (its trials' admission says why)."""
    searched = next((p for p in params if p.key == "train.objective"), None)
    if searched is not None:
        return tuple(dict.fromkeys(str(v) for v in searched.values))
    try:
        return (resolve_preset(preset, list(sets), corpus_values(corpus)).train.objective,)
    except WorkbenchError:
        return ()


def _grpo(objectives: tuple[str, ...]) -> set[bool]:
    """For each objective known: whether its runs sample (GRPO: their eval is the held-out reward)."""
    return {OBJECTIVES[o].samples for o in objectives if o in OBJECTIVES}


def default_metric(objectives: tuple[str, ...]) -> Metric:
    """What a sweep ranks by when its spec names no metric: GRPO trials' held-out reward, else the val loss."""
    return VAL_REWARD if _grpo(objectives) == {True} else VAL_LOSS


def metric_problem(name: str, objectives: tuple[str, ...], metric: Metric) -> str | None:
    """Why ``metric`` cannot rank trials of these objectives (one line), or None: trials mixing GRPO (ranked by
    the held-out reward) with other objectives (ranked by a loss), GRPO trials by anything but val_reward (they
    record no loss and score no task), other trials by val_reward (they roll out nothing)."""
    kinds = _grpo(objectives)
    grpo = sorted(o for o in objectives if o in OBJECTIVES and OBJECTIVES[o].samples)
    if len(kinds) == 2:
        other = sorted(o for o in objectives if o in OBJECTIVES and not OBJECTIVES[o].samples)
        return (f"sweep {name}: its trials mix train.objective = {', '.join(grpo)} (ranked by the held-out reward, "
                f"val_reward) with {', '.join(other)} (ranked by a loss): no one metric ranks them; sweep each "
                "objective on its own")
    if kinds == {True} and not metric.reward:
        return (f"sweep {name}: its trials are train.objective = {', '.join(grpo)} runs, whose eval is the held-out "
                f"prompts' reward: they record no {metric.name}; rank them by val_reward (the default for GRPO "
                "trials: leave metric out)")
    if kinds == {False} and metric.reward:
        return (f"sweep {name}: metric val_reward is a GRPO run's held-out reward; its trials are "
                f"train.objective = {', '.join(objectives)} runs: rank them by val_loss (the default), val_bpb or "
                "task:NAME")
    return None


def _dym(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_spec(path: Path, name: str | None = None) -> SweepSpec:
    """A spec file, checked; ``name`` (``--name``) over the file's."""
    path = Path(path)
    data = read_toml(path, SpecError, "cannot read the sweep spec {path}: {why}", "{path}: not valid TOML: {why}")
    for k in data:
        if k not in TOP_KEYS:
            raise SpecError(f"{path}: unknown key {k!r}{_dym(k, TOP_KEYS)}; a spec has {', '.join(TOP_KEYS)}")
    if not isinstance(data.get("preset"), str):
        raise SpecError(f"{path}: preset = \"NAME\" is missing (the preset every trial starts from)")
    method = data.get("method", "grid")
    if not isinstance(method, str):
        raise SpecError(f"{path}: method must be one of {', '.join(METHODS)}")
    raw = data.get("parameters", {})
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: [parameters] must be a table of \"section.key\" = [values] or {{ min, max }}")
    params = []
    for key, v in raw.items():
        if isinstance(v, dict) and "." not in key and v:  # train.lr = [...] unquoted: TOML made a table of it
            raise SpecError(f"{path}: parameters: quote the dotted key, \"{key}.{next(iter(v))}\" = [...]")
        if isinstance(v, list):
            params.append(_values_param(key, tuple(v), "parameters"))
        elif isinstance(v, dict):
            params.append(_range_param(key, v, method))
        else:
            params.append(_values_param(key, (v,), "parameters"))
    metric = data.get("metric")
    if metric is None:  # (the trials' own eval: build_spec chooses it)
        pass
    elif isinstance(metric, dict):
        extra = set(metric) - {"name", "goal"}
        if extra:
            raise SpecError(f"{path}: metric has unknown field {sorted(extra)[0]!r}; it takes name and goal")
        metric = parse_metric(metric.get("name") or default_metric(trial_objectives(
            data["preset"], _strings(data.get("set", []), f"{path}: set"),
            _strings(data.get("corpus", []), f"{path}: corpus"), params)).name, metric.get("goal"))
    elif isinstance(metric, str):
        metric = parse_metric(metric)
    else:
        raise SpecError(f"{path}: metric must be a name (val_loss) or {{ name = ..., goal = ... }}")
    pruner = data.get("pruner", "none")
    startup, shares = DEFAULT_STARTUP, DEFAULT_SHARES
    if isinstance(pruner, dict):
        extra = set(pruner) - {"type", "startup", "shares"}
        if extra:
            raise SpecError(f"{path}: pruner has unknown field {sorted(extra)[0]!r}; it takes type, startup, shares")
        startup, shares = pruner.get("startup", startup), tuple(pruner.get("shares", shares))
        pruner = pruner.get("type", "median")
    trials = data.get("trials")
    if trials is not None and (not isinstance(trials, int) or isinstance(trials, bool)):
        raise SpecError(f"{path}: trials must be a whole number")
    budget = data.get("time_budget")
    if budget is not None and not isinstance(budget, (str, int, float)):
        raise SpecError(f"{path}: time_budget must be a duration like \"60s\" or \"5m\"")
    return build_spec(name=name or data.get("name") or path.stem, preset=data["preset"], method=method,
                      params=params, trials=trials, time_budget=None if budget is None else str(budget),
                      sets=_strings(data.get("set", []), f"{path}: set"),
                      corpus=_strings(data.get("corpus", []), f"{path}: corpus"), metric=metric,
                      pruner=str(pruner), prune_startup=startup, prune_shares=shares, seed=int(data.get("seed", 0)))
