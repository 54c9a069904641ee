"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys
from typing import IO, TYPE_CHECKING

from workbench.config import resolve_preset
from workbench.config.duration import DurationError, TimeBudget
from workbench.errors import WorkbenchError
from workbench.fmt import duration, human_bytes
from workbench.machine.detect import Machine, detect
from workbench.plan.fit.memory import estimate_settings
from workbench.plan.sampling import Sampling

if TYPE_CHECKING:  # numpy and the encoder's pool: not imported for a type
    from workbench.data.text.encode import PrepareProgress

RUN_HELP = "run id or run directory"
CHECKPOINT_HELP = "latest (default), best, or a step number"


def add_run_argument(p: argparse.ArgumentParser, help: str = RUN_HELP, *, nargs: str | None = None,
                     checkpoint: bool | str = False, checkpoint_default: str | None = "latest") -> None:
    """RUN, a run's id under --runs-dir or its directory (``rundir.resolve_run`` finds it); with ``checkpoint``
    (True, or the option's help where it says more), the ``--checkpoint`` option that picks one of its checkpoints."""
    p.add_argument("run", nargs=nargs, help=help)
    if checkpoint:
        p.add_argument("--checkpoint", default=checkpoint_default,
                       help=CHECKPOINT_HELP if checkpoint is True else checkpoint)


def add_json_option(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--json", action="store_true", help=help)


def add_progress_option(p: argparse.ArgumentParser, line: str, when: str) -> None:
    """``--progress``: the command says how far it is in ``progress: LINE`` lines on stderr (:func:`print_progress`),
    which the TUI's dialogs show as the job goes."""
    p.add_argument("--progress", action="store_true",
                   help=f"print 'progress: {line}' lines to stderr {when} (the TUI shows them)")


def print_progress(line: str) -> None:
    print(f"progress: {line}", file=sys.stderr, flush=True)


def add_set_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a preset value (parsed as TOML), e.g. --set train.max_iters=200 model.dim=128")


def time_budget_arg(value: str | None) -> TimeBudget | None:
    """``--time-budget VALUE`` as the run request's typed budget (None without the flag), checked here: a bad
    value is the flag's, not the preset's it would go into."""
    try:
        return TimeBudget.parse(value)
    except DurationError as e:
        raise WorkbenchError(f"--time-budget {value} {e.problem}"
                             + (" (a bare number is minutes)" if e.not_duration else "")) from None


def add_init_from_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--init-from", default=None, metavar="RUN[:CHECKPOINT]",
                   help="start from this run's checkpoint (latest, best or a step; default latest), e.g. a model "
                        "brought in by `workbench import`: its [model] (but seq_len and dropout) and tokenizer, "
                        "with train.finetune = full (every weight) or lora (adapters)")


def add_sampling_options(p: argparse._ActionsContainer, defaults: Sampling) -> None:
    """The sampling settings as options, their defaults the one definition's (plan.sampling)."""
    d = defaults
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help=f"default {d.max_new_tokens}")
    p.add_argument("--temperature", type=float, default=d.temperature, help=f"0 = greedy (default {d.temperature:g})")
    p.add_argument("--top-k", type=int, default=d.top_k, help=f"0 = off (default {d.top_k})")
    p.add_argument("--top-p", type=float, default=d.top_p, help=f"nucleus sampling mass, 1 = off (default {d.top_p:g})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"the same seed, the same tokens (default {d.seed})")


def sampling_of(args: argparse.Namespace) -> Sampling:
    """The settings the options give, checked (a bad one is one line naming its option)."""
    return Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                    max_new_tokens=args.max_new_tokens).check()


def add_corpus_option(p: argparse.ArgumentParser, help_suffix: str = "") -> None:
    p.add_argument("--corpus", nargs="+", default=None, metavar="PATH",
                   help="text files, directories, .jsonl/.json, .parquet (optionally .gz/.zst/.xz), globs "
                        "(quoted), or builtin" + help_suffix)


class TerminalProgress:
    """Corpus preparation progress on stderr: one line rewritten in place on a terminal, a line per
    10 % otherwise (a log file, CI)."""

    def __init__(self, stream: IO[str] | None = None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last: tuple[str, int] | None = None

    def __call__(self, p: PrepareProgress) -> None:
        pct = int(p.fraction * 100)
        if not self.tty and self.last is not None and self.last[0] == p.phase and pct // 10 == self.last[1] // 10:
            return
        self.last = (p.phase, pct)
        rate = f", {p.mb_per_s:.1f} MB/s" if p.mb_per_s else ""
        eta = f", ETA {duration(p.eta_s)}" if p.eta_s is not None and p.fraction < 1 else ""
        line = f"  {p.phase} {human_bytes(p.done_bytes)} of {human_bytes(p.total_bytes)} ({pct} %){rate}{eta}"
        if self.tty:
            self.stream.write("\r" + line.ljust(60))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last is not None:
            self.stream.write("\n")
            self.stream.flush()


def calibrated(info: dict, preset: str) -> dict:
    """``detect()``'s view of this machine with its matmul rate for ``preset``'s device and precision measured
    and remembered when none was (a new machine): a time budget queued (`queue add`, a sweep's trials) is then
    planned at the speed `train`'s first line and the trainer use, and refused now for what they would refuse."""
    try:
        s = estimate_settings(resolve_preset(preset), Machine.from_info(info))
    except WorkbenchError:
        return info  # (the trials' own admission says what is wrong with the preset)
    if s.peak_flops:
        return info
    from workbench.machine.probe import measured_peak  # imports torch: only on a machine never measured
    measured_peak(s.device, s.precision)
    return detect()
