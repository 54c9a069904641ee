"""`workbench tui` (also bare `workbench`): the terminal UI."""

from __future__ import annotations

import argparse
import os

STORAGE_ENV = "WORKBENCH_STORAGE"   # as `queue run` and `sweep` read it


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("tui", help="open the terminal UI (the default with no command)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="also show the sweeps of a shared study database in the Queue tab (postgresql://USER@HOST/DB; "
                        f"read-only); default: ${STORAGE_ENV}. Leave the password out of the URL and give it by "
                        "PGPASSWORD or ~/.pgpass: a command line is seen by every user's `ps`")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    url = getattr(args, "storage", None)
    if url:
        from workbench.queue.dburl import engine_url
        engine_url(url)   # not a database URL, or SQLite on a network filesystem: one line before the app opens
        # the Queue tab reads it from this process's environment (never a file); `workbench queue run --detach`
        # started from the tab (r) gets it too, as from a shell with it exported: a worker on the shared study
        os.environ[STORAGE_ENV] = url
    from workbench.tui.app import run_tui  # lazily: Textual loads only for the UI, not with every command
    return run_tui(args.runs_dir)
