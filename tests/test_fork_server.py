"""The tests' fork server (tests/support/zygote.py) runs the CLI as a fresh interpreter would: its own process,
the environment, working directory, exit status and output it was given, and a timeout that kills it."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.support import zygote
from tests.support.cli import tiny, wb
from tests.support.runs import wait_until
from workbench import rundir


def test_a_forked_command_gets_its_own_environment_directory_and_exit_status(tmp_path):
    runs = tmp_path / "from-env"
    cp = zygote.run(["train", "cpu-small", "--name", "r", "--yes", *tiny("train.max_iters=4", "train.eval_interval=4")],
                    str(tmp_path), dict(os.environ, WORKBENCH_RUNS_DIR=str(runs)), timeout=120)
    assert cp is not None, "the fork server was not used (a thread started by importing torch?)"
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines()[-1].endswith("finished at step 4, best val loss " +
                                               f"{rundir.read_status(runs / 'r').best_val_loss:.4f}")
    st = rundir.read_status(runs / "r")
    assert st.pid not in (os.getpid(), zygote._server.proc.pid)  # a process of its own
    bad = zygote.run(["train", "cpu-small", "--set", "train.lr=-1"], str(tmp_path), dict(os.environ), timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("workbench: error:") and bad.stdout == ""
    # what the product reads from the environment at import time sees the command's environment
    cp = zygote.run(["runs"], str(tmp_path), dict(os.environ, WORKBENCH_RUNS_DIR=str(runs)), timeout=60)
    assert cp.returncode == 0 and cp.stdout.splitlines()[1].split()[0] == "r"


def test_a_forked_command_past_its_timeout_is_killed(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        wb("train", "cpu-small", "--name", "long", "--runs-dir", str(tmp_path), "--yes",
           *tiny("train.max_iters=1000000", "train.eval_interval=1000000"), timeout=5)
    st = rundir.read_status(tmp_path / "long")
    assert st.pid and not rundir.pid_alive(st.pid)
    assert wb("--help").returncode == 0  # the server goes on serving


def test_a_command_while_the_server_is_busy_starts_a_fresh_interpreter():
    """Another thread's command holds the server: this one does not wait for it (it may be what that one waits
    on) but starts a fresh interpreter."""
    assert zygote.run(["--help"], None, dict(os.environ), timeout=60).returncode == 0
    with zygote._server.lock:
        assert zygote.run(["--help"], None, dict(os.environ), timeout=60) is None
        cp = wb("presets", "list")
    assert cp.returncode == 0 and "cpu-small" in cp.stdout


def _ppid(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def test_a_detached_trainer_is_forked_by_the_spawn_server_as_the_product_would_start_it(tmp_path):
    """`train --detach` through the spawn server (tests/support/spawner.py): the trainer is a process in a session
    of its own, its output in the run's train.log, the command's OMP_NUM_THREADS its torch threads, and `workbench
    stop` stops it; with WORKBENCH_TEST_SPAWN empty the product starts it itself (a fresh interpreter)."""
    from tests.support import spawner
    if spawner._proc is None:  # a worker of a session whose server the controller started: ask that one
        assert os.environ.get("WORKBENCH_TEST_SPAWN"), "no spawn server in this test session"
    long = tiny("train.max_iters=1000000", "train.eval_interval=1000000", "train.log_interval=1")
    started = {}
    for name, env in (("forked", {"OMP_NUM_THREADS": "2"}), ("fresh", {"WORKBENCH_TEST_SPAWN": ""})):
        wb("train", "cpu-small", "--name", name, "--runs-dir", str(tmp_path), "--detach", "--yes", *long,
           env=env, check=True)
        st = rundir.read_status(tmp_path / name)
        started[name] = st.pid
        t0 = time.monotonic()
        while "step 2/" not in (tmp_path / name / "train.log").read_text() and time.monotonic() - t0 < 120:
            time.sleep(0.2)
        assert "step 2/" in (tmp_path / name / "train.log").read_text()
        assert os.getsid(st.pid) == st.pid  # a session of its own: closing the terminal does not stop it
        if name == "forked":
            server = spawner._proc.pid if spawner._proc else None
            if server is not None:
                assert _ppid(st.pid) == server
            # torch's intra-op pool as the command's OMP_NUM_THREADS sets it (the server itself runs one thread)
            threads = int(open(f"/proc/{st.pid}/status").read().split("Threads:")[1].split()[0])
            assert threads >= 2, threads
        else:
            exe = os.readlink(f"/proc/{st.pid}/exe")
            assert _ppid(st.pid) != (spawner._proc.pid if spawner._proc else -1) and "python" in exe
        assert wb("stop", name, "--runs-dir", str(tmp_path)).returncode == 0
        assert wait_until(lambda: not rundir.pid_alive(st.pid), 30)
    assert started["forked"] != started["fresh"]


def test_the_cli_client_forks_its_commands_from_the_spawn_server_and_reads_them_as_a_popen(tmp_path):
    """`workbench.cli_client.popen` / `run` (the TUI's, the queue's and the benches' commands): under the tests, a
    child of the spawn server with the caller's streams, directory and environment; its output, exit status, a
    signal's status and a timeout as subprocess gives them; with no server named, subprocess's own."""
    import signal
    import sys

    import psutil

    from workbench import cli_client

    argv = [sys.executable, "-m", "workbench", "presets", "list", "--runs-dir", str(tmp_path)]
    forked, fresh = cli_client.run(argv, 60), cli_client.run(argv, 60, env={
        k: v for k, v in os.environ.items() if k != "WORKBENCH_TEST_SPAWN"})
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert "cpu-small" in forked.stdout
    bad = cli_client.run([sys.executable, "-m", "workbench", "train", "cpu-small", "--set", "train.lr=-1",
                          "--runs-dir", str(tmp_path)], 60)
    assert bad.returncode == 2 and bad.stderr.startswith("workbench: error:") and bad.stdout == ""
    # a streaming command through pipes, its parent the spawn server (forked, not a fresh interpreter)
    proc = cli_client.popen([sys.executable, "-m", "workbench", "chat", "nothing-here", "--runs-dir", str(tmp_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    server = psutil.Process(proc.pid).parent()   # the spawn server: started with its socket's path last
    assert isinstance(proc, cli_client.Forked) and server.cmdline()[-1] == os.environ["WORKBENCH_TEST_SPAWN"]
    proc.stdin.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 2 and "nothing-here" in err, err
    # killed: the signal's status, as Popen gives it; past its timeout: TimeoutExpired, the command killed
    long = [sys.executable, "-m", "workbench", "train", "cpu-small", "--name", "long", "--runs-dir", str(tmp_path),
            "--yes", *tiny("train.max_iters=1000000", "train.eval_interval=1000000")]
    proc = cli_client.popen(long, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: (tmp_path / "long" / rundir.STATUS_FILE).is_file() and rundir.read_status(
        tmp_path / "long").state == "running", 60, "the run training")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    with pytest.raises(subprocess.TimeoutExpired):
        cli_client.run([*long[:6], "long2", *long[7:]], 3)
    st = rundir.read_status(tmp_path / "long2")
    wait_until(lambda: not rundir.pid_alive(st.pid), 10, "the timed-out command killed")


def test_a_fresh_trainer_stands_in_for_one_forked_from_the_spawn_server(tmp_path):
    """What torchrun starts for each rank, ``python -m workbench.train RUN`` in a fresh interpreter, under the tests
    stands in for a trainer forked from the spawn server (cli_client.stand_in): the run's pid is that child's, the
    stand-in's SIGTERM reaches it (a checkpoint, then "stopped") and its exit status is the stand-in's; a stand-in
    killed outright takes the trainer with it."""
    import signal
    import sys

    import psutil

    long = tiny("train.max_iters=1000000", "train.eval_interval=1000000", "train.ckpt_interval=1000000")
    wb("train", "cpu-small", "--name", "r", "--runs-dir", str(tmp_path), "--detach", "--yes", *long, check=True)
    d = tmp_path / "r"
    wait_until(lambda: rundir.read_status(d).state == "running", 60, "the run training")
    assert wb("stop", "r", "--runs-dir", str(tmp_path)).returncode == 0
    for sig, code in ((signal.SIGTERM, 0), (signal.SIGKILL, -signal.SIGKILL)):
        last = rundir.read_status(d).pid
        stand_in = subprocess.Popen([sys.executable, "-m", "workbench.train", str(d), "--resume", "--detached"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: (st := rundir.read_status(d)).state == "running" and st.pid != last
                   or stand_in.poll() is not None, 60, "the resumed run training")
        trainer = rundir.read_status(d).pid
        assert trainer != stand_in.pid
        assert psutil.Process(trainer).parent().cmdline()[-1] == os.environ["WORKBENCH_TEST_SPAWN"]
        before = rundir.list_checkpoints(d)[-1]["step"]
        stand_in.send_signal(sig)
        assert stand_in.wait(60) == code
        wait_until(lambda: not rundir.pid_alive(trainer), 30, "the trainer gone with its stand-in")
        if sig == signal.SIGTERM:
            assert rundir.read_status(d).state == "stopped" and rundir.list_checkpoints(d)[-1]["step"] > before
