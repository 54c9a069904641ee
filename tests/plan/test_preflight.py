"""The one pre-flight (workbench/plan/preflight.py): a request planned, estimated and its corpus checked to the
depth the caller names, as one typed result; the CLI's and the TUI's entry points are tested through it in
tests/queue/test_admit.py, tests/tui/test_new_run.py and the train tests."""

from __future__ import annotations

from tests.support.canned_runs import HARDWARE
from workbench.config.duration import TimeBudget
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine
from workbench.plan.preflight import FIRST_RECORDS, LISTED, NO_CORPUS, preflight
from workbench.plan.run_plan import NewRun

MEASURED_CPU = Machine.from_info({**HARDWARE, "nvidia": [], "calibration": {"cpu:fp32": 2e11}})


def test_the_corpus_is_read_only_as_deep_as_asked_and_its_problem_is_one_line(tmp_path):
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text('{"body": "hello there"}\n')      # no data.text_field ("text") in its first record
    req = NewRun("cpu-small", corpus=(str(corpus),))
    runs = tmp_path / "runs"
    assert preflight(req, runs, MEASURED_CPU, corpus=NO_CORPUS).data_error is None
    assert preflight(req, runs, MEASURED_CPU, corpus=LISTED).data_error is None     # listed: nothing read
    pf = preflight(req, runs, MEASURED_CPU, corpus=FIRST_RECORDS)
    assert isinstance(pf.data_error, WorkbenchError) and pf.data_error.exit_code == 2 and "\n" not in pf.data_problem
    assert pf.data_problem.startswith(f"corpus file {corpus}, line 1: the record has no field 'text' (it has: body)")
    corpus.unlink()                                       # gone: refused by the listing, at both depths that read
    for depth in (LISTED, FIRST_RECORDS):
        assert "does not exist" in preflight(req, runs, MEASURED_CPU, corpus=depth).data_problem
    assert not runs.exists()                              # nothing written


def test_a_time_budget_gives_its_steps_and_the_memory_whether_it_fits(tmp_path):
    pf = preflight(NewRun("cpu-small", time_budget=TimeBudget.parse("10m")), tmp_path, MEASURED_CPU)
    assert pf.fits is True and pf.preset.train.time_budget_s == 600
    assert pf.budget_steps is not None and pf.budget_steps > 0 and pf.check.budget_problem == ""
    assert f"~{pf.budget_steps:,} steps" in pf.check.time and pf.data_problem == ""   # builtin: listed and read
    assert preflight(NewRun("cpu-small"), tmp_path, MEASURED_CPU).budget_steps is None
