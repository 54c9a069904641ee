"""Starting trainers: in this process (foreground) or detached in their own session, alone or
under torchrun. The trainer itself is ``python -m workbench.train RUN_DIR``; the TUI starts runs
through the CLI (``workbench train --detach``), never through this module.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from workbench import cli_client, rundir
from workbench.config import Preset
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine
from workbench.plan.settings import resolve_settings

if TYPE_CHECKING:  # (torch: only where a run trains in this process)
    from workbench.train.loop import Trainer


@dataclass
class Topology:
    """How many trainer processes, where: ``--nproc`` on each of ``--nnodes`` machines."""
    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @property
    def distributed(self) -> bool:
        return self.nproc * self.nnodes > 1


def add_topology_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=None, help="processes on this machine (default: hardware.nproc)")
    p.add_argument("--nnodes", type=int, default=1, help="machines taking part (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this machine's rank, 0 .. nnodes-1")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of the node-rank-0 machine")
    p.add_argument("--master-port", type=int, default=29500, help="its rendezvous port")


def topology_from_args(args: argparse.Namespace, preset: Preset, machine: Machine) -> Topology:
    """Processes per machine (``--nproc``, else the process layout the run's settings decide) and the machines."""
    if args.nproc:
        nproc, why = args.nproc, "--nproc"
    else:
        s = resolve_settings(preset, machine)
        nproc, why = s.nproc, s.nproc_reason
        if not preset.hardware.nproc:
            print(f"process layout: {nproc} process{'es' if nproc > 1 else ''} ({why}; hardware.nproc = 0 is auto)")
    t = Topology(nproc=nproc, nnodes=args.nnodes, node_rank=args.node_rank,
                 master_addr=args.master_addr, master_port=args.master_port)
    if t.nproc < 1 or t.nnodes < 1 or not 0 <= t.node_rank < t.nnodes:
        raise rundir.RunError(f"--nproc {t.nproc}, --nnodes {t.nnodes}, --node-rank {t.node_rank}: need nproc >= 1, "
                              "nnodes >= 1 and 0 <= node-rank < nnodes")
    world = t.nproc * t.nnodes
    if preset.train.batch_size % world:
        raise rundir.RunError(f"train.batch_size = {preset.train.batch_size} does not split over {world} processes "
                              f"({why}); use a batch size that is a multiple of {world}")
    return t


def trainer_command(run_dir: Path, topo: Topology, resume: bool, checkpoint: str | None,
                    detached: bool) -> list[str]:
    """``python -m workbench.train RUN`` directly, or under torchrun for several processes."""
    cmd = [sys.executable]
    if topo.distributed:
        cmd += ["-m", "torch.distributed.run", f"--nproc-per-node={topo.nproc}"]
        if topo.nnodes == 1:
            cmd += ["--standalone"]
        else:
            cmd += [f"--nnodes={topo.nnodes}", f"--node-rank={topo.node_rank}",
                    f"--master-addr={topo.master_addr}", f"--master-port={topo.master_port}"]
    cmd += ["-m", "workbench.train", str(run_dir)]
    if detached:
        cmd.append("--detached")
    if resume:
        cmd.append("--resume")
        if checkpoint:
            cmd += ["--checkpoint", str(checkpoint)]
    return cmd


class TrainingFailed(WorkbenchError):
    exit_code = 1


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default, set here so it does not warn every run
    return env


def start_detached(run_dir: Path, resume: bool = False, checkpoint: str | None = None,
                   topo: Topology | None = None) -> int:
    """Start the trainer in a new session (closing a terminal or the TUI does not stop it)."""
    topo = topo or Topology()
    cmd = trainer_command(run_dir, topo, resume, checkpoint, detached=True)
    env = _env() if topo.distributed else dict(os.environ, PYTHONUNBUFFERED="1")
    pid = cli_client.spawn_detached(cmd, Path(run_dir) / rundir.LOG_FILE, env)
    if pid is None:
        log = open(Path(run_dir) / rundir.LOG_FILE, "a", encoding="utf-8")
        pid = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, env=env, close_fds=True).pid
        log.close()
    rundir.write_status(run_dir, state="starting", pid=pid, pid_start=rundir.process_start_time(pid), error=None)
    return pid


# A foreground run stopped by Ctrl-C exits as shells expect of an interrupted command, 128 + SIGINT, once its
# checkpoint is saved: `workbench train ... && next` does not go on to `next`.
INTERRUPTED_EXIT = 128 + signal.SIGINT


def run_foreground(run_dir: Path, resume: bool = False, checkpoint: str | None = None,
                   topo: Topology | None = None) -> int:
    topo = topo or Topology()
    if not topo.distributed:
        trainer = _foreground_trainer(Path(run_dir), resume, checkpoint)
        rc = trainer.run()
        return INTERRUPTED_EXIT if rc == 0 and trainer.interrupted else rc
    # Several processes: torchrun in this terminal's process group, so Ctrl-C reaches every rank
    # (each finishes its step; rank 0 saves) and torchrun. (Under the tests, cli_client forks it from their spawn
    # server.)
    cmd = trainer_command(run_dir, topo, resume, checkpoint, detached=False)
    proc = cli_client.popen(cmd, env=_env())
    interrupted = False
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        interrupted = True
        rc = proc.wait()
    if rc != 0:
        st = rundir.read_status(run_dir)
        raise TrainingFailed(st.error or f"the trainer processes exited with status {rc}; see train.log")
    return INTERRUPTED_EXIT if interrupted else 0


def _foreground_trainer(run_dir: Path, resume: bool, checkpoint: str | None) -> Trainer:
    """The trainer in this process, which remembers whether a Ctrl-C (SIGINT, not `workbench stop`'s SIGTERM)
    stopped it, for the exit status."""
    from workbench.train.loop import Trainer  # imports torch

    class ForegroundTrainer(Trainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.interrupted = False

        def _on_signal(self, signum: int, frame: FrameType | None) -> None:
            self.interrupted = self.interrupted or signum == signal.SIGINT
            super()._on_signal(signum, frame)

    return ForegroundTrainer(run_dir, resume=resume, checkpoint=checkpoint, echo=True)
