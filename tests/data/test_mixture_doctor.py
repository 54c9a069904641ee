"""The run doctor on a mixture: a source whose own val loss rises while the mixture's falls."""

from __future__ import annotations

from pathlib import Path

from tests.support.rundirs import RunDir
from workbench.analysis.doctor import diagnose_run
from workbench.config import preset_to_toml, resolve_preset
from workbench.machine.activity import HardwareSnapshot

CPU = {"cpu": {"physical_cores": 2, "logical_cores": 2, "ram_total": 16 * 2**30, "ram_available": 12 * 2**30,
               "native_bf16": False}, "nvidia": [], "mps": False, "cxx": True, "calibration": {"cpu:fp32": 2e10}}
SOURCES = [{"name": "web", "corpus": "builtin", "weight": 0.9}, {"name": "vim", "corpus": "builtin", "weight": 0.1}]


def mixture_run(root: Path, rid: str, vim: list[float]) -> Path:
    """A finished 100-step mixture run whose evals (every 20 steps) have the mixture's val loss falling and vim's
    val loss ``vim``; the train records and the rest as the trainer writes them."""
    p = resolve_preset("cpu-small", ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
                                     "model.seq_len=32", "model.vocab_size=512", "train.batch_size=4",
                                     "train.max_iters=100", "train.eval_interval=20", "hardware.compile=false"],
                       {"data": {"mixture": SOURCES}})
    val = [6.0, 4.5, 4.0, 3.8, 3.7, 3.65]
    with RunDir(root, rid, preset_to_toml(p)) as r:
        r.event("start", 0, device="cpu", precision="fp32", compile=False, params=131_392,
                tokens_per_step=p.tokens_per_step(), train_tokens=10**6, val_tokens=50_000, corpus="mixture",
                peak_flops=2e10, pid=1, world_size=1,
                mixture={"sources": [{"name": "web", "weight": 0.9, "repeats": 0.1},
                                     {"name": "vim", "weight": 0.1, "repeats": 6.0}]})
        for s in range(1, 101):
            r.train(s, 6.0 - s * 0.025, tokens_per_s=5000.0 if s > 1 else None, tokens_seen=s * p.tokens_per_step(),
                    elapsed_s=s * 0.1, skipped=0, time=1.7e9 + s, mem_mb=300.0,
                    memory={"mem_rss_mb": 300.0, "mem_peak_rss_mb": 300.0})
            if s % 20 == 0 or s == 1:
                i = s // 20
                r.eval(s if s > 1 else 0, val[i] - 0.05, val[i],
                       extra={"val_sources": {"web": val[i] - 0.02, "vim": vim[i]}})
        r.status(state="finished", step=100, max_iters=100, pid=1)
    return r.path


def test_a_source_rising_while_the_mixture_falls_is_named_with_its_numbers(tmp_path):
    d = mixture_run(tmp_path, "rises", [6.0, 5.0, 4.6, 4.7, 4.8, 4.9])
    [f] = [f for f in diagnose_run(d, HardwareSnapshot(info=CPU, activity=None)) if f.kind == "data"
           and f.code == "data.mixture_source_rises"]
    assert f.title == "the val loss of source 'vim' rises while the mixture's falls" and f.step == 40
    assert f.evidence[0] == "source 'vim': val loss 4.600 at step 40 (its best), 4.900 at step 100 (+0.300)"
    assert f.evidence[1] == "the mixture's val loss 4.000 -> 3.650 over the same steps"
    assert "its weight is 0.1 (10% of the sequences)" in f.evidence[2]
    assert f.change.startswith("raise the weight of 'vim'") and "0.1 -> 0.2" in f.change and "--remix" in f.change
    assert any("repeated 6.0 times" in a for a in f.also)


def test_sources_that_keep_falling_or_wobble_within_the_noise_are_not_a_finding(tmp_path):
    for rid, vim in (("falls", [6.0, 5.0, 4.6, 4.5, 4.45, 4.4]), ("noise", [6.0, 5.0, 4.6, 4.65, 4.62, 4.68])):
        d = mixture_run(tmp_path, rid, vim)
        assert not [f for f in diagnose_run(d, HardwareSnapshot(info=CPU, activity=None))
                    if f.code == "data.mixture_source_rises"]
