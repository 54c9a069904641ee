"""The queue's state: ``runs/queue.db``, a SQLite database (WAL; every change one ``BEGIN IMMEDIATE``
transaction), shared by the runner, the ``queue``/``sweep`` commands and the TUI (which opens it read-only).

An item is a run to start: what ``workbench train`` would be given (preset, ``--set``, corpus, time budget,
``--init-from``), its name (reserved when it is added: no run directory and no other item has it), its place
in the line, and its state: ``queued`` → ``running`` → ``finished`` | ``failed`` | ``stopped`` | ``pruned``
(a sweep's trial stopped early by the pruner). A sweep is its spec and its trials, each trial a queued item
(or refused before it was queued, with the reason).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from workbench.config.duration import TimeBudget
from workbench.errors import WorkbenchError
from workbench.queue.sweep_store import SweepRecords
from workbench.queue.sweep_store import Trial as Trial  # noqa: F401 (its importers)
from workbench.queue.sweep_store import trial_name as trial_name
from workbench.rundir import sanitize_run_name

if TYPE_CHECKING:  # (the planner is loaded where a run is planned or started, not with the TUI's queue view)
    from workbench.plan.run_plan import NewRun

DB_FILE = "queue.db"
STATES = ("queued", "running", "finished", "failed", "stopped", "pruned")
ENDED = ("finished", "failed", "stopped", "pruned")
SCHEMA_VERSION = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL UNIQUE,      -- the run's name: its directory under the runs directory
    position    INTEGER NOT NULL,          -- the order queued items start in
    state       TEXT NOT NULL,
    preset      TEXT NOT NULL,             -- a preset name, or an absolute path to a .toml
    sets        TEXT NOT NULL DEFAULT '[]',   -- JSON: the --set values
    corpus      TEXT NOT NULL DEFAULT '[]',   -- JSON: --corpus (absolute paths, globs, builtin)
    time_budget TEXT,
    init_from   TEXT,
    force       INTEGER NOT NULL DEFAULT 0,   -- start even when the estimate says it does not fit (--yes)
    sweep       TEXT,
    trial       INTEGER,
    added       REAL NOT NULL,
    started     REAL,
    ended       REAL,
    pid         INTEGER,                   -- its trainer, once started
    launches    INTEGER NOT NULL DEFAULT 0,   -- starts and resumes by a runner
    note        TEXT,                      -- how it ended: the doctor's line for a failed run, the launcher's error
    metric      REAL,                      -- a sweep trial's metric, read from the run when it ended
    others_cpu  REAL,                      -- other processes' mean share of the CPU while it trained (0-1)
    others      TEXT,                      -- JSON: the busiest of them, and other processes on its GPU
    gpu_free_before REAL,                  -- MiB free on its GPU just before its trainer started (NVML)
    gpu_free_after  REAL                   -- MiB free on its GPU once its trainer's process had exited
);
CREATE TABLE IF NOT EXISTS places (        -- where a started item runs or ran (a table of its own: a queue.db
    item        INTEGER PRIMARY KEY,       -- from before it reads on, without it, as every run's place unknown)
    place       TEXT,                      -- "gpu 0,1", "cpu slot 1/2 (1 thread)"
    gpus        TEXT NOT NULL DEFAULT '[]',   -- JSON: the GPU indices it holds (CUDA_VISIBLE_DEVICES)
    slot        INTEGER                    -- its CPU slot (1..N) on a machine without a GPU
);
CREATE TABLE IF NOT EXISTS flags (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sweeps (
    name     TEXT PRIMARY KEY,
    spec     TEXT NOT NULL,                -- JSON: the checked spec
    created  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
    sweep    TEXT NOT NULL,
    number   INTEGER NOT NULL,             -- 1, 2, ...: the run is <sweep>-t0001, ...
    params   TEXT NOT NULL,                -- JSON: key -> value searched
    item     INTEGER,                      -- its queue item (NULL: refused before it was queued)
    optuna   INTEGER,                      -- Optuna's trial number
    note     TEXT,                         -- why it was refused
    told     INTEGER NOT NULL DEFAULT 0,   -- its result has been given to Optuna
    PRIMARY KEY (sweep, number)
);
"""


# Columns added since a queue.db was first written: an older database gains them when it is opened for writing
# (and reads as if they were empty before that), so a queue made by an older workbench goes on.
ADDED_COLUMNS = {"others_cpu": "REAL", "others": "TEXT",
                 "gpu_free_before": "REAL", "gpu_free_after": "REAL"}
