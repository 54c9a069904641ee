"""Several runs at once (`queue run --slots N`, one run a GPU): the placement rule on described machines (the GPU
table's cards, as the `auto` tests describe them), and two real tiny runs side by side on this CPU machine, each
with its share of the cores."""

from __future__ import annotations

import json
import threading
import tomllib

import pytest

from tests.support.cli import TINY, wb
from workbench.machine.detect import detect_cpu
from workbench.machine.gpus import find_gpu
from workbench.queue.devices import (
    Device,
    Need,
    Placement,
    cpu_placement,
    gpu_placement,
    inventory,
    never_fits,
    place,
)
from workbench.queue.runner import Runner
from workbench.queue.store import NewItem, QueueStore


def card(index: int, name: str, used_mib: float = 0.0) -> Device:
    total = find_gpu(name).memory_bytes / 2**20
    return Device(index, find_gpu(name).name, total, total - used_mib)


def four_a100() -> list[Device]:
    return [card(i, "A100 80GB") for i in range(4)]


def test_a_sweep_of_single_gpu_trials_takes_one_gpu_each_until_all_four_are_held():
    devs = four_a100()
    held: set[int] = set()
    taken = []
    for _ in range(5):  # five single-GPU trials on four GPUs: the fifth waits
        got = place(Need(1, 20_000), devs, held)
        taken.append(got)
        if got:
            held |= set(got)
    assert taken[:4] == [(0,), (1,), (2,), (3,)] and taken[4] is None
    held.discard(2)  # trial on GPU 2 ends: the waiting one takes it
    assert place(Need(1, 20_000), devs, held) == (2,)


def test_two_gpu_runs_take_two_free_gpus_and_wait_when_only_one_is_free():
    devs = four_a100()
    first = place(Need(2, 30_000), devs, set())
    second = place(Need(2, 30_000), devs, set(first or ()))
    assert first == (0, 1) and second == (2, 3)
    assert place(Need(2, 30_000), devs, {0, 1, 2}) is None          # one free GPU: a 2-GPU run waits
    assert place(Need(1, 30_000), devs, {0, 1, 2}) == (3,)          # (a 1-GPU run would go)
    p = gpu_placement((2, 3), cores=32, runs=4)
    assert p.env["CUDA_VISIBLE_DEVICES"] == "2,3" and p.env["OMP_NUM_THREADS"] == "8"
    assert p.sets == ("hardware.nproc=2",) and p.label == "gpu 2,3"


def test_a_run_goes_where_its_memory_is_free_the_fullest_that_fits_first_and_waits_when_none_fits():
    # a mixed box: an outside process holds 70 GB of GPU 0; GPU 1 is a 24 GB card
    devs = [card(0, "A100 80GB", used_mib=70_000), card(1, "RTX 4090"), card(2, "A100 80GB")]
    assert place(Need(1, 8_000), devs, set()) == (0,)      # ~11 GB free on GPU 0 fits 8 GB: the big ones stay free
    assert place(Need(1, 20_000), devs, set()) == (1,)     # the 24 GB card before the 80 GB one
    assert place(Need(1, 40_000), devs, set()) == (2,)
    assert place(Need(1, 40_000), devs, {2}) is None       # only GPU 2 fits it: taken, so it waits
    assert never_fits(Need(1, 40_000), devs) is None       # ... for GPU 2 (it can run here)
    assert "largest here has 81,920 MiB" in (never_fits(Need(1, 100_000), devs) or "")
    assert "this machine has 3" in (never_fits(Need(4, None), devs) or "")
    assert place(Need(1, None), devs, {0, 1}) == (2,)     # unknown need: any free GPU


