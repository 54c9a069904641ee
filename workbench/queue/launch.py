"""Starting, resuming and stopping a queued run's trainer: through the CLI, as the TUI does
(``python -m workbench train ... --detach``), so a queued run starts exactly as ``train --detach`` starts one
(the same plan, estimate, corpus checks and launcher) and the runner never imports torch. Each trainer is a
process of its own in its own session: the runner's death does not stop it."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

from workbench import rundir
from workbench.cli_client import CliError, cli_argv, cli_env, run_cli
from workbench.queue.store import Item

# `train --detach` plans the run and checks the corpus's first records; the trainer prepares the corpus itself
LAUNCH_TIMEOUT_S = 300.0


class CliLauncher:
    """The runner's hands: each call runs one CLI command (through the one client, ``workbench.cli_client``) and
    returns, or raises CliError with its one-line error."""

    def __init__(self, root: Path, env: dict[str, str] | None = None):
        self.root = Path(root)
        self.env = cli_env(env)

    def _run(self, argv: list[str]) -> str:
        return run_cli(argv, LAUNCH_TIMEOUT_S, self.env)

    def placed(self, env: dict[str, str]) -> "CliLauncher":
        """The same launcher, its trainers started with ``env`` added (a placement's CUDA_VISIBLE_DEVICES and
        thread counts)."""
        return type(self)(self.root, {**self.env, **env})

    def start(self, item: Item, sets: tuple[str, ...] = ()) -> None:
        """``train --detach`` the item; ``sets``: --set values added after its own (where the queue placed it)."""
        run = item.new_run()
        if sets:
            run = dataclasses.replace(run, overrides=tuple(run.overrides) + tuple(sets))
        self._run(cli_argv(self.root, "train", *run.cli_args(), "--detach"))

    def resume(self, name: str) -> None:
        self._run(cli_argv(self.root, "resume", name, "--detach"))

    def stop(self, name: str) -> None:
        """The normal stop path, as `workbench stop` takes it: SIGTERM to the trainer, which finishes its step,
        saves a checkpoint and exits ``stopped``. Sent from here rather than through the CLI: a pruned trial's
        budget may be seconds, and the stop must not wait for an interpreter to start."""
        st = rundir.read_status(self.root / name)
        if not st.live or not st.pid:
            raise CliError(f"{name} is not running (state: {st.state})")
        try:
            os.kill(st.pid, signal.SIGTERM)
        except ProcessLookupError:
            raise CliError(f"{name}: its trainer (pid {st.pid}) is gone") from None
