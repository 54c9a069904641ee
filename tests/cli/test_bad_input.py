"""Every bad input: one clear line, a non-zero exit, and the user's files byte-identical afterwards."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

from tests.support.cli import TINY, wb
from tests.support.runs import tree
from workbench import rundir


@dataclass
class Case:
    args: list[str]
    message: str
    setup: Callable[[Path, Path], None] = lambda ws, run: None
    code: int = 2
    env: dict = field(default_factory=dict)


def _write(rel: str, text: str | bytes):
    def setup(ws: Path, run: Path) -> None:
        p = ws / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return setup


def _truncate(ws: Path, run: Path) -> None:
    f = Path(rundir.list_checkpoints(run)[-1]["path"]) / "model.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _foreign(ws: Path, run: Path) -> None:
    torch.save({"transformer.wte.weight": torch.zeros(3, 3)},
               Path(rundir.list_checkpoints(run)[-1]["path"]) / "model.pt")


def _no_ckpt(ws: Path, run: Path) -> None:
    shutil.rmtree(run / "checkpoints")


def _edit_preset(ws: Path, run: Path) -> None:
    p = run / "preset.toml"
    p.write_text(p.read_text().replace("dim = 64", "dim = 128"))


def _file_as_dir(ws: Path, run: Path) -> None:
    (ws / "afile").write_text("not a directory")


T = ["--set", *TINY]
CASES = {
    "malformed_toml": Case(["train", "presets/bad.toml"], "presets/bad.toml: not valid TOML: Expected newline or end "
                           "of document after a statement (at line 3, column 13)",
                           _write("presets/bad.toml", "[model]\ndim = 64\nn_heads = 8 8\n")),
    "unknown_key": Case(["train", "presets/bad.toml"], "unknown key train.lrr (did you mean 'lr'?)",
                        _write("presets/bad.toml", "[train]\nlrr = 0.1\n")),
    "wrong_type": Case(["train", "presets/bad.toml"], "train.batch_size = '8' must be an integer",
                       _write("presets/bad.toml", '[train]\nbatch_size = "8"\n')),
    "constraint": Case(["train", "presets/bad.toml"], "model.dim = 100 must be divisible by model.n_heads = 8 "
                       "(e.g. n_heads = 10)", _write("presets/bad.toml", "[model]\ndim = 100\n")),
    "unknown_preset": Case(["train", "cpu-smal"], "unknown preset 'cpu-smal' (did you mean 'cpu-small'?)"),
    # a --set value is blamed on --set, not on the preset file it was applied to (the walk's bug 6, for any key)
    "set_wrong_type": Case(["train", "cpu-small", "--set", "train.lr=fast"],
                           "workbench: error: --set: train.lr = 'fast' must be a number"),
    "set_unknown_key": Case(["train", "cpu-small", "--set", "train.lrr=1e-3"],
                            "--set 'train.lrr=1e-3': unknown key train.lrr (did you mean 'lr'?)"),
    "missing_corpus": Case(["train", "cpu-small", "--corpus", "nope.txt", *T],
                           "nope.txt' does not exist; give a text file, a directory of text files, "
                           "or builtin (the built-in corpus)"),
    "empty_corpus": Case(["train", "cpu-small", "--corpus", "empty.txt", *T],
                         "empty.txt' is empty", _write("empty.txt", "")),
    "binary_corpus": Case(["train", "cpu-small", "--corpus", "bins", *T],
                          "bins' has no text files (1 binary, 0 empty)",
                          _write("bins/a.dat", b"\x00\x01" * 50)),
    "short_corpus": Case(["train", "cpu-small", "--corpus", "short.txt", *T, "model.vocab_size=272"],
                         "the corpus is too short: ", _write("short.txt", "tiny corpus\n" * 4)),
    "vocab_too_large": Case(["train", "cpu-small", "--corpus", "small.txt", *T, "model.vocab_size=20000"],
                            "the corpus is too small for model.vocab_size = 20000: it supports at most",
                            _write("small.txt", "the cat sat on the mat, said the rat\n" * 200)),
    "runs_dir_not_writable": Case(["train", "cpu-small", "--runs-dir", "afile/runs", *T],
                                  "cannot create runs directory", _file_as_dir),
    "truncated_checkpoint": Case(["resume", "RUN"], "not a valid workbench checkpoint file", _truncate),
    "foreign_checkpoint": Case(["resume", "RUN"], "does not fit this model (missing: tok_emb.weight", _foreign),
    "resume_without_checkpoint": Case(["resume", "RUN"], "run r has no complete checkpoint yet", _no_ckpt),
    "resume_incompatible_preset": Case(["resume", "RUN"], "checkpoint step_0000060 does not fit the run's preset: "
                                       "model.dim: checkpoint 64, preset 128", _edit_preset),
    "sample_without_checkpoint": Case(["sample", "RUN", "--prompt", "x"], "run r has no complete checkpoint yet",
                                      _no_ckpt),
    "unknown_run": Case(["resume", "nosuch"], "no run 'nosuch' in"),
    "run_name_escape": Case(["sample", "../r", "--prompt", "x"], "no run '../r'"),
    "checkpoint_selector_escape": Case(["sample", "RUN", "--checkpoint", "../../etc"],
                                       "checkpoint '../../etc' is not latest, best or a step number"),
    "preset_name_escape": Case(["presets", "copy", "cpu-small", "../evil"], "preset name '../evil' is not allowed"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, trained_run, tmp_path):
    case = CASES[name]
    ws = tmp_path / "ws"
    (ws / "runs").mkdir(parents=True)
    run = ws / "runs" / "r"
    shutil.copytree(trained_run, run)
    case.setup(ws, run)
    before = tree(ws)
    args = [a.replace("RUN", "r") for a in case.args]
    if "--runs-dir" not in args and args[0] != "presets":
        args += ["--runs-dir", str(ws / "runs")]
    # user presets in ws/presets, whatever this shell says: "../evil" would escape to ws/evil.toml
    cp = wb(*args, cwd=ws, env={"WORKBENCH_PRESETS_DIR": str(ws / "presets"), **case.env})
    lines = cp.stderr.strip().splitlines()
    assert cp.returncode == case.code, cp.stderr
    assert lines and lines[-1].startswith("workbench: error: "), cp.stderr
    assert case.message in lines[-1], lines[-1]
    assert tree(ws) == before  # nothing created, changed or removed
    assert not (ws / "evil.toml").exists() and not (ws / "presets" / "evil.toml").exists()


def test_disk_full_while_saving_keeps_previous_checkpoint(trained_run, tmp_path):
    run = tmp_path / "runs" / "r"
    shutil.copytree(trained_run, run)
    ck_before = tree(run / "checkpoints")
    cp = wb("resume", "r", "--runs-dir", str(tmp_path / "runs"), "--set", "train.max_iters=64",
            "train.ckpt_interval=2", env={"WORKBENCH_TEST_FAIL_SAVE_AT_STEP": "62"})
    assert cp.returncode == 1
    last = cp.stderr.strip().splitlines()[-1]
    assert ("workbench: error: could not save checkpoint at step 62: No space left on device (disk full?); "
            "checkpoint step_0000060 is intact; free space, then `workbench resume r`") in last
    assert tree(run / "checkpoints") == ck_before
    assert rundir.read_status(run).state == "failed"
    ok = wb("resume", "r", "--runs-dir", str(tmp_path / "runs"))
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("prompt,note", [("x = 1\n" * 400, "only its last 31 fit the context"),
                                          ("🤖 ∑ 世界 Ωmega", None)])
def test_long_and_out_of_vocabulary_prompts_work(trained_run, prompt, note):
    cp = wb("sample", str(trained_run), "--prompt", prompt, "--max-new-tokens", "5", "--seed", "0")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.startswith(prompt)
    if note:
        assert note in cp.stderr


@pytest.mark.parametrize("args,wrong", [
    (("rounds", "r", "--rounds", "two"), "argument --rounds: invalid int value: 'two'"),
    (("train", "cpu-small", "--set"), "argument --set: expected at least one argument"),
    (("data", "inspect"), "the following arguments are required: corpus"),
    (("bogus",), "argument COMMAND: invalid choice: 'bogus'"),
])
def test_a_malformed_command_line_is_one_line_naming_the_help(args, wrong, tmp_path):
    """argparse's errors printed the command's whole usage before the error (eleven lines for `rounds`): now one
    line, what is wrong and the --help that lists the options, exit 2, nothing written."""
    runs = ("--runs-dir", str(tmp_path / "runs")) if args[0] != "bogus" else ()
    cp = wb(*args, *runs, cwd=tmp_path)
    lines = cp.stderr.strip().splitlines()
    assert cp.returncode == 2 and len(lines) == 1, cp.stderr
    prog = "workbench" if args[0] == "bogus" else f"workbench {args[0]}" + (" inspect" if args[0] == "data" else "")
    assert lines[0].startswith(f"{prog}: error: {wrong}") and lines[0].endswith(f"(`{prog} --help` lists the options)")
    assert list(tmp_path.iterdir()) == [], "nothing written"
