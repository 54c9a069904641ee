"""The new-run form's check: what it validates is what the trainer would run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.cli import tiny, wb
from workbench.config import preset_to_toml
from workbench.tui.launcher import RunRequest
from workbench.tui.screens.new_run import check_request, request_preset


@pytest.fixture(autouse=True)
def _no_user_presets(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PRESETS_DIR", str(tmp_path / "user-presets"))


@pytest.mark.parametrize("corpus", [
    "C:\\corpora\\python docs.txt",          # a Windows path: backslashes
    'C:\\corpora\\it\'s "mine".txt',         # both kinds of quote too (Python's repr is not TOML here)
    "{tmp}/a\tb.txt",                        # a control character, in an absolute path
    "builtin",
])
def test_the_corpus_is_checked_as_the_exact_path_given(corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus = corpus.format(tmp=tmp_path)
    if corpus != "builtin":  # the form lists the corpus as `workbench train` does: it must exist
        Path(corpus).absolute().write_text("some text\n" * 100)
    req = RunRequest("cpu-small", corpus=corpus, overrides=["train.max_iters=500"])
    assert check_request(req) is None
    if corpus != "builtin":  # gone: the form says so (and stays open), as `workbench train` would
        Path(corpus).absolute().unlink()
        assert "does not exist" in check_request(req)
    p = request_preset(req)
    # the exact path (quotes, backslashes, control characters kept), made absolute as `workbench train` makes it
    assert p.data.corpus == (corpus if corpus == "builtin" else str(Path(corpus).absolute()))
    assert p.train.max_iters == 500


def test_bad_requests_say_what_is_wrong():
    assert "unknown preset 'nope'" in check_request(RunRequest("nope"))
    assert "unknown key train.lrr" in check_request(RunRequest("cpu-small", overrides=["train.lrr=1"]))
    assert "run name" in check_request(RunRequest("cpu-small", name="///"))


# ----------------------------------------------------------------------------- one plan for the CLI and the TUI

def _stdlib_text(n_bytes: int = 300_000) -> str:
    """Real text to train on: this Python's own standard-library sources."""
    out, size = [], 0
    for f in sorted(Path(shutil.__file__).parent.glob("*.py")):
        out.append(f.read_text(encoding="utf-8", errors="replace"))
        size += len(out[-1])
        if size >= n_bytes:
            break
    return "".join(out)


CASES = {
    # case: (RunRequest fields, the same request as `workbench train` arguments, refused?)
    "lora_without_init_from": (dict(overrides=["train.finetune=lora"]), ["--set", "train.finetune=lora"], True),
    "conflicting_keys": (dict(overrides=["train.max_iters=10"]), ["--set", "train.max_iters=10"], True),
    "relative_corpus": (dict(corpus="corpus.txt", overrides=[*tiny("train.max_iters=3")[1:]]),
                        ["--corpus", "corpus.txt", *tiny("train.max_iters=3")], False),
    "missing_corpus": (dict(corpus="missing.txt", overrides=[*tiny("train.max_iters=3")[1:]]),
                       ["--corpus", "missing.txt", *tiny("train.max_iters=3")], True),
    "loss_on_for_a_text_corpus": (dict(corpus="corpus.txt", overrides=[*tiny("train.max_iters=3")[1:],
                                                                       "train.loss_on=assistant"]),
                                  ["--corpus", "corpus.txt", *tiny("train.max_iters=3", "train.loss_on=assistant")],
                                  True),
    # the corpus's kind against the objective: the form checks what the `train --detach` it starts checks (it said
    # nothing, and the form closed on a run `train` then refused)
    "dpo_on_a_text_corpus": (dict(init_from="tiny", corpus="corpus.txt",
                                  overrides=[*tiny("train.max_iters=3", "train.objective=dpo")[1:]]),
                             ["--init-from", "tiny", "--corpus", "corpus.txt",
                              *tiny("train.max_iters=3", "train.objective=dpo")], True),
    "init_from_with_a_model_override": (dict(init_from="tiny", overrides=["model.dim=128"]),
                                        ["--init-from", "tiny", "--set", "model.dim=128"], True),
    "init_from_with_a_free_model_key": (
        dict(init_from="tiny", overrides=[*tiny("train.max_iters=62", "model.dropout=0.2")[1:]]),
        ["--init-from", "tiny", *tiny("train.max_iters=62", "model.dropout=0.2")], False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_cli_and_the_new_run_form_make_the_same_preset_or_the_same_refusal(case, tmp_path, monkeypatch,
                                                                                trained_run):
    fields, argv, refused = CASES[case]
    runs = tmp_path / "runs"
    shutil.copytree(trained_run, runs / "tiny", copy_function=lambda a, b: Path(b).hardlink_to(a))
    (tmp_path / "corpus.txt").write_text(_stdlib_text())
    monkeypatch.chdir(tmp_path)                                  # a relative corpus means the same file to both
    form = check_request(RunRequest("cpu-small", name="new", **fields), runs)
    cp = wb("train", "cpu-small", "--name", "new", "--runs-dir", str(runs), *argv, cwd=tmp_path)
    if refused:
        assert form is not None and cp.returncode == 2, (form, cp.stdout, cp.stderr)
        assert cp.stderr.strip() == f"workbench: error: {form}"
        assert sorted(p.name for p in runs.iterdir()) == ["tiny"]   # nothing written
    else:
        assert form is None and cp.returncode == 0, (form, cp.stderr)
        written = (runs / "new" / "preset.toml").read_text()
        assert written == preset_to_toml(request_preset(RunRequest("cpu-small", **fields), runs))
