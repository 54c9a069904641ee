"""The one writer of run directories: a run made whole or not at all, files shared by hard link (else copy),
records appended, and deletion that never touches a run a trainer is working on."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import psutil
import pytest

from workbench import rundir
from workbench.rundir import (
    CKPT_META,
    METRICS_FILE,
    PRESET_FILE,
    TASKS_FILE,
    RunError,
    TaskRecord,
    append_records,
    delete_run,
    link_file,
    link_tree,
    list_checkpoints,
    make_run,
    read_metrics,
    write_status,
)

ROOT = Path(__file__).resolve().parents[2]


def _checkpoint(run_dir: Path, step: int) -> dict:
    d = run_dir / rundir.CHECKPOINTS_DIR / rundir.ckpt_name(step)
    d.mkdir(parents=True)
    (d / rundir.CKPT_MODEL).write_bytes(b"weights")
    (d / CKPT_META).write_text(f'{{"step": {step}}}')
    return next(c for c in list_checkpoints(run_dir) if c["step"] == step)


def test_a_run_whose_start_fails_leaves_nothing_and_one_that_succeeds_is_a_run(tmp_path):
    def broken(d: Path) -> str:
        (d / "half-written").write_text("x")
        raise ValueError("the start failed")
    with pytest.raises(ValueError):
        make_run(tmp_path, "tiny", broken, "broken")
    assert not (tmp_path / "broken").exists()

    def unwritable(d: Path) -> str:
        raise PermissionError(13, "Permission denied")
    with pytest.raises(RunError, match=r"cannot write to .*unwritable: Permission denied"):
        make_run(tmp_path, "tiny", unwritable, "unwritable",
                 cannot_write=lambda d, e: RunError(f"cannot write to {d}: {e.strerror}"))
    assert not (tmp_path / "unwritable").exists()

    def fill(d: Path) -> str:
        assert not (d / PRESET_FILE).exists()  # the preset's file, which makes it a run, is written last
        (d / "init").mkdir()
        return "name = 'tiny'\n"
    d = make_run(tmp_path, "tiny", fill, "ok")
    assert rundir.resolve_run(tmp_path, "ok") == d and (d / PRESET_FILE).read_text() == "name = 'tiny'\n"
    assert [p.name for p in rundir.iter_run_dirs(tmp_path)] == ["ok"]
    fresh = make_run(tmp_path, "tiny", lambda d: "name = 'tiny'\n")  # no name: <preset>-<time>
    assert fresh.name.startswith("tiny-2") and (fresh / PRESET_FILE).is_file()


def test_a_linked_file_is_the_same_file_and_deleting_one_side_keeps_the_other(tmp_path):
    src = tmp_path / "a" / "model.pt"
    src.parent.mkdir()
    src.write_bytes(b"weights")
    link_tree(src.parent, tmp_path / "b")
    assert os.path.samefile(src, tmp_path / "b" / "model.pt")
    src.unlink()
    assert (tmp_path / "b" / "model.pt").read_bytes() == b"weights"


def test_a_link_across_filesystems_is_a_copy(tmp_path):
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to link across")
    src = tmp_path / "model.pt"
    src.write_bytes(b"weights")
    dst = other / f"workbench-test-{os.getpid()}.pt"
    try:
        link_file(src, dst)
        assert dst.read_bytes() == b"weights" and not os.path.samefile(src, dst)
    finally:
        dst.unlink(missing_ok=True)


def test_task_records_are_appended_and_read_back_typed(tmp_path):
    recs = [TaskRecord(step=4, task="arith", metric="acc", value=0.5, n=10, extra={"source": "builtin"})]
    append_records(tmp_path / TASKS_FILE, recs)
    append_records(tmp_path / TASKS_FILE, recs)
    assert read_metrics(tmp_path / TASKS_FILE) == recs * 2


def test_deleting_refuses_a_live_run_and_anything_outside_the_runs_directory(tmp_path):
    runs = tmp_path / "runs"
    me = psutil.Process(os.getpid())
    live = runs / "live"
    live.mkdir(parents=True)
    ckpt = _checkpoint(live, 10)
    write_status(live, state="running", pid=me.pid, pid_start=me.create_time())
    with pytest.raises(RunError, match=r"^live is running; stop it first\.$"):
        delete_run(runs, live)
    with pytest.raises(RunError, match=r"it prunes its own checkpoints"):
        delete_run(runs, live, ckpt)
    assert Path(ckpt["path"]).is_dir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(RunError, match="not inside"):
        delete_run(runs, outside)
    assert outside.is_dir()


def test_deleting_a_checkpoint_then_the_run(tmp_path):
    runs = tmp_path / "runs"
    d = runs / "done"
    d.mkdir(parents=True)
    first, second = _checkpoint(d, 10), _checkpoint(d, 20)
    write_status(d, state="finished")
    delete_run(runs, d, first)
    assert [c["step"] for c in list_checkpoints(d)] == [20] and not Path(first["path"]).exists()
    delete_run(runs, d)
    assert not d.exists() and Path(second["path"]).parent.parent.parent == runs


def test_no_module_outside_rundir_spells_a_run_file_name():
    """Every file name of a run directory is a constant of ``workbench.rundir.names``: a string literal equal to
    one of them (docstrings and messages aside) elsewhere in the package is a second owner."""
    names = {v for k, v in vars(rundir.names).items()
             if k.isupper() and isinstance(v, str) and "." in v}   # the file names; bare words are too common
    assert {PRESET_FILE, METRICS_FILE, TASKS_FILE, "status.json", "train.log", "meta.json"} <= names
    found = []
    for f in sorted((ROOT / "workbench").rglob("*.py")):
        if "rundir" in f.relative_to(ROOT / "workbench").parts:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{f.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == []
