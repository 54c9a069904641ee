"""Fixtures for the TUI tests: canned run directories (the app factory and waits: tests.support.tui)."""

from __future__ import annotations

import os

import psutil
import pytest

from tests.support.canned_runs import make_runs


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    """alpha (finished), beta (stopped), gamma (failed); user presets go to tmp."""
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    return make_runs(tmp_path / "runs")


@pytest.fixture
def live_runs_dir(tmp_path, monkeypatch):
    """The same plus delta, 'running' under this test process's pid (never stop it!)."""
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))
    me = psutil.Process(os.getpid())
    return make_runs(tmp_path / "runs", live_pid=me.pid, live_pid_start=me.create_time())
