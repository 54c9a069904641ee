"""In CI a skip that is not a GPU's fails the run (tests/support/strict_skips.py), shown on a real pytest."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.cli import REPO

TESTS = '''
import pytest

def test_needs_a_missing_package():
    pytest.importorskip("no_such_package_here")

@pytest.mark.gpu
def test_needs_a_gpu():
    pytest.skip("needs a CUDA GPU")

@pytest.mark.xfail(strict=True, reason="a known bug")
def test_a_known_bug():
    assert False
'''


def _pytest(tmp_path, strict: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_x.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_STRICT_SKIPS"}
    if strict:
        env["WORKBENCH_STRICT_SKIPS"] = "1"
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.support.strict_skips", "-p",
                           "no:cacheprovider", "-o", "addopts=", "-o", "markers=gpu", str(tmp_path / "test_x.py")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


def test_a_skip_without_a_gpu_mark_fails_in_ci(tmp_path):
    cp = _pytest(tmp_path, strict=True)
    assert cp.returncode == 1, cp.stdout
    assert "1 failed, 1 skipped, 1 xfailed" in cp.stdout and "only tests marked gpu may skip" in cp.stdout
    assert "no_such_package_here" in cp.stdout


def test_outside_ci_skips_are_skips(tmp_path):
    cp = _pytest(tmp_path, strict=False)
    assert cp.returncode == 0 and "2 skipped, 1 xfailed" in cp.stdout, cp.stdout
