"""Whether a run may join the queue: the run plan takes its preset, ``--set``, corpus and ``--init-from``
(so a queued run is refused for what ``workbench train`` would refuse, when it is added rather than hours
later), its corpus is listed, and the memory estimate says whether it fits this machine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench.analysis.history import measured_in
from workbench.config import Preset
from workbench.data.tokens import open_data_corpus
from workbench.machine.detect import Machine
from workbench.plan.report import FitCheck, fit_check
from workbench.plan.run_plan import NewRun, absolute_corpus, plan_new_run
from workbench.queue.store import NewItem


@dataclass(frozen=True)
class Admission:
    item: NewItem          # what is queued: preset and corpus paths made absolute
    preset: Preset         # the run's preset as `train` will make it
    check: FitCheck        # the estimate: fits / does not fit / unknown, and the time

    @property
    def refused(self) -> str | None:
        """Why the run may not be queued: it does not fit by the estimate (and was not forced)."""
        if self.check.fits is False and not self.item.force:
            advice = f"; try {self.check.suggestion}" if self.check.suggestion else ""
            return f"does not fit this machine's memory by the estimate ({self.check.memory}{advice})"
        return None


def preset_argument(preset: str) -> str:
    """A preset name as given; a path to a preset file made absolute (the runner may start elsewhere)."""
    p = Path(preset).expanduser()
    return str(p.absolute()) if preset.endswith(".toml") or p.is_file() else preset


def admit(root: Path, new: NewItem, machine: Machine, info: dict) -> Admission:
    """The checked run (a WorkbenchError, one line, for a request `train` would refuse)."""
    sets = tuple(new.sets) + ((f"train.time_budget={new.time_budget}",) if new.time_budget else ())
    plan = plan_new_run(NewRun(new.preset, sets, tuple(new.corpus), new.init_from), root, info)
    open_data_corpus(plan.preset.data)  # a path or glob that names nothing is refused now
    corpus = tuple(absolute_corpus(list(new.corpus))) if new.corpus else ()
    item = NewItem(preset_argument(new.preset), tuple(new.sets), corpus, new.time_budget, new.init_from,
                   new.force, new.name, new.sweep, new.trial)
    return Admission(item, plan.preset, fit_check(plan.preset, machine, measured_in(root)))
