"""`workbench sweep save-best`: the best finished trial of a sweep kept as a user preset with what that trial ran
with (the sweep's --set values and its searched value); refused in one line, exit 2, with nothing written, when no
trial has finished, when the name is taken (never overwritten) or is a shipped preset's. (The TUI's `b`, a real
sweep, and training the saved preset: tests/tui/test_sweep_ui.py.)"""

from __future__ import annotations

import tomllib

from tests.support.cli import TINY, wb
from workbench.queue.store import QueueStore


def test_save_best_writes_the_best_trials_settings_and_never_overwrites(tmp_path):
    root, presets = tmp_path / "runs", tmp_path / "presets"
    env = {"WORKBENCH_PRESETS_DIR": str(presets)}
    sets = [s for s in TINY if not s.startswith("train.warmup_iters")]
    wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,1e-2", "train.warmup_iters=3,7", "--time-budget", "5s",
       "--name", "sb", "--runs-dir", str(root), "--set", *sets, env=env, check=True)

    def save(*args: str):
        return wb("sweep", "save-best", *args, "--runs-dir", str(root), env=env)

    cp = save("sb")   # nothing has finished yet
    assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1
    assert "sweep sb has no best trial yet (no trial has finished with val_loss)" in cp.stderr
    assert not presets.exists()

    store = QueueStore(root)
    for name, metric in [("sb-t0001", 3.5), ("sb-t0003", 3.1), ("sb-t0004", 3.3)]:
        store.update(store.find(name).id, state="finished", metric=metric, started=1.0, ended=2.0)
    store.close()
    cp = save("sb")
    assert cp.returncode == 0, cp.stderr
    assert "best trial sb-t0003 (train.lr=0.01 train.warmup_iters=3), val_loss 3.1000" in cp.stdout
    path = presets / "sb-best.toml"
    text = path.read_text()
    data = tomllib.loads(text)
    assert data["name"] == "sb-best" and "sb-t0003" in data["description"]
    assert data["train"]["lr"] == 0.01 and data["train"]["warmup_iters"] == 3     # the searched values
    assert data["model"]["dim"] == 64 and data["train"]["optimizer"] == "adamw"    # the sweep's --set values
    assert data["train"]["time_budget"] == "" and "# each trial trained 5s" in text

    for args, words in [(("sb",), "sb-best.toml already exists; it is never overwritten; choose another name"),
                        (("sb", "--as", "cpu-small"), "'cpu-small' is a shipped preset's name"),
                        (("sb", "--as", "a/b"), "preset name 'a/b' is not allowed"),
                        (("nope",), "no sweep 'nope'"),
                        ((), "name the sweep: `workbench sweep save-best NAME")]:
        cp = save(*args)
        assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1 and words in cp.stderr, (args, cp)
    assert path.read_text() == text and sorted(p.name for p in presets.iterdir()) == ["sb-best.toml"]
    cp = wb("sweep", "show", "sb", "--as", "x", "--runs-dir", str(root), env=env)
    assert cp.returncode == 2 and "it goes with save-best" in cp.stderr

    cp = save("sb", "--as", "lr-winner")
    assert cp.returncode == 0 and tomllib.loads((presets / "lr-winner.toml").read_text())["train"]["lr"] == 0.01
