"""The command lines the TUI's launcher runs, run for real: resuming an older checkpoint makes a branch that
starts from it and is the id returned; resuming the latest with more steps extends the run in place."""

from __future__ import annotations

import shutil

from tests.support.runs import losses, wait_until
from workbench import rundir
from workbench.rundir import parent_of
from workbench.tui import launcher


def _finished(run_dir):
    st = rundir.read_status(run_dir)
    return st if st.state in ("finished", "failed", "crashed") else None


def test_resume_branches_an_older_checkpoint_and_extends_the_latest(trained_run, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(trained_run, root / "r")
    before = losses(root / "r")

    rid = launcher.resume_run(root, "r", "40")  # --checkpoint 40 --detach
    assert rid == "r-from-40" and parent_of(root / rid) == ("r", 40)
    st = wait_until(lambda: _finished(root / rid), timeout=120, what="the branch to finish")
    assert (st.state, st.step) == ("finished", 60)
    assert min(losses(root / rid)) == 41  # it went on from step 40, not from the latest (60)
    assert losses(root / "r") == before  # the parent is as it was

    rid = launcher.resume_run(root, "r", "latest", more=5)  # --more 5: in place
    assert rid == "r"
    st = wait_until(lambda: (s := _finished(root / "r")) and s.step == 65 and s, timeout=120,
                    what="the run to be extended to step 65")
    assert st.state == "finished" and max(losses(root / "r")) == 65
