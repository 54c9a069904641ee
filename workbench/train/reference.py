"""A precomputed reference (``train.pref_reference``, :mod:`workbench.plan.recipe.objective_plan` chose it): the
reference's log-prob of every answer, computed once before training and kept with the prepared data
(:mod:`workbench.data.preference.reference_table`), then read beside each batch instead of a frozen copy's forward.

The pass runs the **policy itself before its first update** (a fresh run: it holds the starting weights; a resume
loads them, ``init/model.pt``, before its checkpoint's): eval mode, no gradient, the run's autocast, in chunks of
the rows of one training forward (two rows a pair), so no second copy of the weights is ever resident. At each
start, fresh or resumed, a sample of rows (:data:`CHECK_ROWS`, drawn from the seed) is computed again the same way
and compared with the table: a difference above :data:`CHECK_TOLERANCE` nats refuses to start, one line.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from workbench.data.preference.preference_data import PreferenceData
from workbench.data.preference.reference_table import (
    ReferenceTableError,
    clean_temporaries,
    file_digest,
    open_table,
    table_facts,
    table_paths,
    write_table,
)
from workbench.data.text.prepare import _locked
from workbench.fmt import duration
from workbench.train.dist import Dist

CHECK_ROWS = 64           # rows of the table computed again at each start
CHECK_TOLERANCE = 1e-3    # nats: the most a cached summed log-prob may differ from the live one


@torch.no_grad()
def reference_logps(model: torch.nn.Module, data: PreferenceData, convs: np.ndarray, seq_len: int, chunk: int,
                    device: torch.device, autocast: contextlib.AbstractContextManager) -> Iterator[np.ndarray]:
    """The summed log-prob of each conversation of ``convs``' answer under ``model``, ``chunk`` rows a forward (the
    last chunk padded to the same shape, so every forward is the same shape and a row's value does not depend on
    where it falls), yielded chunk by chunk."""
    was = model.training
    model.eval()
    try:
        for lo in range(0, len(convs), chunk):
            part = [int(c) for c in convs[lo:lo + chunk]]
            x, y = data.rows(part + [part[-1]] * (chunk - len(part)), seq_len)
            with autocast:
                _, lp = model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device), logps=True)
            yield lp.sum(-1)[:len(part)].float().cpu().numpy()
    finally:
        model.train(was)


def precompute_reference(model: torch.nn.Module, data: PreferenceData, init_path: Path, seq_len: int, chunk: int,
                         precision: str, device: torch.device, autocast: contextlib.AbstractContextManager,
                         dist: Dist, seed: int, log: Callable[[str], None]) -> Path:
    """Open the table for ``data`` (computing it first when there is none: rank 0 writes it, under the prepared
    data's lock; the other ranks wait), check :data:`CHECK_ROWS` of its rows against ``model`` (which must hold the
    reference weights now), and hand it to ``data``'s samplers. Returns where it is."""
    assert data.dir is not None, "a prepared preference corpus knows its directory"
    rows = len(data.offsets) - 1
    facts = table_facts(data.dir.name, file_digest(init_path), seq_len, precision, device.type)
    path = table_paths(data.dir, facts)[0]
    if dist.is_main:
        opened = open_table(data.dir, facts, rows)
        if opened is None:
            with _locked(data.dir / "reference.lock", log):
                if open_table(data.dir, facts, rows) is None:  # else computed while we waited
                    clean_temporaries(data.dir)
                    log(f"reference: computing the log-prob of each of {rows:,} answers once ({chunk} a forward) "
                        f"into {path} ...")
                    t0 = time.time()
                    every = np.arange(rows)
                    write_table(data.dir, facts, rows,
                                reference_logps(model, data, every, seq_len, chunk, device, autocast),
                                {"chunk_rows": chunk, "seconds": round(time.time() - t0, 2)})
                    log(f"reference: {rows:,} answers scored in {duration(time.time() - t0)}")
    dist.broadcast(None)  # the others wait for rank 0's table
    opened = open_table(data.dir, facts, rows)
    if opened is None:
        raise ReferenceTableError(f"the precomputed reference log-probs {path} are not there (another node's cache "
                                  "directory?); set WORKBENCH_CACHE_DIR to a directory every rank shares, or --set "
                                  "train.pref_reference=live")
    table, side = opened
    check_table(model, data, table, path, seq_len, int(side.get("chunk_rows", chunk)), device, autocast, seed)
    data.reference = table
    return path


def check_table(model: torch.nn.Module, data: PreferenceData, table: np.ndarray, path: Path, seq_len: int,
                chunk: int, device: torch.device, autocast: contextlib.AbstractContextManager, seed: int) -> None:
    """Compute :data:`CHECK_ROWS` random rows (all, if fewer) again with ``model`` and compare them with ``table``;
    a ReferenceTableError naming the worst row when one differs by more than :data:`CHECK_TOLERANCE`."""
    rows = len(table)
    sample = np.sort(np.random.default_rng([seed, rows]).choice(rows, size=min(CHECK_ROWS, rows), replace=False))
    live = np.concatenate(list(reference_logps(model, data, sample, seq_len, chunk, device, autocast)))
    cached = np.asarray(table[sample], dtype=np.float64)
    delta = np.abs(live.astype(np.float64) - cached)
    worst = int(np.argmax(delta))
    if not delta[worst] <= CHECK_TOLERANCE:  # NaN fails too
        raise ReferenceTableError(
            f"the precomputed reference log-probs {path} do not match the reference model: answer {sample[worst]} "
            f"is {cached[worst]:.4f} cached but {live[worst]:.4f} computed now (|delta| {delta[worst]:.2e} > "
            f"{CHECK_TOLERANCE:g} nats, the worst of {len(sample)} rows checked): remove them (rm "
            f"{path.with_suffix('')}.*) and the next start computes them again, or --set train.pref_reference=live")


__all__ = ["CHECK_ROWS", "CHECK_TOLERANCE", "check_table", "precompute_reference", "reference_logps"]
