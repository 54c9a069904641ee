"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse


def add_set_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a preset value (parsed as TOML), e.g. --set train.max_iters=200 model.dim=128")
