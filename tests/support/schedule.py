"""The order test files are handed to the test workers: the longest first.

pytest-xdist (``--dist loadfile``) gives each worker a whole file at a time in collection order, which is
alphabetical: tests/train and tests/tui, which hold the longest files (two cold compiles, multi-process runs,
sweeps), came last, so one worker could still be in a long file while the other had nothing left. Longest first
(the classic longest-processing-time rule) leaves the short files to even out the end. The seconds are each file's
total in one run of the suite (2026-11-29, ``--durations=0``, on this 2-core machine under load, so about three
times a quiet run's); only the order matters. A file not listed keeps its place after these."""

from __future__ import annotations

import pytest

LONGEST_FIRST = [
    "tests/train/test_train.py",  # 351 s
    "tests/train/test_distributed.py",  # 273 s
    "tests/queue/test_sweep.py",  # 249 s
    "tests/cli/test_wiring_flags.py",  # 154 s
    "tests/tui/test_presets.py",  # 126 s
    "tests/tui/test_sweep_form.py",  # 124 s
    "tests/train/test_resume.py",  # 114 s
    "tests/train/test_fsdp.py",  # 112 s
    "tests/queue/test_queue.py",  # 94 s
    "tests/bench/test_grpo_speed_smoke.py",  # 90 s
    "tests/train/test_time_budget.py",  # 89 s
    "tests/config/test_wiring_keys.py",  # 84 s
    "tests/tui/test_panes.py",  # 83 s
    "tests/train/test_grpo_budget.py",  # 79 s
    "tests/cli/test_eval.py",  # 75 s
    "tests/train/test_preference_training.py",  # 74 s
    "tests/cli/test_readme_claims.py",  # 69 s
    "tests/queue/test_sweep_postgres.py",  # 69 s
    "tests/queue/test_sweep_budget.py",  # 67 s
    "tests/train/test_optim.py",  # 65 s
    "tests/analysis/test_branch.py",  # 63 s
    "tests/interop/test_eval_reference.py",  # 61 s
    "tests/reward/test_pairs_cli.py",  # 61 s
    "tests/tui/test_readme_claims_tui.py",  # 58 s
    "tests/queue/test_fairness.py",  # 55 s
    "tests/bench/test_dpo_paper_smoke.py",  # 53 s
    "tests/analysis/test_doctor.py",  # 53 s
    "tests/test_layers.py",  # 53 s
    "tests/tui/test_sweep_ui.py",  # 51 s
    "tests/tui/test_stop.py",  # 51 s
]


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the listed files first, in the list's order; the rest as collected."""
    rank = {f: i for i, f in enumerate(LONGEST_FIRST)}
    first = len(LONGEST_FIRST)
    items.sort(key=lambda it: rank.get(it.nodeid.split("::")[0], first))  # stable: a file's tests keep their order
