"""A run's history is never rewritten: resuming from a checkpoint other than the latest makes a
new run (a branch) that starts from a copy of that checkpoint and records its parent; the parent
is left exactly as it was.

    runs/tiny/                    finished at 600; its latest checkpoint stays step_0000600
    runs/tiny-from-540/           preset.toml has [parent] run = "tiny", step = 540
        checkpoints/step_0000540/ the parent's checkpoint (hard links: no copy, and deleting either
                                  side's files never touches the other's)
        tokenizer.model           the parent's (or its tokenizer.json and tokenizer_config.json)
        init/                     the parent's starting weights, if it has them (hard links; a LoRA
                                  run's checkpoints are adapters on top of them)

A branch is made by the run directories' one maker (``workbench.rundir.make_branch``, which names it and
writes its parent); this module reads: it follows a run's ancestors to draw it as one line (``lineage``).
Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from workbench.rundir import parent_of


def lineage(root: Path, run_id: str, limit: int = 32) -> list[tuple[str, int | None]]:
    """The run and its ancestors, oldest first: [(run id, the step up to which it counts), ...]; the
    last entry is the run itself (None: all of it). Stops at a missing parent or a cycle."""
    chain: list[tuple[str, int | None]] = [(run_id, None)]
    seen = {run_id}
    current = run_id
    while len(chain) < limit:
        p = parent_of(Path(root) / current)
        if p is None or p[0] in seen or not (Path(root) / p[0]).is_dir():
            break
        chain.append(p)
        seen.add(p[0])
        current = p[0]
    return list(reversed(chain))


__all__ = ["lineage"]
