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


def test_a_start_record_says_itself_as_an_event_and_reads_back():
    """The trainer's start (or resume) event is a typed record: written as an event, read back the same; the
    optional fields only with a value, the data's own facts by kind beside the rest."""
    from workbench.rundir.records import EventRecord, StartRecord, parse_record
    rec = StartRecord(params=1000, device="cpu", precision="fp32", compile=False, compile_mode="off",
                      loss_chunk_tokens=0, activation_checkpointing=False, savers_reason="", tokens_per_step=128,
                      corpus="builtin", train_tokens=900, val_tokens=100, eval_iters=2, peak_flops=None, pid=7,
                      world_size=1, parallel="none", finetune="full", trainable=1000, budget_s=60.0,
                      budget_steps=40, data={"chat": {"conversations": 3}})
    ev = rec.event(resume=False, step=0, time=1.0)
    line = json.loads(json.dumps(ev.to_dict()))
    assert line["event"] == "start" and line["chat"] == {"conversations": 3} and line["peak_flops"] is None
    assert "checkpoint" not in line and "calibration" not in line and line["budget_steps"] == 40
    back = parse_record(line)
    assert isinstance(back, EventRecord) and StartRecord.of(back) == rec
    assert rec.event(resume=True, step=5, time=2.0).event == "resume"
