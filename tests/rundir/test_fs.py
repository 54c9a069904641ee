"""The base layer's atomic writes: a directory is replaced whole or not at all."""

from __future__ import annotations

import pytest

from tests.support.runs import tree
from workbench.fs import atomic_dir


def test_atomic_dir_creates_then_replaces_whole_and_leaves_nothing_beside(tmp_path):
    out = tmp_path / "export"
    with atomic_dir(out) as tmp:
        assert tmp.parent == tmp_path and tmp != out and not out.exists()   # nothing visible while writing
        (tmp / "a.txt").write_text("one")
    assert tree(tmp_path, text=True) == {"export": "<dir>", "export/a.txt": "one"}
    with atomic_dir(out) as tmp:
        (tmp / "b.txt").write_text("two")
    assert tree(tmp_path, text=True) == {"export": "<dir>", "export/b.txt": "two"}     # replaced whole: a.txt is gone


def test_atomic_dir_that_fails_leaves_the_old_directory_and_no_temporary(tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "model.pt").write_text("old weights")
    with pytest.raises(OSError, match="disk full"):
        with atomic_dir(out, tmp_name=".tmp_ckpt_1") as tmp:
            (tmp / "model.pt").write_text("half of the new")
            raise OSError("disk full")
    assert tree(tmp_path, text=True) == {"ckpt": "<dir>", "ckpt/model.pt": "old weights"}
