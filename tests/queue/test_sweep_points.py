"""A random search over values alone draws different trials (a seeded sample of the grid without replacement):
Optuna's sampler drew each value on its own and repeated points (2 of 3 trials alike on a 6-point grid, seed 5)."""

from __future__ import annotations

from tests.support.cli import wb

GRID = ["--set-grid", "train.lr=1e-3,3e-3,1e-2", "train.warmup_iters=0,5"]


def trial_sets(tmp_path, *flags: str) -> list[str]:
    cp = wb("sweep", "cpu-small", *GRID, "--set", "model.dim=64", "model.n_layers=2", "--runs-dir",
            str(tmp_path / "runs"), "--print-commands", *flags, check=True)
    return [ln.split("--set ")[1].split(" model.dim")[0] for ln in cp.stdout.splitlines() if "--name" in ln]


def test_a_random_search_over_values_draws_different_points_and_no_more_than_there_are(tmp_path):
    for seed in ("5", "6", "7"):
        drawn = trial_sets(tmp_path, "--method", "random", "--trials", "6", "--seed", seed)
        assert len(drawn) == 6 and len(set(drawn)) == 6, drawn            # the whole grid, in a seeded order
    three = trial_sets(tmp_path, "--method", "random", "--trials", "3", "--seed", "5")
    assert len(set(three)) == 3 and three == trial_sets(tmp_path, "--method", "random", "--trials", "3", "--seed", "5")
    cp = wb("sweep", "cpu-small", *GRID, "--method", "random", "--trials", "7", "--runs-dir", str(tmp_path / "runs"),
            "--print-commands")
    assert cp.returncode == 2 and cp.stderr.strip().splitlines() == [
        "workbench: error: a random search over 6 points cannot draw 7 different trials; ask for 6 or fewer, or use "
        "method = \"grid\""], cp.stderr