PLACE_FIELDS = ("place", "gpus", "slot")


class QueueError(WorkbenchError):
    pass


@dataclass(frozen=True)
class NewItem:
    """A run to add: ``workbench train``'s arguments (the run request, :meth:`new_run`), and its sweep's."""
    preset: str
    sets: tuple[str, ...] = ()
    corpus: tuple[str, ...] = ()
    time_budget: TimeBudget | None = None
    init_from: str | None = None
    force: bool = False
    name: str | None = None           # None: <preset>-<date>-<time>, made unique
    sweep: str | None = None
    trial: int | None = None

    def new_run(self) -> NewRun:
        """The run request it makes (the run plan's, and the arguments `workbench train` is given)."""
        from workbench.plan.run_plan import NewRun
        return NewRun(self.preset, tuple(self.sets), tuple(self.corpus), self.init_from, time_budget=self.time_budget,
                      name=self.name, force=self.force)


@dataclass(frozen=True)
class Item:
    id: int
    name: str
    position: int
    state: str
    preset: str
    sets: tuple[str, ...]
    corpus: tuple[str, ...]
    time_budget: str | None
    init_from: str | None
    force: bool
    sweep: str | None
    trial: int | None
    added: float
    started: float | None
    ended: float | None
    pid: int | None
    launches: int
    note: str | None
    metric: float | None
    others_cpu: float | None = None          # other processes' mean share of the CPU while it trained
    others: tuple[dict, ...] = ()            # the busiest of them ({pid, name, cpu_share} or {pid, name, gpu})
    gpu_free_before: float | None = None     # MiB free on its GPU just before its trainer started (no GPU: None)
    gpu_free_after: float | None = None      # MiB free on its GPU once its trainer's process had exited
    place: str | None = None                 # where it runs or ran ("gpu 1", "cpu slot 2/2 (1 thread)")
    gpus: tuple[int, ...] = ()               # the GPUs it holds
    slot: int | None = None                  # its CPU slot

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "Item":
        d = dict(row)
        d["sets"], d["corpus"] = tuple(json.loads(d["sets"])), tuple(json.loads(d["corpus"]))
        d["force"] = bool(d["force"])
        d["others"] = tuple(json.loads(d.get("others") or "[]"))
        d["gpus"] = tuple(json.loads(d.get("gpus") or "[]"))
        return cls(**d)

    def new_run(self) -> NewRun:
        """The run request the runner starts it with (its budget was checked when it was added)."""
        from workbench.plan.run_plan import NewRun
        return NewRun(self.preset, self.sets, self.corpus, self.init_from,
                      time_budget=TimeBudget.parse(self.time_budget), name=self.name, force=self.force)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["sets"], d["corpus"], d["gpus"] = list(self.sets), list(self.corpus), list(self.gpus)
        return d


