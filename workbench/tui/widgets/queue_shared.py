"""The Queue pane's shared study database (``workbench tui --storage URL`` or ``$WORKBENCH_STORAGE``; a password
from the URL, ``PGPASSWORD`` or ``~/.pgpass``): its sweeps read through one read-only connection, kept between
reads (``queue.shared_study.SharedReader``), in a worker of the pane every few seconds; a database that cannot be
read is one line (the URL masked, as everywhere it is shown), the sweeps read last kept, and the next read tries
again. No widget here: the pane shows what this reads."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from workbench.queue.sweep_results import Result
from workbench.queue.sweep_spec import SweepSpec

if TYPE_CHECKING:
    from workbench.queue.shared_study import SharedReader

STORAGE_ENV = "WORKBENCH_STORAGE"   # the shared study database's URL (as `queue run` and `sweep` read it)
SHARED = "shared:"                  # a shared sweep's key in the sweeps table (a local sweep may have its name)


class SharedStudy:
    """The shared study database the Queue pane lists beside its runs directory's queue (``url`` None: none)."""

    def __init__(self, storage: str | None) -> None:
        # given, else $WORKBENCH_STORAGE; kept in memory only, shown masked
        self.url = storage if storage is not None else (os.environ.get(STORAGE_ENV) or None)
        self.sweeps: list[tuple[str, SweepSpec, list[Result]]] = []   # read last (kept when a read fails)
        self.error = ""                  # why the last read failed ("": it did not)
        self.reader: SharedReader | None = None  # shared_study.SharedReader, made in the worker (Optuna loads there)
        self.busy = False                # a read in flight: the next waits for it

    def masked(self) -> str:
        from workbench.queue.dburl import masked
        return masked(self.url or "")

    def read(self) -> tuple[list[tuple[str, SweepSpec, list[Result]]], str]:
        """(its sweeps, ""), or ([], why they could not be read, in one line): in the pane's worker thread."""
        from workbench.queue.shared_study import SharedReader, StorageError
        assert self.url is not None  # (the pane reads only with one)
        try:
            if self.reader is None:
                self.reader = SharedReader(self.url)
            return self.reader.read(), ""
        except StorageError as e:
            return [], str(e)
        except Exception as e:   # never the app: what went wrong is the tab's line, the URL masked
            from workbench.queue.dburl import _scrub
            return [], _scrub(f"cannot read {self.masked()}: {e!r}", self.url or "")
        finally:
            self.busy = False

    def took(self, sweeps: list[tuple[str, SweepSpec, list[Result]]], error: str,
             every_s: float) -> tuple[str, str]:
        """A read's outcome kept (a failed one leaves the sweeps read last listed): the tab's line and its style."""
        self.error = error
        if error:   # the line says they could not be read again
            return (f"shared study: {error} (tried {time.strftime('%H:%M:%S')}; trying again every "
                    f"{every_s:.0f} s)", "bold red")
        self.sweeps = sweeps
        trials = sum(len(r) for _, _, r in sweeps)
        return (f"shared study {self.masked()}: {len(sweeps)} sweep(s), {trials} trial(s), "
                f"read {time.strftime('%H:%M:%S')}", "green")
