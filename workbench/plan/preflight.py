"""The pre-flight: what every way of starting a run checks before anything is written, in one place.

`workbench train`, `queue add`, a sweep's trials (the CLI's and the sweep form's), the new-run form (and so the Runs
pane's fine-tune, which opens it) ask :func:`preflight` (or :func:`check_plan`, for a plan already made): the run
plan (``run_plan.plan_new_run``: the preset, ``--set``, ``--init-from``, eval tasks, a GRPO run's reward and prompts),
the estimate (``report.fit_check``: fits or not, its time, what a time budget buys) and the corpus, checked to the
depth the caller can afford:

- ``NO_CORPUS``: nothing read (the form's live estimate, redrawn as the user types);
- ``LISTED``: the corpus listed (a path or glob that names nothing is refused) and ``train.loss_on`` checked against
  it (a text corpus has no turns);
- ``FIRST_RECORDS``: also its kind against the objective (a DPO run on text), the chat template it renders through
  and the first records (a wrong ``data.text_field``): what a detached `train` checks before its run directory exists,
  and so what a queued run is checked for when it is added rather than when the runner starts it hours later (a
  mixture: listed, its sources are prepared by `train` itself).

Each entry point phrases the refusal in its own words (`train`: "start it anyway with --yes", the queue: "queue it
anyway with --yes", a sweep: refused trials in its table, the form: a confirmation); the facts are this module's.
A foreground `train` then prepares the tokens with progress on the terminal and checks them
(:func:`prepare_checked`: rows filled, a mixture's max_repeat over the planned steps), as a resume of a mixture
does over the steps it goes on to (:func:`check_resume_data`).

Torch-free: past runs' measurements (``history``) and a measured peak (``peak``) are handed in by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from workbench.config import Preset, overridden_keys
from workbench.config.objectives import objective_spec
from workbench.data.chat.chat_data import check_loss_on, corpus_kind
from workbench.data.mixture.mixture_data import MixtureData, check_mixture_repeats, mixture_sources
from workbench.data.preference.preference_records import check_corpus_kind
from workbench.data.preset_data import check_chat_template, open_data_corpus, prepare_data
from workbench.data.text.prepare import Progress
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine
from workbench.plan.report import FitCheck, History, fit_check
from workbench.plan.run_plan import NewRun, RunPlan, plan_new_run

Depth = Literal["none", "listed", "first-records"]
NO_CORPUS: Depth = "none"
LISTED: Depth = "listed"
FIRST_RECORDS: Depth = "first-records"


@dataclass(frozen=True)
class Preflight:
    """A new run checked before it starts: its plan, the estimate, and the corpus's first problem (if any)."""
    plan: RunPlan                          # the preset `train` will write, and the checkpoint it starts from
    check: FitCheck                        # memory and time by the estimate; a time budget's steps and problem
    data_error: WorkbenchError | None = None   # what is wrong with the corpus (raised as the caller refuses it)

    @property
    def preset(self) -> Preset:
        return self.plan.preset

    @property
    def fits(self) -> bool | None:
        """False: it does not fit this machine's memory by the estimate; None: this machine's memory is unknown."""
        return self.check.fits

    @property
    def budget_steps(self) -> int | None:
        """The steps a time budget buys by the estimate (the trainer's first guess); None without one."""
        return self.check.budget_steps

    @property
    def data_problem(self) -> str:
        """The corpus's problem in one line, or ""."""
        return str(self.data_error) if self.data_error is not None else ""

    def raise_data_problem(self) -> None:
        """The corpus's problem raised as the error it is (a DataError, exit 2), or nothing."""
        if self.data_error is not None:
            raise self.data_error


def preflight(req: NewRun, runs_root: Path, machine: Machine, info: dict | None = None, *,
              history: History | None = None, peak: Callable[[str, str], float | None] | None = None,
              corpus: Depth = FIRST_RECORDS) -> Preflight:
    """``req`` planned (a WorkbenchError, one line, for a request `train` refuses), estimated on ``machine`` and its
    corpus checked to ``corpus``'s depth. ``info``: the machine as detect() gives it (needed only when no preset is
    named); ``history``, ``peak``: as for report.fit_check."""
    return check_plan(plan_new_run(req, runs_root, info), req, machine, history=history, peak=peak, corpus=corpus)


def check_plan(plan: RunPlan, req: NewRun, machine: Machine, *, history: History | None = None,
               peak: Callable[[str, str], float | None] | None = None, corpus: Depth = FIRST_RECORDS) -> Preflight:
    """:func:`preflight` for a plan already made (`train` prints its process layout and fine-tuning line between)."""
    p = plan.preset
    check = fit_check(p, machine, history, peak=peak)
    return Preflight(plan, check, corpus_problem(p, req.preset_sets(), corpus))


def corpus_problem(p: Preset, sets: tuple[str, ...] | list[str] = (), depth: Depth = FIRST_RECORDS
                   ) -> WorkbenchError | None:
    """What is wrong with ``p``'s corpus, checked to ``depth`` (nothing prepared), or None. ``sets``: the --set
    values the preset was made with (``train.loss_on`` is checked against the corpus only where the user set it).
    A GRPO run trains on a prompts file, read and checked by the run plan: nothing more here."""
    if depth == NO_CORPUS or objective_spec(p.train.objective).samples:
        return None
    try:
        listed = open_data_corpus(p.data)
        check_loss_on(p.data, listed, p.train.loss_on if "train.loss_on" in overridden_keys(list(sets)) else None)
        if depth == FIRST_RECORDS and not p.data.mixture:  # a mixture's sources are read as they are prepared
            kind = corpus_kind(p.data, listed)  # (its first record was read to tell)
            check_corpus_kind(p.train.objective, kind, listed.description)
            if kind != "text":  # conversations and preference records: the template they render through
                check_chat_template(p.data, p.model.vocab_size, p.train.loss_on)
            else:
                listed.check_first_records()
    except WorkbenchError as e:
        return e
    return None


def prepare_checked(p: Preset, budget_steps: int | None, log: Callable[[str], None],
                    progress: Progress | None = None) -> None:
    """The corpus prepared now (tokenizer and tokens, into the cache the run reuses; ``progress``: a
    data.prepare.Progress) and checked as the trainer will use it: conversations that fill no row are refused, a
    mixture's max_repeat over the steps the run is planned for (with a time budget, ``budget_steps``: its first
    guess, the trainer's too). A DataError, one line. A GRPO run's prompts file is not prepared (the run plan read
    it)."""
    if objective_spec(p.train.objective).samples:
        return
    data = prepare_data(p.data, p.model.vocab_size, p.model.seq_len, log=log, progress=progress,
                        loss_on=p.train.loss_on, objective=p.train.objective)  # --init-from: the source's tokenizer
    if isinstance(data, MixtureData):
        data.check(p, max(1, budget_steps) if budget_steps is not None else None)
    else:
        data.check(p)


def check_resume_data(p: Preset, run_dir: Path) -> None:
    """A resume's check of its data over the steps it goes on to (--more, --set train.max_iters): a mixture's
    max_repeat, refused in one line with the numbers, as `train` refuses it from the start (a budgeted run's end stops
    at the last step within it, as it does from the start)."""
    if mixture_sources(p.data) is not None and p.train.time_budget_s is None:
        check_mixture_repeats(p, run_dir)
