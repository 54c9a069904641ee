"""Sweeps over several machines on a real PostgreSQL server (started here by the fixture: initdb and pg_ctl in a
temporary directory on a free port, password authentication): two workers (two processes standing in for two
machines, each its own runs directory) share one study's trials; one killed with kill -9 mid-trial has its trial
failed by heartbeat and retried, from the start, by the other; bad URLs and credentials are one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import TINY, wb
from tests.support.postgres import PASSWORD, free_port
from tests.support.runs import wait_until
from workbench import rundir
from workbench.queue import dburl, distributed


def _one_line_exit_2(cp: subprocess.CompletedProcess, *words: str) -> str:
    err = cp.stderr.strip()
    assert cp.returncode == 2 and len(err.splitlines()) == 1, (cp.returncode, cp.stdout, cp.stderr)
    assert PASSWORD not in cp.stdout + cp.stderr
    for w in words:
        assert w in err, err
    return err


def test_bad_urls_wrong_credentials_and_an_unreachable_server_are_one_line_exit_2(postgres, tmp_path):
    root = tmp_path / "runs"
    wrong = postgres["url"].replace(PASSWORD, "not-the-password")
    _one_line_exit_2(wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,2e-3", "--storage", wrong,
                        "--runs-dir", str(root)), "the user or the password is wrong")
    dead = f"postgresql://wb:{PASSWORD}@127.0.0.1:{free_port()}/sweeps"
    with pytest.raises(distributed.StorageError) as e:
        distributed.open_storage(dead)
    assert "cannot reach the database at postgresql://wb:***@127.0.0.1" in str(e.value)
    assert "Connection refused" in str(e.value) and PASSWORD not in str(e.value)
    with pytest.raises(distributed.StorageError, match="not a database URL"):
        dburl.engine_url("pgsql:/nowhere")
    _one_line_exit_2(wb("queue", "run", "--storage", "mongodb://x@y/z", "--runs-dir", str(root)),
                     "mongodb:// is not a database this supports")
    assert not root.exists()  # nothing was written
    # the app's --storage is checked before it opens: one line, the password masked
    _one_line_exit_2(wb("tui", "--storage", f"mongodb://wb:{PASSWORD}@y/z", "--runs-dir", str(root)),
                     "mongodb://wb:***@y/z: mongodb:// is not a database this supports")
    # a SQLite path on a network filesystem: refused, naming the fix
    mounts = tmp_path / "mounts"
    mounts.write_text(f"server:/export {tmp_path} nfs4 rw 0 0\n/dev/sda1 / ext4 rw 0 0\n")
    assert dburl.mount_type(tmp_path / "db" / "optuna.db", mounts) == "nfs4"
    with pytest.raises(distributed.StorageError, match="network filesystem .nfs4.*PostgreSQL"):
        dburl.engine_url(f"sqlite:///{tmp_path}/optuna.db", mounts)
    assert dburl.engine_url(postgres["url"]).startswith("postgresql+psycopg://")
    assert distributed.masked(postgres["url"]) == f"postgresql://wb:***@127.0.0.1:{postgres['port']}/sweeps"


def _worker(root: Path, url: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", WORKBENCH_STORAGE=url)  # the URL off the command line
    return subprocess.Popen([sys.executable, "-m", "workbench", "queue", "run", "--heartbeat", "1",
                             "--runs-dir", str(root)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)


@pytest.mark.slow
def test_two_workers_share_a_study_and_a_killed_workers_trial_is_retried_by_the_other(postgres, tmp_path):
    url = postgres["url"]
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    steps = ["train.max_iters=16", "train.eval_interval=8", "train.ckpt_interval=4"]
    cp = wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,3e-3", "--name", "pg", "--storage", url,
            "--runs-dir", str(a_root), "--set", *TINY, *steps, check=True)
    assert "sweep pg made in postgresql://wb:***@" in cp.stdout and PASSWORD not in cp.stdout
    # the same name with another spec: refused; with the same spec: nothing added
    other = wb("sweep", "cpu-small", "--set-grid", "train.lr=5e-3,6e-3", "--name", "pg", "--storage", url,
               "--runs-dir", str(a_root), "--set", *TINY, *steps)
    _one_line_exit_2(other, "exists in postgresql://wb:***@", "with another spec")
    again = wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,3e-3", "--name", "pg", "--storage", url,
               "--runs-dir", str(a_root), "--set", *TINY, *steps, check=True)
    assert "nothing added" in again.stdout

    a = _worker(a_root, url)
    first = a_root / "pg-t0001"
    st = wait_until(lambda: (first / rundir.STATUS_FILE).is_file() and (s := rundir.read_status(first)).live
                    and s.step >= 1 and s, timeout=90, what="worker a's trial to train")
    os.kill(a.pid, signal.SIGKILL)  # the machine is lost mid-trial
    killed_at = time.monotonic()
    a.wait()
    b = _worker(b_root, url)
    # its trainer does not outlive it (it got SIGTERM when its worker died)
    wait_until(lambda: not rundir.read_status(first).live, timeout=30, what="worker a's trainer to stop")
    out, _ = b.communicate(timeout=180)
    retried_after = time.monotonic() - killed_at
    assert b.returncode == 0, out
    assert "retries trial 1 (failed by heartbeat on" in out and "from the start" in out, out
    assert PASSWORD not in out

    shown = json.loads(wb("sweep", "show", "pg", "--storage", url, "--json", check=True).stdout)
    trials = {t["trial"]: t for t in shown["trials"]}
    assert [trials[n]["state"] for n in (1, 2, 3)] == ["fail", "complete", "complete"], trials
    assert trials[3]["retry_of"] == 1 and trials[3]["params"] == trials[1]["params"]
    assert trials[3]["resumed_from"] is None and trials[3]["run"] == "pg-t0003"
    assert trials[1]["run"] == "pg-t0001" and trials[1]["host"]
    # no trial ran twice: worker a's directory holds only its killed trial; b's the second and the retry
    assert sorted(p.name for p in a_root.glob("pg-t*")) == ["pg-t0001"]
    assert sorted(p.name for p in b_root.glob("pg-t*")) == ["pg-t0002", "pg-t0003"]
    assert rundir.read_status(b_root / "pg-t0003").state == "finished"
    listed = wb("sweep", "ls", "--storage", url, check=True).stdout
    assert listed.startswith("pg  grid  2/2 ended  best pg-t000"), listed
    # the killed worker's trainer stopped with a checkpoint (SIGTERM when its worker died): a worker sharing its
    # runs directory resumes the retry from there; b, with a directory of its own, started from the beginning
    assert rundir.read_status(first).state == "stopped"
    assert distributed.retry_from(a_root, "pg-t0001") == rundir.list_checkpoints(first)[-1]["name"]
    assert distributed.retry_from(b_root, "pg-t0001") is None
    # the study-wide count holds: two trials, the failed one replaced by its retry
    import optuna
    study = optuna.load_study(study_name="pg", storage=distributed.open_storage(url))
    assert distributed.counted(study) == 2 and len(study.trials) == 3
    print(f"retried and finished {retried_after:.1f} s after the kill; killed at step {st.step}")


def test_a_worker_with_two_slots_trains_two_trials_of_the_shared_study_at_once(postgres, tmp_path):
    """`queue run --slots 2 --storage URL`: one worker takes two trials of the shared study at once, each on its CPU
    slot (the cores divided as the local queue divides them), each with its own heartbeat; every trial records the
    machine and the device it trained on (what the Queue tab and `sweep show --json` show)."""
    url, root = postgres["url"], tmp_path / "runs"
    wb("sweep", "cpu-small", "--set-grid", "train.lr=1e-3,3e-3", "--name", "slots", "--storage", url,
       "--runs-dir", str(root), "--set", *TINY, "train.max_iters=6", "train.eval_interval=6", check=True)
    # another sweep in the same study database, which `--sweep slots` leaves to other workers
    wb("sweep", "cpu-small", "--set-grid", "train.lr=2e-3", "--name", "later", "--storage", url,
       "--runs-dir", str(root), "--set", *TINY, "train.max_iters=6", "train.eval_interval=6", check=True)
    env = dict(os.environ, WORKBENCH_STORAGE=url)
    cp = subprocess.run([sys.executable, "-m", "workbench", "queue", "run", "--slots", "2", "--heartbeat", "1",
                         "--sweep", "slots", "--runs-dir", str(root)], capture_output=True, text=True, env=env,
                        timeout=180)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert PASSWORD not in cp.stdout + cp.stderr
    assert "[cpu slot 1/2" in cp.stdout and "[cpu slot 2/2" in cp.stdout, cp.stdout
    assert "2 trial(s) ran here" in cp.stdout, cp.stdout

    import optuna
    import sqlalchemy
    storage = distributed.open_storage(url)
    trials = optuna.load_study(study_name="slots", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert sorted(t.user_attrs["device"].split(" (")[0] for t in trials) == ["cpu slot 1/2", "cpu slot 2/2"]
    assert all(t.user_attrs["host"] for t in trials)
    # at once: each started before the other ended
    a, b = trials
    assert a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete, (a, b)
    for t in trials:   # each trains with its slot's threads, set in its preset (what the trainer read)
        threads = int(t.user_attrs["device"].split("(")[1].split()[0])
        preset = (root / t.user_attrs["run"] / rundir.PRESET_FILE).read_text()
        assert "nproc = 1" in preset and f"num_threads = {threads}" in preset, preset
    # a heartbeat of its own for each trial, recorded by its slot's thread while it trained (after its start)
    with storage.engine.connect() as c:
        beats = dict(c.execute(sqlalchemy.text("SELECT trial_id, heartbeat FROM trial_heartbeats")).all())
    for t in trials:
        assert (beats[t._trial_id] - t.datetime_start).total_seconds() >= 1, (beats, t.datetime_start)
    shown = json.loads(wb("sweep", "show", "slots", "--storage", url, "--json", check=True).stdout)
    assert {t["device"].split(" (")[0] for t in shown["trials"]} == {"cpu slot 1/2", "cpu slot 2/2"}
    later = json.loads(wb("sweep", "show", "later", "--storage", url, "--json", check=True).stdout)
    assert not [t for t in later["trials"] if t["state"] != "waiting"], later["trials"]
    assert not list(root.glob("later-t*"))


def test_a_shared_workers_slots_on_a_described_gpu_machine():
    """`--slots` with `--storage` on a 2-GPU machine (as detect() describes one): one GPU a trial, through
    CUDA_VISIBLE_DEVICES; the GPUs a worker is started with are the ones it shares out; more slots than GPUs is
    one line; a CPU machine's slots divide its cores."""
    info = {"cpu": {"physical_cores": 16}, "nvidia": [{"index": 0, "vram_total": 80 * 2**30, "vram_free": 79 * 2**30},
                                                      {"index": 1, "vram_total": 80 * 2**30, "vram_free": 79 * 2**30}]}
    two = distributed.slot_placements(2, info, {})
    assert [(p.label, p.env["CUDA_VISIBLE_DEVICES"], p.env["OMP_NUM_THREADS"], p.sets) for p in two] == [
        ("gpu 0", "0", "8", ("hardware.nproc=1",)), ("gpu 1", "1", "8", ("hardware.nproc=1",))]
    assert [p.label for p in distributed.slot_placements(1, info, {"CUDA_VISIBLE_DEVICES": "1"})] == ["gpu 1"]
    with pytest.raises(distributed.StorageError, match="--slots 3: this worker sees 2 GPU.s. .one trial a GPU.; give "
                                                       "--slots 2 or fewer"):
        distributed.slot_placements(3, info, {})
    cpu = distributed.slot_placements(2, {"cpu": {"physical_cores": 16}}, {})
    assert [(p.label, p.sets) for p in cpu] == [
        ("cpu slot 1/2 (8 threads)", ("hardware.nproc=1", "hardware.num_threads=8")),
        ("cpu slot 2/2 (8 threads)", ("hardware.nproc=1", "hardware.num_threads=8"))]
    assert distributed.slot_placements(2, info, {"CUDA_VISIBLE_DEVICES": ""})[0].label.startswith("cpu slot 1/2")
    # what a trial records as its device without --slots: the GPUs the worker sees, or cpu
    assert distributed.device_label(info, {}, None) == "gpu 0,1"
    assert distributed.device_label(info, {"CUDA_VISIBLE_DEVICES": "1"}, None) == "gpu 1"
    assert distributed.device_label({"cpu": {}}, {}, None) == "cpu"
