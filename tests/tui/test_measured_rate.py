"""This machine's measured matmul rate in the TUI (issue 32). The new-run form's time with no previous run:
estimated from the rate when a run or `workbench estimate` has measured it (the TUI cannot measure one: it never
loads torch; it reads the cache), labelled so; unknown when nothing is known. The Train pane's MFU: marked when
its peak is uncertain."""

from __future__ import annotations

import json

from tests.support.tui import make_app, run, text_of, wait_for
from workbench.config import resolve_preset
from workbench.machine import rates
from workbench.machine.detect import machine_identity
from workbench.plan.fit.flops import flops_per_token

UNKNOWN = "time: unknown until this machine's speed is measured (after a first run, or `workbench estimate`)"


def _form_text(runs_dir) -> str:
    async def go() -> str:
        app = make_app(runs_dir, hardware_info=None)  # this machine, read live (its cache too)
        async with app.run_test(size=(160, 48)) as pilot:
            app.action_new_run("cpu-small", "hardware.device=cpu")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "NewRunScreen"
                           and bool(app.screen.query("#nr-estimate")), what="the form")
            est = app.screen.query_one("#nr-estimate")
            await wait_for(pilot, lambda: "tokens/s" in text_of(est) or "time:" in text_of(est),
                           what=lambda: f"the estimate {text_of(est)!r}")
            return text_of(est)
    return run(go())


def test_the_forms_time_comes_from_the_cached_matmul_rate_or_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path / "cache"))
    runs = tmp_path / "runs"   # no previous run of anything
    runs.mkdir()

    text = _form_text(runs)
    assert UNKNOWN in text, text

    # what a run's (or `workbench estimate`'s) calibration left: 100 GFLOP/s with torch's two threads
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / rates.RATES_FILE).write_text(json.dumps(
        {machine_identity(): {rates.rate_key("cpu", "fp32", 2): {"flops": 100e9, "busy": False}}}))
    text = _form_text(runs)
    tps = 100e9 * 0.5 / flops_per_token(resolve_preset("cpu-small").model)   # x the CPU's assumed efficiency
    steps = resolve_preset("cpu-small").train.max_iters
    assert f" for {steps:,} steps at {tps:,.0f} tokens/s (estimate from this machine's measured matmul rate)" in text, \
        text
    assert "unknown" not in text


def test_the_train_pane_marks_an_mfu_whose_peak_is_uncertain():
    """MFU against a peak measured only beside busy processes may read high: the Train pane says so."""
    from workbench.rundir import EventRecord
    from workbench.tui.widgets.monitor import mfu_text

    def start(uncertain: bool) -> EventRecord:
        cal, _ = rates.settle("cpu", "fp32", 2, 51e9, 0.8 if uncertain else 0.0, None)
        return EventRecord.from_dict({"kind": "event", "event": "start", "step": 0, "device": "cpu",
                                      "peak_flops": cal.flops, "calibration": cal.to_dict()})
    assert mfu_text(0.554, start(uncertain=True)) == "55.4% (uncertain)"
    assert mfu_text(0.141, start(uncertain=False)) == "14.1%"
    assert mfu_text(0.141, None) == "14.1%" and mfu_text(None, start(uncertain=True)) == "—"
