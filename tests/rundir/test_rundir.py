"""The run-directory contract's typed status: what writers may set and what readers get back."""

from __future__ import annotations

import json
import os

import pytest

from workbench.rundir import RunStatus, process_start_time, read_status, write_status


def test_status_round_trips_typed_and_keeps_what_it_does_not_know(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"state": "finished", "step": 60, "max_iters": 60,
                                                      "best_val_loss": 4.25, "from_a_newer_trainer": [1, 2]}))
    st = write_status(tmp_path, ckpt_seconds=0.5)
    assert (st.state, st.step, st.max_iters, st.best_val_loss, st.ckpt_seconds) == ("finished", 60, 60, 4.25, 0.5)
    assert st.extra == {"from_a_newer_trainer": [1, 2]} and st.updated is not None
    on_disk = json.loads((tmp_path / "status.json").read_text())
    assert on_disk["from_a_newer_trainer"] == [1, 2] and on_disk["ckpt_seconds"] == 0.5
    assert read_status(tmp_path) == st


def test_a_writer_cannot_invent_a_field(tmp_path):
    with pytest.raises(TypeError, match="RunStatus has no field stepp"):
        write_status(tmp_path, stepp=3)
    assert not (tmp_path / "status.json").exists()


def test_a_live_state_whose_process_is_gone_reads_as_crashed(tmp_path):
    me = os.getpid()
    write_status(tmp_path, state="running", pid=me, pid_start=process_start_time(me))
    assert read_status(tmp_path).state == "running" and read_status(tmp_path).live
    write_status(tmp_path, pid_start=process_start_time(me) - 100)   # the pid now belongs to another process
    st = read_status(tmp_path)
    assert st.state == "crashed" and not st.live and "gone without saying why" in st.error


def test_no_status_file_yet_is_a_start_that_never_happened_and_unknown_is_not_live(tmp_path):
    assert read_status(tmp_path).state == "crashed"      # "starting" with no process
    assert RunStatus().state == "?" and not RunStatus().live
    assert RunStatus.from_dict({"state": 3, "step": "x", "pid": -1}) == RunStatus()
