"""The queue as the run doctor and the TUI's health box see it (``look``, read-only: the database opened
read-only, the runner's lock only looked at):

- ``QueueLook.line``     one line for the queue: what runs (its step), how many wait, paused, whether a runner
                         is at work: ``1 running (sw-t0002, step 40/100), 3 queued; no runner: ...``
- ``QueueLook.about``    one line for a run that is a queue item or a sweep's trial: its place (``queued at
                         position 2 of 3``), how it ended in the queue (``pruned by the sweep's median rule: ...``,
                         ``failed in the queue: ...``), a trial refused before it was queued, the flag of one
                         that trained beside other processes
- ``QueueLook.findings`` the runs directory's finding: runs wait (or one was interrupted) and no runner is at
                         work (``queue.no_runner``), or a runner waits on a paused queue (``queue.paused``)

The doctor itself (``workbench.analysis.doctor``) is below the queue and never imports it; ``workbench doctor``
and the health box add what this says to what it finds.
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbench.analysis.doctor import Finding
from workbench.queue.runner import runner_pid
from workbench.queue.store import QueueError, QueueStore, trial_name
from workbench.queue.sweep_spec import point_sets
from workbench.queue.view import Row, rows

PRUNE_RULES = {"median": "median", "halving": "successive-halving"}
NAMED = 3          # the waiting runs a finding names; the rest are counted
START_CLI = "`workbench queue run` starts one"
START_TUI = "r in the Queue tab (7) starts one"
REMOVED = "removed from the queue"   # the store's note on a trial taken out of the queue


@dataclass(frozen=True)
class QueueLook:
    """The queue of a runs directory, read in one go."""
    rows: list[Row]
    paused: bool
    runner: int | None                       # the runner's pid; None: no runner
    sweeps: dict[str, dict] = field(default_factory=dict)   # sweep -> its spec (metric, goal, pruner)
    params: dict[str, dict] = field(default_factory=dict)   # a trial's run name -> its searched values
    refused: dict[str, str] = field(default_factory=dict)   # a trial never queued: run name -> why

    @property
    def running(self) -> list[Row]:
        return [r for r in self.rows if r.state in ("running", "interrupted")]

    @property
    def queued(self) -> list[Row]:
        return [r for r in self.rows if r.state == "queued"]

    def line(self, tui: bool = False) -> str | None:
        """What runs, what waits and who starts it (None: nothing runs or waits and no runner is at work);
        ``tui``: how to start a runner there (r in the Queue tab) rather than on the command line."""
        if not self.running and not self.queued and not self.runner:
            return None
        parts = []
        for r in self.running:
            where = f"step {r.progress()}" if r.step is not None else "starting"
            parts.append(f"{r.name} interrupted" if r.state == "interrupted" else f"1 running ({r.name}, {where})")
        parts.append(f"{len(self.queued)} queued" + (" (paused)" if self.paused else ""))
        if self.runner:
            runner = f"runner pid {self.runner}"
        else:
            runner = f"no runner: {START_TUI if tui else START_CLI}"
        return ", ".join(parts) + "; " + runner

    def waiting_without_runner(self) -> bool:
        """Runs wait to start (or to be resumed) and nothing will start them."""
        return not self.runner and bool(self.queued or [r for r in self.running if r.state == "interrupted"])

    def state_of(self, name: str) -> str | None:
        """The run's state in the queue (``interrupted`` as the listing says it; ``refused``, ``removed``: a trial
        no longer or never queued); None: not in the queue."""
        row = next((r for r in self.rows if r.name == name), None)
        if row is not None:
            return row.state
        if name in self.refused:
            return "removed" if self.refused[name] == REMOVED else "refused"
        return None

    def about(self, name: str) -> str | None:
        """The run ``name`` in the queue, one line (None: it never was a queue item or a sweep's trial)."""
        row = next((r for r in self.rows if r.name == name), None)
        if row is None:
            why = self.refused.get(name)
            if why is None:
                return None
            return self._what(name) + (why if why == REMOVED else f"refused before it was queued: {why}")
        it = row.item
        if row.state == "queued":
            state = f"queued at position {row.position} of {len(self.queued)}" + (
                "; the queue is paused (`workbench queue resume`)" if self.paused else "")
        elif row.state == "running":
            since = time.strftime("%H:%M", time.localtime(it.started)) if it.started else "?"
            state = (f"running in the queue since {since}" + (f", at step {row.progress()}" if row.step else "")
                     + (f" (launch {it.launches})" if it.launches > 1 else "")
                     + (f"; the runner (pid {self.runner}) watches it" if self.runner else
                        "; no runner watches it: `workbench queue run` adopts it and records its end"))
        elif row.state == "interrupted":
            state = f"interrupted in the queue: {row.note}"
        elif row.state == "pruned":
            rule = PRUNE_RULES.get(self.sweeps.get(it.sweep or "", {}).get("pruner", ""), "pruning")
            state = f"pruned by the sweep's {rule} rule: {row.note or 'no reason recorded'}"
        elif row.state == "finished":
            state = "finished in the queue" + self._reached(row)
        else:   # failed, stopped
            state = f"{row.state} in the queue" + (f": {row.note}" if row.note else "")
        beside = f"; {row.beside} (not comparable with runs that had the machine to themselves)" if row.beside else ""
        return self._what(name) + state + beside

    def _what(self, name: str) -> str:
        """"trial 2 of sweep sw (train.lr=0.003): " for a sweep's trial, "" for another run."""
        m = re.fullmatch(r"(.+)-t(\d{4,})", name)
        if m and m.group(1) in self.sweeps:
            settings = " ".join(point_sets(self.params.get(name, {})))
            return f"trial {int(m.group(2))} of sweep {m.group(1)}" + (f" ({settings})" if settings else "") + ": "
        return ""

    def _reached(self, row: Row) -> str:
        """": val_loss 3.5000, 1st of 2 finished" for a trial, ": val_loss 3.9876" for another run."""
        it = row.item
        if it.metric is None:
            return ""
        spec = self.sweeps.get(it.sweep or "", {})
        out = f": {spec.get('metric', 'val_loss')} {it.metric:.4f}"
        if it.sweep:
            peers = sorted(r.item.metric for r in self.rows if r.item.sweep == it.sweep and r.state == "finished"
                           and r.item.metric is not None)
            if spec.get("goal") == "maximize":
                peers.reverse()
            out += f", rank {peers.index(it.metric) + 1} of {len(peers)} finished"
        return out

    def findings(self) -> list[Finding]:
        """What the queue of this runs directory needs: a runner, or to be resumed."""
        waiting = self.queued + [r for r in self.running if r.state == "interrupted"]
        named = ", ".join(r.name for r in waiting[:NAMED]) + (f" and {len(waiting) - NAMED} more"
                                                               if len(waiting) > NAMED else "")
        if self.waiting_without_runner():
            n = len(waiting)
            also = ("the queue is paused: `workbench queue resume` lets the runner start them",) if self.paused else ()
            return [Finding("queue", "queue.no_runner", "medium",
                            f"{n} run{'s' if n != 1 else ''} queued and no runner: `workbench queue run`",
                            (f"waiting: {named}", "no queue runner holds the runs directory's queue.lock"),
                            "workbench queue run --detach", command="workbench queue run --detach", also=also,
                            data={"queued": len(self.queued), "interrupted": n - len(self.queued)})]
        if self.paused and self.queued and self.runner:
            return [Finding("queue", "queue.paused", "low",
                            f"the queue is paused: {len(self.queued)} run(s) wait and its runner starts nothing",
                            (f"waiting: {named}", f"runner pid {self.runner}"), "workbench queue resume",
                            command="workbench queue resume", data={"queued": len(self.queued)})]
        return []


def look(root: Path) -> QueueLook | None:
    """The queue of the runs directory ``root`` (None: nothing was ever queued there); a database that cannot be
    read is a QueueError saying so."""
    alive = runner_pid(root)
    store = QueueStore.open_existing(root, readonly=True)
    if store is None:
        return None
    try:
        sweeps = {name: store.sweep_spec(name) or {} for name in store.sweep_names()}
        params, refused = {}, {}
        for name in sweeps:
            for t in store.trials(name):
                params[trial_name(name, t.number)] = t.params
                if t.item is None and t.note:
                    refused[trial_name(name, t.number)] = t.note
        return QueueLook(rows(store, alive is not None), store.paused(), alive, sweeps, params, refused)
    except sqlite3.Error as e:
        raise QueueError(f"cannot read the queue database {store.path}: {e}") from None
    finally:
        store.close()
