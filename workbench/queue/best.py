"""A sweep's best trial kept as a user preset (``workbench sweep save-best NAME [--as PRESET]``, the Queue
pane's ``b``): the base preset with what the trial ran with (the sweep's ``--set`` values, the trial's searched
values, its corpus), from the queue's record of that run, written through config's one writer of user presets.
Never over an existing preset, nor under a shipped preset's name (a user preset of that name would hide it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench.config import (
    PresetError,
    check_preset_name,
    preset_paths,
    preset_to_toml,
    resolve_preset,
    write_user_preset,
)
from workbench.plan.run_plan import corpus_values
from workbench.queue.store import QueueError, QueueStore
from workbench.queue.sweep_results import Result, best, load, results
from workbench.queue.sweep_spec import point_sets, rung_sets


@dataclass(frozen=True)
class SavedBest:
    preset: str          # the new preset's name
    path: Path
    trial: Result        # the best trial
    metric: str          # what it was ranked by


def default_name(sweep: str) -> str:
    return f"{sweep}-best"


def save_best(root: Path, sweep: str, as_name: str | None = None) -> SavedBest:
    """Write the best finished trial of ``sweep`` as the user preset ``as_name`` (default ``SWEEP-best``); a
    QueueError or PresetError (one line) when the sweep has no best trial yet or the name is taken."""
    name = check_preset_name(as_name or default_name(sweep))
    store = QueueStore.open_existing(root, readonly=True)
    if store is None:
        raise QueueError(f"no sweep {sweep!r} in {root}: nothing was ever queued there")
    try:
        spec = load(store, sweep)
        top = best(results(store, sweep))
        if top is None:
            raise QueueError(f"sweep {sweep} has no best trial yet (no trial has finished with {spec.metric.name}); "
                             f"`workbench sweep show {sweep}` shows where it is")
        item = store.get(top.name)
    finally:
        store.close()
    hint = f"choose another name: `workbench sweep save-best {sweep} --as NAME`"
    found = preset_paths().get(name)
    if found and found[1] == "shipped":
        raise PresetError(f"{name!r} is a shipped preset's name (a user preset would hide it); {hint}")
    sets = [s for s in item.sets if s not in rung_sets(spec)]  # (the pruner's rungs: the sweep's, not the trial's)
    p = resolve_preset(item.preset, sets, corpus_values(item.corpus))
    p.name = name
    p.description = (f"the best trial of sweep {sweep}: {top.name} ({' '.join(point_sets(top.params))}), "
                     f"{spec.metric.name} {top.metric:.4f}")
    budget = (f"each trial trained {item.time_budget} (train.time_budget, not kept here: add "
              f"--time-budget {item.time_budget} to train as the trial did)\n" if item.time_budget else "")
    header = (f"saved by `workbench sweep save-best {sweep}`: trial {top.name}, rank 1 of the finished trials by "
              f"{spec.metric.name} ({spec.metric.goal}) = {top.metric:.6g}\n"
              f"its preset {item.preset} with: {' '.join(sets) or '(nothing set)'}\n{budget}")
    text = "".join(f"# {line}\n" for line in header.splitlines()) + preset_to_toml(p)
    path = write_user_preset(name, text, exists_hint=f"it is never overwritten; {hint}")
    return SavedBest(name, path, top, spec.metric.name)
