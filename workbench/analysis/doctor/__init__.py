"""The run doctor: what is wrong with a run, shown by its own numbers, and what to change.

``diagnose_run(run_dir, snapshot)`` is a pure function of a run directory and a hardware snapshot
(:class:`workbench.machine.activity.HardwareSnapshot`: the machine, and for a live run what its
processes and everything else are doing): a list of :class:`Finding`, most important first, each
with its evidence and the concrete change (a ``--set`` line or a command). No findings: no problems.

What it reads and what it says:

- ``facts``           one run as the doctor knows it (:class:`RunFacts`: preset, status, timeline, spikes,
                      peaks), read by byte offset; the :class:`Context` a check is given
- ``finding``         the :class:`Finding` record: severity, evidence, the change as a command or ``--set`` line
- ``spikes``          spikes against a running median (gradient norm, loss), found as records arrive

The checks, one module each, every threshold a named constant with the reason for its value:

- ``stability``       non-finite steps skipped or rolled back, gradient-norm and loss spikes
- ``memory``          out of memory, near the device's limit, or far below it (what ``fit`` would choose)
- ``speed``           slow against the estimate; not on the GPU, other processes, waiting for data,
                      compile off where it pays, fp32 on a bf16 GPU, a throttled GPU; evals taking a
                      large share of the run's wall-clock
- ``generalization``  overfitting: the val/train gap growing while val stops improving
- ``corpus``          epochs, a vocabulary large for the corpus, a tiny validation split
- ``mixture``         a mixture's source whose own val loss rises while the mixture's falls
- ``chat``            chat data: a tiny trained share, conversations cut at seq_len, rows mostly padding
- ``preference``      preference runs: a loss that never leaves ln 2, reward accuracy stuck at 0 or 1, the chosen
                      answers' log-probs collapsing; and why both rewards falling under DPO is expected
- ``reward``          GRPO runs: reward hacking (reward up while KL or completion length explodes), most groups
                      without signal (too easy or too hard), a reward that never moves

``workbench doctor RUN`` prints it; the TUI's Train pane shows it in its Health box as the run goes
(keeping one :class:`RunFacts` per run, which reads only the new lines of metrics.jsonl).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from workbench.analysis.doctor import (
    chat,
    corpus,
    generalization,
    memory,
    mixture,
    preference,
    reward,
    speed,
    stability,
)
from workbench.analysis.doctor.facts import Context, RunFacts, read_run
from workbench.analysis.doctor.finding import KINDS, SEVERITIES, Finding
from workbench.machine.activity import HardwareSnapshot

CHECKS = (stability.check, memory.check, speed.check, generalization.check, corpus.check, chat.check,
          preference.check, reward.check, mixture.check)


def diagnose(facts: RunFacts, snapshot: HardwareSnapshot, notes: list[str] | None = None) -> list[Finding]:
    """The findings for a run already read (see RunFacts), most important first. What could not be checked
    is appended to ``notes``."""
    ctx = Context(facts, snapshot)
    if facts.preset is None:
        ctx.note(f"preset: {facts.preset_error or 'not readable'}")
    if facts.start is None:
        ctx.note("the run has not started training yet: nothing to check")
        found: list[Finding] = []
    else:
        found = [x for check in CHECKS for x in check(ctx)]
    if notes is not None:
        notes.extend(ctx.notes)
    return sorted(found, key=Finding.sort_key)


def diagnose_run(run_dir: Path, snapshot: HardwareSnapshot, notes: list[str] | None = None) -> list[Finding]:
    """The findings for the run in ``run_dir`` on the machine of ``snapshot``, most important first."""
    return diagnose(read_run(run_dir), snapshot, notes)


def report(facts: RunFacts, findings: list[Finding], notes: list[str], snapshot: HardwareSnapshot
           ) -> dict[str, Any]:
    """``workbench doctor --json``: the run, the findings and what was not checked (schema in the README)."""
    p = facts.preset
    return {
        "run": facts.run_id,
        "path": str(facts.run_dir),
        "state": facts.state,
        "step": facts.step,
        "max_iters": facts.max_iters,
        "preset": p.name if p else None,
        "device": facts.device,
        "checked_at": round(time.time(), 3),
        "ok": not findings,
        "findings": [f.to_dict() for f in findings],
        "notes": list(notes),
        "activity": snapshot.activity.to_dict() if snapshot.activity else None,
    }


__all__ = ["diagnose", "diagnose_run", "Finding", "KINDS", "read_run", "report", "RunFacts", "SEVERITIES"]
