"""Whether a run may join the queue: the pre-flight ``workbench train --detach`` runs when the runner starts it
(``plan.preflight``: the run plan of its preset, ``--set``, corpus and ``--init-from``; its corpus listed and its
first records read against the objective; the estimate), so a queued run is refused for what ``train`` would
refuse, when it is added rather than hours later, and the memory estimate says whether it fits this machine.

A sweep's trial that does not fit is auto-fitted (:func:`admit_fitted`): the smaller micro-batch with more
gradient accumulation and the same tokens per step that the estimate finds (``recommend.fitting_savers``, the
search and accumulation plan of ``workbench fit``); one that no micro-batch fits stays refused, with the reason.
``queue add`` does not auto-fit: the user named that batch, and is told the change (or forces it with --yes)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.analysis.history import measured_in
from workbench.config import Preset
from workbench.machine.detect import Machine
from workbench.plan.preflight import FIRST_RECORDS, preflight
from workbench.plan.report import FitCheck
from workbench.plan.run_plan import absolute_corpus
from workbench.queue.store import NewItem


@dataclass(frozen=True)
class Admission:
    item: NewItem          # what is queued: preset and corpus paths made absolute
    preset: Preset         # the run's preset as `train` will make it
    check: FitCheck        # the estimate: fits / does not fit / unknown, and the time
    fit_tried: bool = False  # auto-fit looked for a smaller micro-batch, and none fits

    @property
    def refused(self) -> str | None:
        """Why the run may not be queued: it does not fit by the estimate (and was not forced)."""
        if self.check.fits is False and not self.item.force:
            advice = f"; try {self.check.suggestion}" if self.check.suggestion else ""
            tried = "; no smaller micro-batch fits with the same tokens per step" if self.fit_tried else ""
            return f"does not fit this machine's memory by the estimate ({self.check.memory}{tried}{advice})"
        return None


def preset_argument(preset: str) -> str:
    """A preset name as given; a path to a preset file made absolute (the runner may start elsewhere)."""
    p = Path(preset).expanduser()
    return str(p.absolute()) if preset.endswith(".toml") or p.is_file() else preset


def admit(root: Path, new: NewItem, machine: Machine, info: dict) -> Admission:
    """The checked run (a WorkbenchError, one line, for a request `train` would refuse)."""
    pf = preflight(new.new_run(), root, machine, info, history=measured_in(root), corpus=FIRST_RECORDS)
    pf.raise_data_problem()  # a corpus `train --detach` would refuse is refused now
    corpus = tuple(absolute_corpus(list(new.corpus))) if new.corpus else ()
    item = NewItem(preset_argument(new.preset), tuple(new.sets), corpus, new.time_budget, new.init_from,
                   new.force, new.name, new.sweep, new.trial)
    return Admission(item, pf.preset, pf.check)


BATCH_KEYS = frozenset({"train.batch_size", "train.grad_accum"})


def micro_batch_fit(check: FitCheck, preset: Preset) -> dict[str, Any] | None:
    """Of the ways the estimate found to make the run fit, the one that changes only the micro-batch and the
    accumulation and keeps the tokens per step exactly (what `workbench fit` would write), or None."""
    seqs = preset.train.batch_size * preset.train.grad_accum
    return next((o for o in check.options if {s.split("=", 1)[0] for s in o["set"]} <= BATCH_KEYS
                 and o["batch_size"] * o["grad_accum"] == seqs), None)


def admit_fitted(root: Path, new: NewItem, machine: Machine, info: dict) -> tuple[Admission, str]:
    """The run checked as :func:`admit` checks it, auto-fitted when it does not fit: (the admission, the change
    as a sweep's table shows it, "auto-fitted: batch 32 -> 8, accum 1 -> 4", or "" when nothing changed). The
    fitted run is estimated again as it will be queued; one that still does not fit keeps its refusal."""
    adm = admit(root, new, machine, info)
    if adm.check.fits is not False or new.force:
        return adm, ""
    option = micro_batch_fit(adm.check, adm.preset)
    if option is not None:
        fitted = admit(root, dataclasses.replace(new, sets=tuple(new.sets) + tuple(option["set"])), machine, info)
        if fitted.check.fits is not False:
            t, f = adm.preset.train, fitted.preset.train
            return fitted, (f"auto-fitted: batch {t.batch_size} -> {f.batch_size}, "
                            f"accum {t.grad_accum} -> {f.grad_accum}")
    return dataclasses.replace(adm, fit_tried=True), ""
