"""The queue as ``queue ls`` and the TUI's Queue pane show it: each item's state as it is now (a run the
database says is running but whose trainer and runner are both gone is ``interrupted``: the next runner resumes
it), its place, its progress, what it reached and whether it trained beside other processes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import rundir
from workbench.queue.outcome import beside_note
from workbench.queue.store import Item, QueueStore
from workbench.rundir import read_status


@dataclass(frozen=True)
class Row:
    item: Item
    state: str              # the item's state; "interrupted" for a running one nobody is running
    position: int | None    # 1 = next to start (queued items only)
    step: int | None
    max_iters: int | None
    budget_left_s: float | None
    note: str

    @property
    def name(self) -> str:
        return self.item.name

    def progress(self) -> str:
        if self.step is None:
            return ""
        end = f"/{self.max_iters:,}" if self.max_iters else ""
        left = f", {self.budget_left_s:.0f}s left" if self.budget_left_s is not None else ""
        return f"{self.step:,}{end}{left}"

    def settings(self) -> str:
        """What it trains: the preset, --set values, budget and corpus, as `train` takes them."""
        preset = Path(self.item.preset).name if self.item.preset.endswith(".toml") else self.item.preset
        parts = [preset, *self.item.sets]
        if self.item.time_budget:
            parts.append(f"budget {self.item.time_budget}")
        if self.item.corpus:
            parts.append("corpus " + ",".join(Path(c).name for c in self.item.corpus))
        return " ".join(parts)

    @property
    def beside(self) -> str:
        """"ran beside other processes (...)" for a run that did ('' alone, or not yet recorded)."""
        return beside_note(self.item.others_cpu, self.item.others)

    def to_dict(self) -> dict[str, Any]:
        return {**self.item.to_dict(), "state": self.state, "db_state": self.item.state, "position": self.position,
                "step": self.step, "max_iters": self.max_iters, "budget_left_s": self.budget_left_s,
                "note": self.note, "beside": self.beside}


def rows(store: QueueStore, runner_alive: bool) -> list[Row]:
    out = []
    pos = 0
    for it in store.items():
        step = max_iters = left = None
        state, note = it.state, it.note or ""
        run_dir = store.root / it.name
        if it.state == "queued":
            pos += 1
        elif it.state == "running" and (run_dir / rundir.STATUS_FILE).is_file():
            st = read_status(run_dir)
            step, max_iters = st.step, st.max_iters or None
            if st.budget_s is not None and st.budget_spent_s is not None:
                left = max(0.0, st.budget_s - st.budget_spent_s)
            if not st.live and not runner_alive:
                state, note = "interrupted", "its trainer and the runner are gone: `workbench queue run` resumes it"
        elif it.state == "running" and not runner_alive:
            state, note = "interrupted", "the runner died starting it: `workbench queue run` starts it"
        out.append(Row(it, state, pos if it.state == "queued" else None, step, max_iters, left, note))
    return out
