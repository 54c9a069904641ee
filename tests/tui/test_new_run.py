"""The new-run form's check: what it validates is what the trainer would run."""

from __future__ import annotations

import pytest

from workbench.tui.launcher import RunRequest
from workbench.tui.screens.new_run import check_request, request_preset


@pytest.fixture(autouse=True)
def _no_user_presets(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))


@pytest.mark.parametrize("corpus", [
    "C:\\corpora\\python docs.txt",          # a Windows path: backslashes
    'C:\\corpora\\it\'s "mine".txt',         # both kinds of quote too (Python's repr is not TOML here)
    "/data/a\tb.txt",                        # a control character
    "builtin",
])
def test_the_corpus_is_checked_as_the_exact_path_given(corpus):
    req = RunRequest("cpu-small", corpus=corpus, overrides=["train.max_iters=500"])
    assert check_request(req) is None
    p = request_preset(req)
    assert p.data.corpus == corpus and p.train.max_iters == 500


def test_bad_requests_say_what_is_wrong():
    assert "unknown preset 'nope'" in check_request(RunRequest("nope"))
    assert "unknown key train.lrr" in check_request(RunRequest("cpu-small", overrides=["train.lrr=1"]))
    assert "run name" in check_request(RunRequest("cpu-small", name="///"))