class QueueStore(SweepRecords):
    """The queue database of the runs directory ``root``. ``readonly``: open an existing database without
    writing anything (the TUI); a missing one is an empty queue."""

    def __init__(self, root: Path, readonly: bool = False):
        self.root = Path(root)
        self.path = self.root / DB_FILE
        self.readonly = readonly
        if readonly:
            # mode=ro: this process never writes; WAL readers still see the last committed state
            self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10.0,
                                        isolation_level=None, check_same_thread=False)
        else:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                self.conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=FULL")
                with self._tx():
                    for stmt in SCHEMA.split(";"):
                        if stmt.strip():
                            self.conn.execute(stmt)
                    have = {r[1] for r in self.conn.execute("PRAGMA table_info(items)")}
                    for col, kind in ADDED_COLUMNS.items():
                        if col not in have:
                            self.conn.execute(f"ALTER TABLE items ADD COLUMN {col} {kind}")
                    self.conn.execute("INSERT OR REPLACE INTO flags VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            except sqlite3.DatabaseError as e:
                raise QueueError(f"cannot open the queue database {self.path}: {e}; move it aside to start an "
                                 "empty queue") from None
            except OSError as e:
                raise QueueError(f"cannot create the queue database in {self.root}: {e.strerror}; choose another "
                                 "runs directory with --runs-dir") from None
        self.conn.row_factory = sqlite3.Row

    @classmethod
    def open_existing(cls, root: Path, readonly: bool = True) -> "QueueStore | None":
        """The queue of ``root`` if it has one (None: nothing was ever queued there)."""
        if not (Path(root) / DB_FILE).is_file():
            return None
        try:
            return cls(root, readonly=readonly)
        except sqlite3.Error:
            return None

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE), so a read-then-write cannot race another
        process; rolled back on any error, so nothing is half-written."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # ------------------------------------------------------------------ reading

    def _select(self, where: str = "", params: tuple = ()) -> list[sqlite3.Row]:
        """Items with their places (a database without the places table, opened read-only: places unknown)."""
        try:
            return self.conn.execute("SELECT items.*, places.place, places.gpus, places.slot FROM items LEFT JOIN "
                                     f"places ON places.item = items.id {where}", params).fetchall()
        except sqlite3.OperationalError as e:
            if "places" not in str(e):
                raise
            return self.conn.execute(f"SELECT * FROM items {where}", params).fetchall()

    def items(self, states: tuple[str, ...] | None = None) -> list[Item]:
        """Every item: those that have started, oldest first, then the queued ones in the order they will start."""
        try:
            rows = self._select(
                "ORDER BY CASE items.state WHEN 'queued' THEN 1 ELSE 0 END, "
                "CASE items.state WHEN 'queued' THEN items.position ELSE COALESCE(items.started, items.added) END, "
                "items.id")
        except sqlite3.OperationalError:  # read-only: a database created but not yet given its tables
            return []
        out = [Item.from_row(r) for r in rows]
        return [i for i in out if states is None or i.state in states]

    def find(self, name: str) -> Item | None:
        rows = self._select("WHERE items.name = ?", (name,))
        return Item.from_row(rows[0]) if rows else None

    def by_id(self, item_id: int) -> Item:
        rows = self._select("WHERE items.id = ?", (item_id,))
        if not rows:
            raise QueueError(f"no item {item_id} in the queue (removed)")
        return Item.from_row(rows[0])

    def get(self, name: str) -> Item:
        """The item named ``name``, or one line naming the closest one."""
        item = self.find(name)
        if item is None:
            names = [r[0] for r in self.conn.execute("SELECT name FROM items")]
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise QueueError(f"no run {name!r} in the queue{hint}; `workbench queue ls` lists them")
        return item

    def paused(self) -> bool:
        try:
            row = self.conn.execute("SELECT value FROM flags WHERE key = 'paused'").fetchone()
        except sqlite3.OperationalError:
            return False
        return bool(row and row[0] == "1")

    # ------------------------------------------------------------------ changing

    def _name_taken(self, name: str) -> str | None:
        if self.conn.execute("SELECT 1 FROM items WHERE name = ?", (name,)).fetchone():
            return "the queue has a run of that name"
        if (self.root / name).exists():
            return f"a run directory {self.root / name} exists"
        return None

    def _unique_name(self, base: str) -> str:
        for i in range(1, 10_000):
            name = base if i == 1 else f"{base}-{i}"
            if self._name_taken(name) is None:
                return name
        raise QueueError(f"no free run name like {base!r}; give one with --name")

    def add(self, new: NewItem, *, conn_held: bool = False) -> Item:
        """Queue ``new`` at the end of the line (its name reserved now)."""
        if conn_held:
            return self._add(new)
        with self._tx():
            return self._add(new)

    def _add(self, new: NewItem) -> Item:
        if new.name:
            name = sanitize_run_name(new.name)
            if (why := self._name_taken(name)):
                raise QueueError(f"run name {name!r} is taken ({why}); choose another --name")
        else:
            stem = Path(new.preset).stem if new.preset.endswith(".toml") else new.preset
            name = self._unique_name(sanitize_run_name(f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"))
        pos = self.conn.execute("SELECT COALESCE(MAX(position), 0) + 1 FROM items").fetchone()[0]
        cur = self.conn.execute(
            "INSERT INTO items (name, position, state, preset, sets, corpus, time_budget, init_from, force, sweep, "
            "trial, added) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name, pos, new.preset, json.dumps(list(new.sets)), json.dumps(list(new.corpus)),
             new.time_budget.text if new.time_budget else None,
             new.init_from, int(new.force), new.sweep, new.trial, time.time()))
        assert cur.lastrowid is not None  # (an INSERT's)
        return self.by_id(cur.lastrowid)

    def remove(self, name: str) -> Item:
        """Take a queued or ended item out of the queue (its run directory, if any, is left as it is)."""
        with self._tx():
            item = self.get(name)
            if item.state == "running":
                raise QueueError(f"{name} is running; stop it first with `workbench stop {name}` (the queue then "
                                 "goes on), then remove it")
            if item.sweep:
                self.conn.execute("UPDATE trials SET item = NULL, note = 'removed from the queue' WHERE item = ?",
                                  (item.id,))
            self.conn.execute("DELETE FROM items WHERE id = ?", (item.id,))
            self.conn.execute("DELETE FROM places WHERE item = ?", (item.id,))
        return item

    def move(self, name: str, position: int) -> int:
        """Put queued item ``name`` at ``position`` (1: next to start) among the queued items; returns where it is."""
        with self._tx():
            item = self.get(name)
            if item.state != "queued":
                raise QueueError(f"{name} is {item.state}, not queued: only queued runs can be moved")
            queued = [i.id for i in self.items(("queued",))]
            if position < 1:
                raise QueueError(f"position {position} is not a place in the queue; give 1 (next) to {len(queued)}")
            queued.remove(item.id)
            at = min(position, len(queued) + 1)
            queued.insert(at - 1, item.id)
            # after every started item, in the new order (positions only order the queued ones)
            top = self.conn.execute("SELECT COALESCE(MAX(position), 0) FROM items WHERE state != 'queued'"
                                    ).fetchone()[0]
            for k, iid in enumerate(queued):
                self.conn.execute("UPDATE items SET position = ? WHERE id = ?", (top + 1 + k, iid))
        return at

    def set_paused(self, paused: bool) -> None:
        with self._tx():
            self.conn.execute("INSERT OR REPLACE INTO flags VALUES ('paused', ?)", ("1" if paused else "0",))

    def next_queued(self) -> Item | None:
        """The next item to start (None when the queue is paused or has nothing queued); nothing is changed."""
        if self.paused():
            return None
        rows = self._select("WHERE items.state = 'queued' ORDER BY items.position, items.id LIMIT 1")
        return Item.from_row(rows[0]) if rows else None

    def claim_next(self, only: int | None = None, **fields: Any) -> Item | None:
        """The next queued item, marked running (None when the queue is paused or has nothing queued); ``only``:
        that item, if it is still the next one (another command may have moved or removed it since it was read).
        ``fields``: where it runs (place, gpus, slot), set in the same transaction."""
        with self._tx():
            if self.paused():
                return None
            row = self.conn.execute("SELECT id FROM items WHERE state = 'queued' ORDER BY position, id LIMIT 1"
                                    ).fetchone()
            if row is None or (only is not None and row[0] != only):
                return None
            self.conn.execute("UPDATE items SET state = 'running', started = ?, pid = NULL, note = NULL "
                              "WHERE id = ?", (time.time(), row[0]))
            if fields:
                self._set_place(row[0], fields)
        return self.by_id(row[0])

    def update(self, item_id: int, **fields: Any) -> Item:
        unknown = set(fields) - {f.name for f in dataclasses.fields(Item)}
        if unknown or "id" in fields:
            raise TypeError(f"cannot set {sorted(unknown | ({'id'} & set(fields)))}")
        if "state" in fields and fields["state"] not in STATES:
            raise ValueError(f"state {fields['state']!r}")
        if "others" in fields:
            fields["others"] = json.dumps(list(fields["others"]))
        place = {k: fields.pop(k) for k in PLACE_FIELDS if k in fields}
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx():
            if fields:
                self.conn.execute(f"UPDATE items SET {cols} WHERE id = ?", (*fields.values(), item_id))
            if place:
                self._set_place(item_id, place)
        return self.by_id(item_id)

    def _set_place(self, item_id: int, fields: dict[str, Any]) -> None:
        """Where item ``item_id`` runs (place, gpus, slot), inside the caller's transaction."""
        have = self.conn.execute("SELECT place, gpus, slot FROM places WHERE item = ?", (item_id,)).fetchone()
        now: dict[str, Any] = dict(zip(PLACE_FIELDS, have)) if have else {"place": None, "gpus": "[]", "slot": None}
        now.update(fields)
        if not isinstance(now["gpus"], str):
            now["gpus"] = json.dumps(list(now["gpus"] or ()))
        self.conn.execute("INSERT OR REPLACE INTO places VALUES (?, ?, ?, ?)",
                          (item_id, now["place"], now["gpus"], now["slot"]))