def test_the_inventory_comes_from_the_machine_detection_and_cpu_slots_divide_the_cores():
    info = {"nvidia": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "vram_total": 80 * 2**30,
                        "vram_free": 60 * 2**30}]}
    assert inventory(info) == [Device(0, "NVIDIA H100 80GB HBM3", 81920.0, 61440.0)]
    assert inventory({"nvidia": []}) == []
    p = cpu_placement(2, 2, cores=8)
    assert p.env == {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"} and p.label == "cpu slot 2/2 (4 threads)"
    assert cpu_placement(1, 3, cores=2).env["OMP_NUM_THREADS"] == "1"   # at least one thread each
    # the queue's --set values give way to the run's own
    assert p.sets_for(("hardware.num_threads=2", "train.lr=1e-3")) == ("hardware.nproc=1",)
    assert Placement("cpu").sets_for(()) == ()


def test_the_runner_places_queued_runs_by_their_estimate_on_a_described_two_gpu_machine(tmp_path):
    gpu = {"name": "NVIDIA A100-SXM4-80GB", "vram_total": 80 * 2**30, "vram_free": 80 * 2**30,
           "compute_capability": "8.0"}
    info = {"nvidia": [dict(gpu, index=0), dict(gpu, index=1)], "cpu": {"physical_cores": 16}}
    root = tmp_path / "runs"
    store = QueueStore(root)
    one = store.add(NewItem("cpu-small", tuple(TINY), name="one"))
    two = store.add(NewItem("cpu-small", (*TINY, "hardware.nproc=2"), name="two"))
    four = store.add(NewItem("cpu-small", (*TINY, "hardware.nproc=4"), name="four"))
    r = Runner(root, log=lambda m: None, info=info, devices=inventory(info))
    need = r.need(one)
    assert need.gpus == 1 and need.mib is not None and 0 < need.mib < 80 * 1024   # the planner's estimate
    p, never = r.place(one, cap=2)
    assert never is None and p is not None and p.gpus == (0,)   # equal GPUs: the first
    assert p.env["CUDA_VISIBLE_DEVICES"] == str(p.gpus[0]) and p.env["OMP_NUM_THREADS"] == "8"
    r.active[one.id] = (threading.Thread(), p)     # `one` holds its GPU
    assert r.place(two, cap=2) == (None, None)     # a 2-GPU run waits for both
    del r.active[one.id]
    p2, _ = r.place(two, cap=2)
    assert p2 is not None and p2.gpus == (0, 1) and p2.sets == ("hardware.nproc=2",)
    assert "this machine has 2" in (r.place(four, cap=2)[1] or "")   # never fits: failed, not left waiting
    store.close()
    r.store.close()


def test_a_worker_started_on_one_gpu_trains_its_trials_with_one_process_a_visible_gpu():
    from workbench.queue.distributed import visible_gpu_sets
    assert visible_gpu_sets({"CUDA_VISIBLE_DEVICES": "3"}, ("train.lr=1e-3",)) == ("hardware.nproc=1",)
    assert visible_gpu_sets({"CUDA_VISIBLE_DEVICES": "0,1"}, ()) == ("hardware.nproc=2",)
    assert visible_gpu_sets({"CUDA_VISIBLE_DEVICES": "0,1"}, ("hardware.nproc=1",)) == ()   # the trial's own wins
    assert visible_gpu_sets({}, ()) == () and visible_gpu_sets({"CUDA_VISIBLE_DEVICES": ""}, ()) == ()


def _add(root, name):
    wb("queue", "add", "cpu-small", "--name", name, "--runs-dir", str(root), "--set", *TINY,
       "train.max_iters=8", "train.eval_interval=4", check=True)


@pytest.mark.slow
def test_two_slots_run_two_tiny_runs_at_once_each_with_its_share_of_the_cores(tmp_path):
    root = tmp_path / "runs"
    _add(root, "left")
    _add(root, "right")
    cp = wb("queue", "run", "--slots", "2", "--runs-dir", str(root), timeout=240, check=True)
    assert "2 CPU slot(s)" in cp.stdout, cp.stdout
    rows = {r["name"]: r for r in json.loads(wb("queue", "ls", "--json", "--runs-dir", str(root),
                                                check=True).stdout)["runs"]}
    assert {n: r["state"] for n, r in rows.items()} == {"left": "finished", "right": "finished"}, cp.stdout
    threads = max(1, (detect_cpu()["physical_cores"] or 1) // 2)
    assert {rows[n]["slot"] for n in rows} == {1, 2}
    for name, r in rows.items():
        assert r["place"] == f"cpu slot {r['slot']}/2 ({threads} thread{'s' if threads > 1 else ''})"
        hw = tomllib.loads((root / name / "preset.toml").read_text())["hardware"]
        assert (hw["nproc"], hw["num_threads"]) == (1, threads)
    # the queue's other run is not a neighbour in the fairness record (only processes outside the queue are)
    for name, other in (("left", "right"), ("right", "left")):
        assert rows[other]["pid"] not in {o["pid"] for o in rows[name]["others"]}, rows[name]["others"]
    # side by side: each started before the other ended
    assert rows["left"]["started"] < rows["right"]["ended"] and rows["right"]["started"] < rows["left"]["ended"]
    # `queue ls` names each run's slot
    text = wb("queue", "ls", "--runs-dir", str(root), check=True).stdout
    assert "cpu slot 1/2" in text and "cpu slot 2/2" in text
    # --slots 0: one line, exit 2
    bad = wb("queue", "run", "--slots", "0", "--runs-dir", str(root))
    assert bad.returncode == 2 and "give 1 or more" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
