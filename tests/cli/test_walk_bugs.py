"""The walk's bugs (issue 53) that the CLI shows, each on real tiny runs: `export --format gguf` to a path ending in
.gguf writes that file; a bad --time-budget is blamed on the flag, not the preset; `workbench runs` counts each
file once (a branch's checkpoint is a hard link to its parent's) and lists the newest run first."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.cli import tiny, wb
from tests.support.runs import tree
from workbench.fmt import human_bytes


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A runs directory with ``w`` (10 steps, checkpoints at 5 and 10) and its branch ``w-from-5`` (to step 8)."""
    root = tmp_path_factory.mktemp("walk-runs")
    wb("train", "cpu-small", "--name", "w", "--runs-dir", str(root),
       *tiny("train.max_iters=10", "train.eval_interval=5", "train.ckpt_interval=5"), check=True)
    wb("resume", "w", "--checkpoint", "5", "--runs-dir", str(root), "--set", "train.max_iters=8", check=True)
    assert (root / "w-from-5").is_dir()
    return root


# ----------------------------------------------------------------------------- 5. export x.gguf

def test_export_to_a_path_ending_in_gguf_writes_that_file(root, tmp_path):
    from gguf import GGUFReader
    out = tmp_path / "x.gguf"
    cp = wb("export", "w", str(out), "--format", "gguf", "--runs-dir", str(root), check=True)
    assert out.is_file(), sorted(tree(tmp_path))      # the file itself, not a folder x.gguf/model.gguf
    assert sorted(tree(tmp_path)) == ["x.gguf"]       # and nothing else beside it (no temporary left behind)
    reader = GGUFReader(out)
    arch = reader.get_field("general.architecture").contents()
    assert int(reader.get_field(f"{arch}.block_count").contents()) == 2
    assert cp.stdout.strip().endswith(f" as a GGUF file (f16) to {out}"), cp.stdout
    assert f"llama-cli -m {out} " in cp.stderr, cp.stderr
    # the file is never overwritten: a second export to it is refused, the first left as it was
    before = tree(tmp_path)
    again = wb("export", "w", str(out), "--format", "gguf", "--runs-dir", str(root))
    assert again.returncode == 2 and f"{out} exists" in again.stderr, again.stderr
    assert tree(tmp_path) == before
    # a folder is still a folder: OUT_DIR/model.gguf
    folder = wb("export", "w", str(tmp_path / "dir"), "--format", "gguf", "--runs-dir", str(root), check=True)
    assert (tmp_path / "dir" / "model.gguf").is_file() and str(tmp_path / "dir" / "model.gguf") in folder.stdout


# ----------------------------------------------------------------------------- 6. --time-budget 45x

@pytest.mark.parametrize("command", [["train", "cpu-small"], ["queue", "add", "cpu-small"],
                                     ["sweep", "cpu-small", "--set-grid", "train.lr=1e-3,3e-3"]])
def test_a_bad_time_budget_is_blamed_on_the_flag(command, tmp_path):
    cp = wb(*command, "--time-budget", "45x", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert cp.returncode == 2, cp
    [line] = cp.stderr.strip().splitlines()
    assert line == ("workbench: error: --time-budget 45x is not a duration; write it like 45m, 2h, 1h30m or 90s "
                    "(a bare number is minutes)"), line
    assert "preset" not in line and ".toml" not in line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# ----------------------------------------------------------------------------- 9. runs: disk use and order

def _unique_bytes(paths: list[Path]) -> int:
    """Bytes under ``paths``, each file (inode) once: what they hold on the disk together."""
    seen, total = set(), 0
    for p in paths:
        for f in p.rglob("*"):
            st = f.lstat()
            if f.is_file() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def test_runs_counts_a_linked_checkpoint_once_and_lists_the_newest_first(root):
    runs = json.loads(wb("runs", "--json", "--runs-dir", str(root), check=True).stdout)
    assert [r["id"] for r in runs] == ["w-from-5", "w"]            # newest first, not by name
    by_id = {r["id"]: r for r in runs}
    linked = root / "w-from-5" / "checkpoints" / "step_0000005"
    assert os.stat(linked / "model.pt").st_ino == os.stat(root / "w" / "checkpoints" / "step_0000005" /
                                                           "model.pt").st_ino
    # together the rows add up to what the two runs hold on the disk: the shared checkpoint once
    assert sum(r["disk_bytes"] for r in runs) == _unique_bytes([root / "w", root / "w-from-5"])
    # ... counted with the run that wrote it; the branch says how much it shares
    shared = _unique_bytes([linked])
    assert by_id["w-from-5"]["disk_bytes"] == _unique_bytes([root / "w-from-5"]) - shared
    assert by_id["w-from-5"]["shared_bytes"] == shared and by_id["w"]["shared_bytes"] == 0
    table = wb("runs", "--runs-dir", str(root), check=True).stdout.splitlines()
    assert [line.split()[0] for line in table[1:3]] == ["w-from-5", "w"]
    assert table[1].endswith("  " + human_bytes(by_id["w-from-5"]["disk_bytes"])), table[1]
