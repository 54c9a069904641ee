"""The GPU table and a preset on other GPUs: `workbench estimate PRESET --gpu NAME` and `--compare`."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import G124, wb
from workbench.cli import main
from workbench.config import preset_paths, resolve_preset
from workbench.errors import WorkbenchError
from workbench.machine.detect import Gpu, Machine
from workbench.machine.gpus import GPUS, compare_set, find_gpu, spec_for_device
from workbench.machine.peaks import peak_flops
from workbench.plan import throughput
from workbench.plan.compare import compare, gpu_report, load_prices, machine_with, parse_price
from workbench.plan.fit.memory import HEADROOM, estimate_memory, what_if

GiB = 2**30
SHIPPED = sorted(preset_paths())
# G124 (tests/conftest.py) measured on an H100: 467,315 tokens/s at 40.6 % MFU (README)


# ----------------------------------------------------------------------------- the table

def test_the_table_loads_and_every_entry_has_a_source():
    assert len(GPUS) >= 40
    assert len({g.name for g in GPUS}) == len(GPUS), "names are unique"
    for g in GPUS:
        assert g.source.strip(), g.name
        assert g.device in ("cuda", "mps"), g.name
        assert g.memory_gib > 0 and g.fp32 > 0 and g.bandwidth_gbs > 0 and g.power_w > 0, g.name
        assert g.fp16 is not None, g.name  # every GPU here does fp16 (the T4 and V100 lack bf16 only)
        if g.device == "cuda":
            assert g.match and g.compute_capability, g.name
            assert (g.bf16 is None) == (g.compute_capability < (8, 0)), g.name  # bf16 from Ampere on
        else:
            assert not g.match and g.compute_capability is None, g.name
    # the classes the issue names
    for name in ("RTX 3060 12GB", "RTX 4060 8GB", "RTX 5060 8GB", "RTX 4070 Ti SUPER 16GB", "RTX 4090 24GB",
                 "RTX 5090 32GB", "L4 24GB", "A10G 24GB", "A100 40GB", "A100 80GB", "H100 SXM 80GB", "H200 141GB"):
        assert find_gpu(name).name == name
        assert find_gpu(name).compare
    assert find_gpu("4070 Ti 16GB").name == "RTX 4070 Ti SUPER 16GB"  # the 16 GB 4070 Ti is the SUPER
    apple = [g for g in GPUS if g.device == "mps"]
    for chip in ("M2", "M3", "M4"):
        assert any(g.name.startswith(f"Apple {chip} ") for g in apple), chip
    for gb in (16, 24, 36, 48, 64, 128):
        assert any(g.memory_gib == gb for g in apple), gb
        assert any(g.memory_gib == gb for g in compare_set() if g.device == "mps"), gb


def test_peaks_come_from_the_table_by_the_device_name():
    assert peak_flops("NVIDIA GeForce RTX 4070 Ti SUPER", "bf16") == 88.2e12  # not the plain 4070 Ti's 80.2
    assert peak_flops("NVIDIA GeForce RTX 4070 Ti", "bf16") == 80.2e12
    assert peak_flops("NVIDIA A10G", "bf16") == 70e12 and peak_flops("NVIDIA A10", "bf16") == 125e12
    assert peak_flops("NVIDIA RTX A4000", "bf16") is None  # "A40" is not a word of that name
    assert spec_for_device("NVIDIA GH200 480GB").name == "GH200 96GB"
    assert spec_for_device("NVIDIA A100-SXM4-80GB").name == "A100 80GB"
    assert spec_for_device("NVIDIA A100-SXM4-40GB").name == "A100 40GB"
    assert spec_for_device("NVIDIA H100 80GB HBM3").name == "H100 SXM 80GB"
    for g in GPUS:  # every NVIDIA entry is found by its own name
        if g.device == "cuda":
            assert peak_flops(f"NVIDIA {g.name}", "fp32") == g.fp32 * 1e12, g.name


@pytest.mark.parametrize("typed,name", [
    ("4090", "RTX 4090 24GB"), ("rtx-4090", "RTX 4090 24GB"), ("H100", "H100 SXM 80GB"),
    ("h100 pcie", "H100 PCIe 80GB"), ("a100-80gb", "A100 80GB"), ("L4", "L4 24GB"), ("A10", "A10 24GB"),
    ("4070 Ti", "RTX 4070 Ti 12GB"), ("NVIDIA GeForce RTX 5060", "RTX 5060 8GB"), ("m4 max 64gb", "Apple M4 Max 64GB"),
])
def test_gpu_names_as_users_type_them(typed, name):
    assert find_gpu(typed).name == name


def test_unknown_and_ambiguous_gpu_names_say_what_was_meant():
    with pytest.raises(WorkbenchError, match=r"unknown GPU 'H1000'; did you mean 'H100 SXM 80GB'"):
        find_gpu("H1000")
    with pytest.raises(WorkbenchError, match=r"'A100' is ambiguous: A100 40GB, A100 80GB"):
        find_gpu("A100")


# ----------------------------------------------------------------------------- --compare

@pytest.mark.parametrize("name", SHIPPED)
def test_compare_says_fits_exactly_where_the_estimate_is_below_the_memory(name):
    p = resolve_preset(name)
    result = compare(p)
    assert [r["gpu"] for r in result["rows"]] and len(result["rows"]) == len(compare_set())
    for r in result["rows"]:
        g = find_gpu(r["gpu"])
        if g.device == "cuda":  # the machine written by hand, as a test of the machine compare builds
            machine = Machine(gpus=(Gpu(0, g.name, g.memory_bytes, None, g.compute_capability),))
            usable = g.memory_bytes
        else:
            machine = Machine(mps=True, ram_total=g.memory_bytes, ram_available=g.memory_bytes)
            usable = int(g.memory_bytes * 2 / 3)
        assert r["available"] == usable
        precision = "fp16" if p.hardware.precision == "bf16" and g.bf16 is None else None
        assert r["estimate"] == estimate_memory(what_if(p, device=g.device, precision=precision),
                                                machine=machine).total, (name, g.name)
        assert r["fits"] == (r["estimate"] <= (1 - HEADROOM) * usable), (name, g.name)
        # the micro-batch `fit` would choose: the preset's own batch or more where it fits, less where not
        batch = min(p.train.batch_size, p.train.batch_size * p.train.grad_accum)
        assert (r["fit_batch"] >= batch) == r["fits"], (name, g.name, r["fit_batch"])
        if r["fit_batch"]:
            assert r["batch_size"] * r["grad_accum"] * p.model.seq_len >= 0.9 * p.tokens_per_step()
        # ... and it is the largest that fits: it fits, and one more (below the preset's sequences a step) does not
        seqs = p.train.batch_size * p.train.grad_accum
        for b, fits in ((r["fit_batch"], True), (r["fit_batch"] + 1, False)):
            if 1 <= b <= seqs:
                q = what_if(p, device=g.device, precision=precision, batch_size=b)
                total = estimate_memory(q, machine=machine_with(g)).total
                assert (total <= (1 - HEADROOM) * usable) == fits, (name, g.name, b, fits)
        assert (r["time_s"] is not None) == (r["fit_batch"] > 0 and r["tokens_per_s"] is not None)


def test_the_big_preset_fits_the_big_gpus_only():
    rows = {r["gpu"]: r for r in compare(resolve_preset("datacenter-80gb"))["rows"]}
    assert rows["H100 SXM 80GB"]["fits"] and rows["A100 80GB"]["fits"]
    assert not rows["RTX 4060 8GB"]["fits"] and rows["RTX 4060 8GB"]["fit_batch"] == 0
    assert rows["RTX 4060 8GB"]["time_s"] is None
    # a 24 GB card: auto's memory savers (the fused loss and activation checkpointing) make it fit as shipped,
    # and a larger micro-batch fits with them (fewer accumulation steps)
    assert rows["RTX 4090 24GB"]["fits"] and rows["RTX 4090 24GB"]["fit_batch"] > 16
    assert rows["RTX 4090 24GB"]["compile_mode"] == "per block"
    assert rows["H100 SXM 80GB"]["compile_mode"] == "whole model"


def test_a_prices_file_changes_only_the_cost_column(tmp_path):
    f = tmp_path / "prices.toml"
    f.write_text('# $ per GPU-hour\n"H100" = 2.49\n"RTX 4090" = 0.69\n"a100-80gb" = 1.79\n')
    p = resolve_preset("gpu-24gb")
    plain, priced = compare(p), compare(p, prices=load_prices(f))
    assert [r["gpu"] for r in plain["rows"]] == [r["gpu"] for r in priced["rows"]]
    prices = {"H100 SXM 80GB": 2.49, "RTX 4090 24GB": 0.69, "A100 80GB": 1.79}
    for a, b in zip(plain["rows"], priced["rows"]):
        assert {k: v for k, v in a.items() if k not in ("usd", "usd_per_hour")} == \
               {k: v for k, v in b.items() if k not in ("usd", "usd_per_hour")}
        assert a["usd"] is None
        if b["gpu"] in prices:
            assert b["usd"] == pytest.approx(b["time_s"] / 3600 * prices[b["gpu"]])
        else:
            assert b["usd"] is None
    # sorted by cost: the priced rows first, cheapest first
    by_cost = compare(p, prices=prices, sort="cost")["rows"]
    assert [r["gpu"] for r in by_cost[:3]] == sorted(prices, key=lambda n: next(
        r["usd"] for r in priced["rows"] if r["gpu"] == n))


def test_prices_from_the_command_line_and_a_table_in_the_file(tmp_path):
    assert parse_price("H100=2.49") == ("H100 SXM 80GB", 2.49)
    assert parse_price("rtx 4090 = 0.7") == ("RTX 4090 24GB", 0.7)
    f = tmp_path / "p.toml"
    f.write_text('[usd_per_hour]\n"L4" = 0.8\n')
    assert load_prices(f) == {"L4 24GB": 0.8}


# ----------------------------------------------------------------------------- --gpu and throughput

def test_the_124m_config_on_an_h100_reproduces_the_measured_tokens_per_s():
    p = resolve_preset("gpu-8gb", G124)
    h100 = find_gpu("H100")
    given = gpu_report(p, h100, mfu=0.406)
    assert given.tokens_per_s == pytest.approx(467_315, rel=0.10)
    assert given.tokens_per_s == pytest.approx(467_315, rel=0.01)  # the same FLOPs convention and peak
    # without --mfu the measurement itself is found: the same model, batch and compile mode on that GPU
    measured = gpu_report(p, h100)
    assert measured.on_gpu and measured.on_gpu.mfu and measured.on_gpu.mfu["basis"] == "measured"
    assert measured.tokens_per_s == pytest.approx(467_315)
    assert measured.settings.compile_mode == "whole model"
    # on another GPU: the same MFU, that GPU's peak
    a100 = gpu_report(p, find_gpu("A100 80GB"))
    assert a100.on_gpu and a100.on_gpu.mfu and a100.on_gpu.mfu["basis"] == "measured elsewhere"
    assert a100.tokens_per_s == pytest.approx(467_315 * 312 / 989)


@pytest.mark.parametrize("device_name,table_name", [("NVIDIA H100 80GB HBM3", "H100"),
                                                    ("NVIDIA GeForce RTX 4090", "4090")])
def test_this_machines_gpu_gets_the_same_estimate_as_gpu_name(device_name, table_name):
    from workbench.plan.report import build_report
    gpu = find_gpu(table_name)
    here = Machine(gpus=(Gpu(0, device_name, gpu.memory_bytes, None, gpu.compute_capability),))
    p = resolve_preset("gpu-24gb")
    assert build_report(p, here).tokens_per_s == pytest.approx(gpu_report(p, gpu).tokens_per_s)


def test_other_setups_scale_the_measurement_compiled_the_same_way():
    p = resolve_preset("gpu-24gb")  # activation checkpointing: compiled per block, like gpu-8gb's measurement
    r = gpu_report(p, find_gpu("4090"))
    mfu = r.on_gpu.mfu if r.on_gpu else None
    assert mfu and mfu["basis"] == "scaled" and r.settings.compile_mode == "per block"
    ref = [m for m in throughput.MEASUREMENTS if m.compile_mode == "per block"][0]
    expected = ref.mfu(989e12) * (r.params["total"] / ref.params) ** throughput.SIZE_EXPONENT
    assert mfu["value"] == pytest.approx(expected)
    assert r.fits and r.available == 24 * GiB
    assert r.cost and r.cost.watts == 450 and "typical power" in (r.cost.watts_source or "")


def test_a_gpu_without_bf16_runs_fp16_and_a_mac_gives_mps_two_thirds():
    t4 = gpu_report(resolve_preset("datacenter-80gb"), find_gpu("T4"))
    assert t4.settings.precision == "fp16" and t4.settings.grad_scaler and t4.on_gpu
    assert "no bf16" in t4.on_gpu.note
    mac = gpu_report(resolve_preset("apple-m4pro"), find_gpu("M4 Pro 48GB"))
    assert mac.settings.device == "mps" and mac.available == int(48 * GiB * 2 / 3)
    assert mac.tokens_per_s and mac.on_gpu and mac.on_gpu.mfu and mac.on_gpu.mfu["why"].startswith("MPS unmeasured")


# ----------------------------------------------------------------------------- the command

def test_compare_json_and_text(capsys):
    assert main(["estimate", "gpu-8gb", "--compare", "--json", "--usd-per-hour", "H100=2.49"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == len(compare_set()) and out["prices"] == {"H100 SXM 80GB": 2.49}
    assert main(["estimate", "medium", "--compare", "--gpu", "4090", "--gpu", "m4 max 64gb", "--mfu", "0.3"]) == 0
    text = capsys.readouterr().out
    assert "RTX 4090 24GB" in text and "Apple M4 Max 64GB" in text and "30.0 % for every GPU" in text
    assert "H100" not in text.split("MFU:")[0]


def test_estimate_on_one_gpu(capsys):
    assert main(["estimate", "gpu-8gb", "--gpu", "rtx 4060", "--usd-per-hour", "0.2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("as if on RTX 4060 8GB (GPU table: 8 GiB, 30.2 TFLOPS bf16")
    assert "fit: fits:" in out and "RTX 4060 8GB total VRAM" in out and "cost $" in out


def test_hw_lists_the_table(capsys):
    assert main(["hw", "--gpus"]) == 0
    out = capsys.readouterr().out
    assert "RTX 4090 24GB" in out and "NVIDIA H100 Tensor Core GPU datasheet" in out
    assert main(["hw", "--gpus", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == len(GPUS)


def _bad_prices(tmp_path, name: str, text: str) -> str:
    f = tmp_path / f"{name}.toml"
    f.write_text(text)
    return str(f)


@pytest.mark.parametrize("args,message", [
    (["--gpu", "H1000"], "unknown GPU 'H1000'; did you mean 'H100 SXM 80GB'"),
    (["--compare", "--gpu", "rtx9090"], "unknown GPU 'rtx9090'; did you mean 'RTX 5090 32GB'"),
    (["--gpu", "A100"], "'A100' is ambiguous"),
    (["--compare", "--usd-per-hour", "H100=abc"], "'abc' is not a number of dollars per hour"),
    (["--compare", "--usd-per-hour", "H100=-1"], "must be a number of dollars >= 0"),
    (["--compare", "--usd-per-hour", "=2"], "write NAME=PRICE"),
    (["--compare", "--usd-per-hour", "2"], "needs a GPU name"),
    (["--compare", "--usd-per-hour", "H100"], "write PRICE"),
    (["--compare", "--prices", "{bad_toml}"], "is not valid TOML"),
    (["--compare", "--prices", "{bad_value}"], "the price of '4090' must be a number of dollars"),
    (["--compare", "--prices", "{bad_name}"], "unknown GPU 'H1000'"),
    (["--compare", "--prices", "{missing}"], "cannot read prices file"),
    (["--compare", "--sort", "cost"], "--sort cost needs prices"),
    (["--compare", "--mfu", "2"], "--mfu 2 must be a fraction"),
    (["--compare", "--mfu", "lots"], "--mfu 'lots' is not a number"),
    (["--gpu", "4090", "--device", "cuda"], "--device does not go with --gpu"),
    (["--gpu", "4090", "--gpu", "H100"], "add --compare"),
    (["--mfu", "0.3"], "--mfu goes with --gpu NAME or --compare"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    files = {"bad_toml": _bad_prices(tmp_path, "bad_toml", '"H100" = 2\nnot toml\n'),
             "bad_value": _bad_prices(tmp_path, "bad_value", '"4090" = "cheap"\n'),
             "bad_name": _bad_prices(tmp_path, "bad_name", '"H1000" = 2\n'),
             "missing": str(tmp_path / "nope.toml")}
    args = [a.format(**files) if a.startswith("{") else a for a in args]
    assert main(["estimate", "gpu-8gb", *args]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.count("\n") == 1 and cap.err.startswith("workbench: error: "), cap.err
    assert message in cap.err


def test_the_real_command_answers_bad_input_with_one_line():
    cp = wb("estimate", "gpu-8gb", "--compare", "--usd-per-hour", "H100=two")
    assert cp.returncode == 2 and cp.stdout == ""
    assert cp.stderr.strip().splitlines() == [
        "workbench: error: --usd-per-hour 'H100=two': 'two' is not a number of dollars per hour"]


def test_the_estimate_names_the_optimizer_whose_states_it_counts():
    """cpu-small ships Muon + AdamW: the report says so, and its states are Muon's one buffer per hidden matrix
    plus AdamW's two for the rest, smaller than AdamW's two for everything."""
    muon = wb("estimate", "cpu-small", "--no-calibrate", check=True).stdout
    adamw = wb("estimate", "cpu-small", "--no-calibrate", "--set", "train.optimizer=adamw", check=True).stdout
    assert "Muon + AdamW fused" in muon and "optimizer states (Muon + AdamW)" in muon, muon
    assert "Muon" not in adamw and "optimizer states (AdamW, 2 x fp32)" in adamw, adamw
    as_json = [json.loads(wb("estimate", "cpu-small", "--no-calibrate", "--json", *extra, check=True).stdout)
               for extra in ([], ["--set", "train.optimizer=adamw"])]
    assert [r["optimizer"] for r in as_json] == ["muon", "adamw"]
    assert as_json[0]["memory"]["components"]["optimizer"] < as_json[1]["memory"]["components"]["optimizer"]
