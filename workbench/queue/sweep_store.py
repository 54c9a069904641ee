"""A sweep's records in the queue's database (``runs/queue.db``): its spec (the ``sweeps`` table) and its trials
(``trials``), each a queued item of the queue or refused before it was queued, with the reason. A mixin of
:class:`workbench.queue.store.QueueStore`, which owns the connection, the transactions and the items: a trial is
queued as an item in the same transaction as its record."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.queue.store import Item, NewItem


@dataclass(frozen=True)
class Trial:
    sweep: str
    number: int
    params: dict[str, Any]
    item: int | None
    optuna: int | None
    note: str | None
    told: bool


def trial_name(sweep: str, number: int) -> str:
    return f"{sweep}-t{number:04d}"


class SweepRecords:
    """The sweeps and their trials (see the module); the host class gives ``conn``, ``root``, ``_tx`` and
    ``_add``."""
    conn: sqlite3.Connection
    root: Path

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _add(self, new: NewItem) -> Item:
        raise NotImplementedError

    def sweep_names(self) -> list[str]:
        try:
            return [r[0] for r in self.conn.execute("SELECT name FROM sweeps ORDER BY created")]
        except sqlite3.OperationalError:
            return []

    def sweep_spec(self, name: str) -> dict | None:
        row = self.conn.execute("SELECT spec FROM sweeps WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row else None

    def name_in_use(self, name: str) -> str | None:
        """Why ``name`` cannot name a new sweep (None: it can)."""
        if self.sweep_spec(name) is not None:
            return f"a sweep named {name!r} exists (`workbench sweep show {name}`)"
        row = self.conn.execute("SELECT name FROM items WHERE name LIKE ? ESCAPE '\\' LIMIT 1",
                                (name.replace("_", "\\_").replace("%", "\\%") + "-t%",)).fetchone()
        if row:
            return f"the queue has a run {row[0]!r}"
        if any(self.root.glob(f"{name}-t[0-9][0-9][0-9][0-9]")):
            return f"run directories {name}-t0001... exist in {self.root}"
        return None

    def add_sweep(self, name: str, spec: dict, trials: list[tuple[dict, NewItem | None, int | None, str | None]]
                  ) -> list[Trial]:
        """The sweep and its first trials, in one transaction: (params, the run to queue or None when refused,
        Optuna's trial number, why refused)."""
        with self._tx():
            if (why := self.name_in_use(name)):
                from workbench.queue.store import QueueError  # (store imports this module)
                raise QueueError(f"sweep name {name!r} is taken: {why}; choose another --name")
            self.conn.execute("INSERT INTO sweeps VALUES (?, ?, ?)", (name, json.dumps(spec), time.time()))
            for params, new, optuna_no, note in trials:
                self._add_trial(name, params, new, optuna_no, note)
        return self.trials(name)

    def add_trial(self, sweep: str, params: dict, new: NewItem | None, optuna_no: int | None,
                  note: str | None) -> Trial:
        with self._tx():
            return self._add_trial(sweep, params, new, optuna_no, note)

    def _add_trial(self, sweep: str, params: dict, new: NewItem | None, optuna_no: int | None,
                   note: str | None) -> Trial:
        number = self.conn.execute("SELECT COALESCE(MAX(number), 0) + 1 FROM trials WHERE sweep = ?",
                                   (sweep,)).fetchone()[0]
        item_id = None
        if new is not None:
            new = dataclasses.replace(new, name=trial_name(sweep, number), sweep=sweep, trial=number)
            item_id = self._add(new).id
        self.conn.execute("INSERT INTO trials VALUES (?, ?, ?, ?, ?, ?, ?)",
                          (sweep, number, json.dumps(params), item_id, optuna_no, note, 0))
        return Trial(sweep, number, params, item_id, optuna_no, note, False)

    def trials(self, sweep: str) -> list[Trial]:
        rows = self.conn.execute("SELECT * FROM trials WHERE sweep = ? ORDER BY number", (sweep,)).fetchall()
        return [Trial(r["sweep"], r["number"], json.loads(r["params"]), r["item"], r["optuna"], r["note"],
                      bool(r["told"])) for r in rows]

    def mark_told(self, sweep: str, number: int) -> None:
        with self._tx():
            self.conn.execute("UPDATE trials SET told = 1 WHERE sweep = ? AND number = ?", (sweep, number))
