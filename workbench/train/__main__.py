"""``python -m workbench.train RUN_DIR [--resume [--checkpoint SEL]] [--detached]``: the trainer process."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workbench import cli_client
from workbench.errors import WorkbenchError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.train",
                                 description="Run the trainer on a run directory (the launcher writes preset.toml).")
    ap.add_argument("run_dir")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--detached", action="store_true", help="stdout is train.log already")
    args = ap.parse_args(argv)
    from workbench.train.loop import Trainer  # imports torch

    try:
        return Trainer(Path(args.run_dir), args.resume, args.checkpoint, echo=not args.detached).run()
    except WorkbenchError as e:
        print(f"workbench: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    # under the tests, a fresh interpreter (a torchrun rank) stands in for the trainer forked from their spawn server
    code = cli_client.stand_in("workbench.train", sys.argv[1:])
    raise SystemExit(main() if code is None else code)
