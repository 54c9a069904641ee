"""README claims about the CLI that no other test held it to, each through the real command in a subprocess
on real tiny runs: `train`'s refusal of a run that does not fit (and --yes / the prompt), Ctrl-C saving a
checkpoint, `train` with no preset, `resume --checkpoint best --name`, `--init-from RUN:best`, `data prepare`'s
output, `--preset`, `--workers` and --json, `import --seq-len` of a sharded model, `export --gguf-type f32`,
`estimate --usd-per-kwh`, `--sort`, tokens/s from a previous run, `fit --init-from`, symbolic links and sorted
globs in a corpus, touched files reusing their tokens, and the shipped presets' sizes and defaults."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import REPO, tiny, wb
from tests.support.runs import losses, read_jsonl, tree, wait_until
from workbench import rundir
from workbench.fmt import human_bytes
from workbench.machine.rates import BUSY_SHARE

# ----------------------------------------------------------------------------- one run several tests read

# The learning rate warms up to 1.0 and stays there: val loss improves at the first evals, then gets worse, so
# the best checkpoint is an early one (tests/train/test_resume.py's retention run), saved at an eval step between
# the interval checkpoints (milestones: every 4th step kept), so it is neither the first checkpoint nor the latest.
SRC = tiny("train.max_iters=20", "train.ckpt_interval=4", "train.eval_interval=3", "train.keep_last=2",
           "train.milestone_interval=4", "train.lr=1.0", "train.min_lr=1.0", "train.warmup_iters=12",
           "train.patience=0", "train.sample_prompt=''", "hardware.device=cpu")


@dataclass
class Src:
    root: Path
    dir: Path
    best: int       # the step of the best checkpoint (lowest val loss), not the latest
    latest: int


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Src:
    root = tmp_path_factory.mktemp("runs")
    wb("train", "cpu-small", "--name", "src", "--runs-dir", str(root), *SRC, check=True)
    d = root / "src"
    evals = [r for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "eval" and r["step"] > 0]
    best = min(evals, key=lambda r: (r["val_loss"], -r["step"]))["step"]
    steps = [c["step"] for c in rundir.list_checkpoints(d)]
    assert best in steps and steps[0] < best < steps[-1] == 20, (best, steps)
    return Src(root, d, best, steps[-1])


def _eval_at(run_dir: Path, step: int) -> dict:
    return next(r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "eval" and r["step"] == step)


# ----------------------------------------------------------------------------- 1. train refuses what does not fit

# 65,536 sequences of 256 tokens in one micro-batch: ~1.8 TiB by the estimate, more than any machine here. The
# corpus does not exist, and it is read only after the fit check: a run let through fails on it, with nothing
# trained (a run refused never gets there).
BIG = ["train.batch_size=65536", "hardware.compile=false"]
ESTIMATE = re.compile(r"estimate: does not fit: ~[\d.]+ [GT]iB of [\d.]+ GiB available RAM "
                      r"\(estimate, 10% kept free\); "
                      r"try --set train\.batch_size=(\d+) train\.grad_accum=(\d+) \(same tokens per step\); "
                      r"`workbench fit` writes it; .+")  # then the time: measured, estimated, or unknown yet
REFUSED = re.compile(r"workbench: error: cpu-small does not fit this machine's memory by the estimate \(--set "
                     r"train\.batch_size=\d+ train\.grad_accum=\d+ \(same tokens per step\); `workbench fit` writes "
                     r"it\); start it anyway with --yes, or `workbench fit` a preset that fits")


def _train_big(root: Path, *extra: str, answer: bytes | None = None) -> subprocess.CompletedProcess:
    """`train` of the too-big run; ``answer``: typed at a terminal (stdin a pty), else stdin is not a terminal."""
    argv = [sys.executable, "-m", "workbench", "train", "cpu-small", "--name", "big", "--runs-dir", str(root),
            "--corpus", str(root / "missing.txt"), *extra, "--set", *BIG]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if answer is None:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(argv, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        os.close(slave)
        os.write(master, answer)
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(master)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _gate(cp: subprocess.CompletedProcess, refused: bool, root: Path) -> None:
    lines = cp.stdout.splitlines()
    m = ESTIMATE.fullmatch(lines[0])
    assert m and int(m.group(1)) * int(m.group(2)) == 65536, cp.stdout
    assert cp.returncode == 2 and len(cp.stderr.splitlines()) == 1, (cp.returncode, cp.stderr)
    if refused:
        assert REFUSED.fullmatch(cp.stderr.strip()), cp.stderr
    else:  # let through: the next step, the corpus, is what stops it
        assert cp.stderr.strip() == (f"workbench: error: corpus '{root / 'missing.txt'}' does not exist; give a "
                                     "text file, a directory of text files, or builtin (the built-in corpus)"), \
            cp.stderr
    assert not (root / "big").exists()


def test_train_refuses_a_run_that_does_not_fit_unless_yes(tmp_path):
    cp = _train_big(tmp_path)  # not a terminal: no question, refused
    _gate(cp, refused=True, root=tmp_path)
    assert "start anyway?" not in cp.stdout
    _gate(_train_big(tmp_path, "--yes"), refused=False, root=tmp_path)


@pytest.mark.parametrize("answer,refused", [(b"n\n", True), (b"\n", True), (b"y\n", False), (b"yes\n", False)])
def test_train_asks_at_the_prompt_on_a_terminal(tmp_path, answer, refused):
    cp = _train_big(tmp_path, answer=answer)
    assert cp.stdout.splitlines()[1:] == ["start anyway? [y/N] "], cp.stdout  # asked, after the estimate
    _gate(cp, refused=refused, root=tmp_path)


# ----------------------------------------------------------------------------- 2. Ctrl-C in the foreground

def _steps_logged(metrics: Path) -> list[int]:
    """The train records' steps in a metrics.jsonl being written (a line not finished yet is not counted)."""
    steps = []
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") == "train":
            steps.append(r["step"])
    return steps


def test_ctrl_c_in_a_foreground_train_saves_a_checkpoint_and_stops(tmp_path):
    argv = [sys.executable, "-m", "workbench", "train", "cpu-small", "--name", "c",
            "--runs-dir", str(tmp_path / "runs"),
            *tiny("train.max_iters=100000", "train.eval_interval=100000", "train.ckpt_interval=100000")]
    d = tmp_path / "runs" / "c"
    with open(tmp_path / "out.txt", "w") as stdout, open(tmp_path / "err.txt", "w") as stderr:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            wait_until(lambda: max(_steps_logged(d / "metrics.jsonl"), default=0) >= 3, 120, "three logged steps")
            proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert proc.returncode == 130, (proc.returncode, err)  # as shells expect of a Ctrl-C, once the checkpoint is saved
    st = rundir.read_status(d)
    trained = [r["step"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "train"]
    assert st.state == "stopped" and st.step == trained[-1] >= 3 and trained == list(range(1, st.step + 1))
    assert [c["step"] for c in rundir.list_checkpoints(d)] == [st.step]  # no interval was reached: the stop's own
    events = [(r["event"], r["step"], r.get("reason")) for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "event"]
    assert events[-3:] == [("checkpoint", st.step, "stop"), ("stop", st.step, None), ("stopped", st.step, None)]
    text = [line.split(" ", 1)[1] for line in out.splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
    assert "received SIGINT: finishing this step, saving a checkpoint, then stopping" in text
    assert text[-1] == f"stopped at step {st.step}", out


# ----------------------------------------------------------------------------- 3. train with no preset

def test_train_without_a_preset_uses_this_machines_recommended_one(tmp_path):
    info = json.loads(wb("hw", "--json", check=True).stdout)
    recommended = info["recommendation"]["preset"]
    if not info["nvidia"] and not info.get("mps"):
        assert recommended == "cpu-small"  # README: "cpu-small on a CPU"
    cp = wb("train", "--runs-dir", str(tmp_path),
            *tiny("train.max_iters=3", "train.eval_interval=3", "train.sample_prompt=''"), check=True)
    [d] = list(tmp_path.iterdir())
    assert re.fullmatch(rf"{re.escape(recommended)}-\d{{8}}-\d{{6}}", d.name), d.name  # <preset>-<date>-<time>
    assert tomllib.loads((d / "preset.toml").read_text())["name"] == recommended
    assert re.fullmatch(r"\d\d:\d\d:\d\d finished at step 3, best val loss [\d.]+", cp.stdout.splitlines()[-1])
    assert rundir.read_status(d).state == "finished"


# ----------------------------------------------------------------------------- 4. resume --checkpoint best --name

def test_resume_checkpoint_best_with_a_name_branches_into_that_run(src):
    root, best = src.root, src.best
    before = tree(src.dir)
    until = max(14, best + 2)  # past the warmup (12)
    cp = wb("resume", "src", "--runs-dir", str(root), "--checkpoint", "best", "--name", "b",
            "--set", f"train.max_iters={until}", check=True)
    lines = cp.stdout.splitlines()
    assert lines[0] == (f"step_{best:07d} is not the latest checkpoint of src (step_{src.latest:07d}): continuing in "
                        "a new run b, which starts from it; src is left as it is")
    assert lines[1] == f"resuming run b from step_{best:07d}"
    b = root / "b"
    assert tomllib.loads((b / "preset.toml").read_text())["parent"] == {"run": "src", "step": best}
    first = read_jsonl(b / "metrics.jsonl")[0]
    assert (first["event"], first["step"], first["parent"]) == ("resume", best, {"run": "src", "step": best})
    assert sorted(losses(b)) == list(range(best + 1, until + 1))
    # the best checkpoint's weights, and the data where the run was then: the step after it, the parent's to the bit
    assert losses(b)[best + 1] == losses(src.dir)[best + 1]
    assert rundir.read_status(b).state == "finished" and rundir.read_status(b).step == until
    assert tree(src.dir) == before  # the run itself is left as it was
    # --name names a branch: resuming the latest continues in place, and a name for it is refused
    cp = wb("resume", "src", "--runs-dir", str(root), "--name", "x")
    assert cp.returncode == 2 and cp.stderr.strip() == (
        "workbench: error: --name names a new run, made when resuming from a checkpoint other than the latest; "
        f"step_{src.latest:07d} is src's latest, so it continues in place")
    assert not (root / "x").exists() and tree(src.dir) == before


# ----------------------------------------------------------------------------- 5. --init-from RUN:best

def test_init_from_run_best_starts_from_the_best_checkpoint(src):
    root, best = src.root, src.best
    cp = wb("train", "cpu-small", "--init-from", "src:best", "--name", "ft", "--runs-dir", str(root),
            *tiny("train.max_iters=3", "train.eval_interval=3", "train.sample_prompt=''"), check=True)
    assert cp.stdout.splitlines()[0] == (
        f"fine-tuning every weight of src step_{best:07d} (run src); model.seq_len 32; adamw lr 0.001 "
        "(a full fine-tune's at most; --set train.lr to change)")  # was the preset's 0.003: issue 53 (0.0003 at first)
    ft = root / "ft"
    preset = tomllib.loads((ft / "preset.toml").read_text())
    assert preset["init"] == {"run": "src", "step": best} and preset["source"] == {"model": "run src"}
    # the source weights hard-linked, not copied
    source = src.dir / "checkpoints" / f"step_{best:07d}" / "model.pt"
    assert (ft / "init" / "model.pt").stat().st_ino == source.stat().st_ino
    # its first eval is the best checkpoint's own (same weights, same tokenizer, same corpus and windows)
    ours, theirs = _eval_at(ft, 0), _eval_at(src.dir, best)
    assert (ours["train_loss"], ours["val_loss"]) == (theirs["train_loss"], theirs["val_loss"])


# ----------------------------------------------------------------------------- 6. data prepare

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
PREPARE_KEYS = {"documents", "tokens", "bytes", "chars", "chars_per_token", "seconds", "mb_per_s", "encode_seconds",
                "encode_mb_per_s", "cached", "vocab_size", "source", "train_tokens", "val_tokens", "cache_dir",
                "workers", "warnings"}


def _notes(path: Path, n: int = 300) -> list[str]:
    import random
    rng = random.Random(0)
    docs = [f"Note {i}: " + " ".join(rng.choice(WORDS) for _ in range(40)) + "\n" for i in range(n)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return docs


def test_data_prepare_prints_the_result_and_takes_preset_and_workers(tmp_path):
    """A user preset gives the vocabulary and [data] (val_fraction 0.25); --workers 1 encodes on one process."""
    docs = _notes(tmp_path / "notes.jsonl")
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "prep.toml").write_text('name = "prep"\n[model]\nvocab_size = 320\nseq_len = 64\n'
                                       "[data]\nval_fraction = 0.25\ntokenizer_sample_mb = 0.1\n")
    env = {"WORKBENCH_PRESETS_DIR": str(presets), "WORKBENCH_CACHE_DIR": str(tmp_path / "cache")}
    cp = wb("data", "prepare", "notes.jsonl", "--preset", "prep", "--workers", "1", cwd=tmp_path, env=env, check=True)
    first, second = cp.stdout.splitlines()[-2:]  # after the preparation's log lines
    m = re.fullmatch(r"train ([\d,]+) tokens, val ([\d,]+) \(the last documents, ~25% of the tokens\); cached in (.+)",
                     second)
    assert m, cp.stdout
    n_train, n_val, cache_dir = int(m.group(1).replace(",", "")), int(m.group(2).replace(",", "")), Path(m.group(3))
    assert cache_dir.parent.parent == tmp_path / "cache" / "data" and cache_dir.name.startswith("tok-320-")
    tokens = np.fromfile(cache_dir / "tokens.bin", dtype=np.uint16)
    assert len(tokens) == n_train + n_val and int(tokens.max()) < 320
    eod = 1
    assert int((tokens == eod).sum()) == len(docs) and tokens[n_train - 1] == eod  # split at a document's end
    assert 0.125 <= n_val / len(tokens) <= 0.5
    chars = sum(len(d) for d in docs)
    size = (tmp_path / "notes.jsonl").stat().st_size
    assert re.fullmatch(rf"notes\.jsonl: 300 documents, {len(tokens):,} tokens, {re.escape(human_bytes(size))}, "
                        rf"{chars / len(tokens):.2f} chars/token; \S+ \(\d+\.\d\d MB/s; encoding \d+\.\d\d MB/s on 1 "
                        r"process\(es\)\)", first), first
    # --json: the same numbers, from the cache now
    out = json.loads(wb("data", "prepare", "notes.jsonl", "--preset", "prep", "--json", cwd=tmp_path, env=env,
                        check=True).stdout)
    assert set(out) == PREPARE_KEYS
    assert {k: out[k] for k in ("documents", "tokens", "bytes", "chars", "cached", "vocab_size", "source",
                                "train_tokens", "val_tokens", "cache_dir", "workers", "warnings", "mb_per_s",
                                "encode_seconds", "encode_mb_per_s")} == {
        "documents": 300, "tokens": len(tokens), "bytes": size, "chars": chars, "cached": True, "vocab_size": 320,
        "source": "notes.jsonl", "train_tokens": n_train, "val_tokens": n_val, "cache_dir": str(cache_dir),
        "workers": 1, "warnings": [], "mb_per_s": None, "encode_seconds": None, "encode_mb_per_s": None}
    assert out["chars_per_token"] == round(chars / len(tokens), 3) and out["seconds"] >= 0
    # a fresh preparation's rates in --json (another vocabulary: another tokenizer, encoded again)
    fresh = json.loads(wb("data", "prepare", "notes.jsonl", "--preset", "prep", "--vocab-size", "300", "--workers", "2",
                          "--json", cwd=tmp_path, env=env, check=True).stdout)
    assert set(fresh) == PREPARE_KEYS
    assert (fresh["cached"], fresh["vocab_size"], fresh["workers"]) == (False, 300, 2)
    assert fresh["mb_per_s"] == pytest.approx(size / 1e6 / fresh["seconds"], rel=0.02)  # (seconds rounded to ms)
    assert fresh["encode_mb_per_s"] > 0 and fresh["encode_seconds"] > 0
    cp = wb("data", "prepare", "notes.jsonl", "--workers", "0", cwd=tmp_path, env=env)
    assert cp.returncode == 2 and cp.stderr.strip() == "workbench: error: --workers 0 must be at least 1"


# ----------------------------------------------------------------------------- 7. import --seq-len, sharded

def test_import_a_sharded_model_with_seq_len(tmp_path, hf_tokenizer_dir):
    """A model saved by transformers in several safetensors shards (with its index) imports whole: the same
    tensors as the same model saved in one file; --seq-len is the run's training context."""
    import torch

    from tests.support.hf import build_hf_model, transformers
    from workbench.interop.hf_import import import_model
    from workbench.train.checkpoint import load_run_model
    whole = build_hf_model(tmp_path / "whole", "llama-gqa-tied", hf_tokenizer_dir)
    sharded = tmp_path / "sharded"
    transformers.AutoModelForCausalLM.from_pretrained(whole).save_pretrained(sharded, max_shard_size="100KB")
    transformers.AutoTokenizer.from_pretrained(whole).save_pretrained(sharded)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3 and not (sharded / "model.safetensors").exists()
    cp = wb("import", str(sharded), "--name", "sh", "--seq-len", "48", "--runs-dir", str(tmp_path / "runs"),
            check=True)
    assert cp.stdout.splitlines()[-1] == "sh"
    assert f"imported LlamaForCausalLM from {sharded}: " in cp.stdout and "context 128" in cp.stdout
    import_model(whole, tmp_path / "runs", "one", log=lambda m: None)  # the default context: the model's, 128
    a, b = load_run_model(tmp_path / "runs" / "sh"), load_run_model(tmp_path / "runs" / "one")
    assert (a.preset.model.seq_len, b.preset.model.seq_len) == (48, 128)
    assert a.state_dict.keys() == b.state_dict.keys()
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in b.state_dict)


# ----------------------------------------------------------------------------- 8. export --gguf-type f32

def test_export_gguf_f32_holds_the_weights_exactly(src, tmp_path):
    from gguf import GGMLQuantizationType, GGUFReader, LlamaFileType

    from workbench.train.checkpoint import load_model_state
    out = tmp_path / "g"
    cp = wb("export", "src", str(out), "--runs-dir", str(src.root), "--format", "gguf", "--gguf-type", "f32",
            check=True)
    assert cp.stdout.strip() == (f"exported src step_{src.latest:07d} (val loss "
                                 f"{_eval_at(src.dir, src.latest)['val_loss']:.4f}) as a GGUF file (f32), "
                                 f"{out / 'model.gguf'}, to {out}")
    reader = GGUFReader(out / "model.gguf")
    assert int(reader.get_field("general.file_type").contents()) == LlamaFileType.ALL_F32
    latest = rundir.select_checkpoint(src.dir, "latest")["path"]
    sd = {k: v.float().numpy() for k, v in load_model_state(latest).items()}
    name = {"token_embd.weight": "tok_emb.weight", "output_norm.weight": "norm.weight"}
    parts = {"attn_norm": "attn_norm", "attn_q": "attn.wq", "attn_k": "attn.wk", "attn_v": "attn.wv",
             "attn_output": "attn.wo", "ffn_norm": "mlp_norm", "ffn_gate": "mlp.w1", "ffn_up": "mlp.w3",
             "ffn_down": "mlp.w2", "attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm"}
    seen = set()
    for t in reader.tensors:
        assert t.tensor_type == GGMLQuantizationType.F32, (t.name, t.tensor_type)
        if t.name in name:
            ours = name[t.name]
        else:
            m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", t.name)
            ours = f"layers.{m.group(1)}.{parts[m.group(2)]}.weight"
        seen.add(ours)
        got, want = np.asarray(t.data, dtype=np.float32).reshape(-1), sd[ours].reshape(-1)
        if re.search(r"attn_(q|k)(_norm)?$", t.name.rsplit(".", 1)[0]):  # rows reordered for llama.cpp's RoPE
            got, want = np.sort(got), np.sort(want)
        assert np.array_equal(got, want), t.name  # f32: every value exactly the checkpoint's
    assert seen == set(sd)


# ----------------------------------------------------------------------------- 9. estimate

def test_estimate_uses_a_previous_runs_tokens_per_s_and_prices_energy(src, tmp_path):
    """tokens/s: the median of the previous run's log records (the first step has none; the first that has one,
    a warm-up step, is left out too); energy at 65 W on a CPU, costed at --usd-per-kwh."""
    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(src.dir, root / "src")  # the run alone (other tests add runs of the same preset beside it)
    tps = [r["tokens_per_s"] for r in read_jsonl(src.dir / "metrics.jsonl")
           if r["kind"] == "train" and r["tokens_per_s"] is not None]
    measured = statistics.median(tps[1:])
    # a run that started beside other processes (the other test worker, say) is labelled so
    start = next(r for r in read_jsonl(src.dir / "metrics.jsonl") if r.get("event") == "start")
    busy = (start.get("calibration") or {}).get("others_busy") or 0.0
    source = f"measured: median of {len(tps)} log records of run src" + (
        f", which started with other processes using {busy:.0%} of the CPU (this machine alone is likely faster)"
        if busy >= BUSY_SHARE else "")
    args = ["estimate", "cpu-small", "--runs-dir", str(root), "--no-calibrate", "--device", "cpu",
            "--usd-per-kwh", "0.25", *tiny("train.max_iters=1000000", "hardware.device=cpu")]
    r = json.loads(wb(*args, "--json", check=True).stdout)
    assert r["tokens_per_s"] == measured
    assert r["tokens_per_s_source"] == source
    assert r["previous_run"]["run"] == "src"
    train_s = 1_000_000 * 4 * 32 / measured
    assert r["time"]["train_s"] == pytest.approx(train_s, rel=1e-12)
    total = r["time"]["total_s"]
    assert total == pytest.approx(train_s + r["time"]["eval_s"], rel=1e-12)
    kwh = 65 * total / 3600 / 1000
    assert r["cost"]["kwh"] == pytest.approx(kwh, rel=1e-12)
    assert r["cost"]["usd"] == pytest.approx(0.25 * kwh, rel=1e-12)
    text = wb(*args, check=True).stdout.splitlines()
    i = text.index(f"throughput: {measured:,.0f} tokens/s ({source})")
    assert text[i + 2] == (f"energy {kwh:.3g} kWh at 65 W (assumed for a CPU; set --watts); "
                           f"cost ${0.25 * kwh:,.2f}")


def test_estimate_compare_sorts_by_time_or_cost_and_prices_kwh():
    r = json.loads(wb("estimate", "gpu-8gb", "--compare", "--sort", "time", "--usd-per-kwh", "0.3",
                      "--usd-per-hour", "H100=2.5", "--json", check=True).stdout)
    rows = r["rows"]
    assert r["sort"] == "time" and r["usd_per_kwh"] == 0.3
    times = [x["time_s"] for x in rows if x["time_s"] is not None]
    assert times == sorted(times) and [x["time_s"] for x in rows][len(times):] == [None] * (len(rows) - len(times))
    assert len(times) > 10 and times[0] < times[-1]
    for x in rows:
        if x["time_s"] is None:
            continue
        hours = x["time_s"] / 3600
        assert x["kwh"] == pytest.approx(x["watts"] * hours / 1000, rel=1e-12)
        hourly = 2.5 * hours if x["gpu"] == "H100 SXM 80GB" else 0.0  # hours x $/hour, plus kWh x $/kWh
        assert x["usd"] == pytest.approx(hourly + 0.3 * x["kwh"], rel=1e-12), x["gpu"]
    text = wb("estimate", "gpu-8gb", "--compare", "--sort", "time", check=True).stdout
    assert text.splitlines()[0] == ("gpu-8gb: 103.0 M parameters, 10,000 steps x 24,576 tokens = 245.8 M tokens; "
                                    "sorted by time")
    by_cost = json.loads(wb("estimate", "gpu-8gb", "--compare", "--sort", "cost", "--usd-per-kwh", "0.3", "--json",
                            check=True).stdout)["rows"]
    costs = [x["usd"] for x in by_cost if x["usd"] is not None]
    assert costs == sorted(costs) and len(costs) == len(times)
    assert [x["gpu"] for x in by_cost] != [x["gpu"] for x in rows]  # a different order: the sort is applied


# ----------------------------------------------------------------------------- 10. fit --init-from

def test_fit_init_from_fits_the_source_runs_model(src, tmp_path):
    from workbench.config import resolve_preset
    from workbench.machine.probe import this_machine
    from workbench.plan.fit.memory import estimate_memory, what_if
    from workbench.plan.run_plan import NewRun, plan_new_run
    from workbench.plan.settings import resolve_settings
    over = ["train.batch_size=65536", "train.grad_accum=1", "hardware.compile=false"]
    env = {"WORKBENCH_PRESETS_DIR": str(tmp_path)}
    cp = wb("fit", "cpu-small", "--init-from", "src", "--runs-dir", str(src.root), "--device", "cpu", "--set", *over,
            env=env, check=True)
    lines = cp.stdout.splitlines()
    assert lines[0] == ("fitting cpu-small on cpu (fp32): 65536 sequences x 256 tokens = 16,777,216 tokens per "
                        "optimizer step to keep")
    trials = {int(b): shown for b, shown in re.findall(r"batch\s+(\d+): estimate (.+?) (?:fits|too big)", cp.stdout)}
    assert len(trials) > 5, cp.stdout
    # each trial is the estimate of the run `train --init-from src` would make: src's model (dim 64, 2 layers,
    # vocab 512) at cpu-small's context (256), not cpu-small's own model
    plan = plan_new_run(NewRun("cpu-small", tuple(over), init_from="src"), src.root).preset
    assert (plan.model.dim, plan.model.n_layers, plan.model.vocab_size, plan.model.seq_len) == (64, 2, 512, 256)
    machine = this_machine()
    # activation checkpointing as auto decides it at the preset's own batch (nothing fits there: on), kept for
    # every trial and written into the fitted preset, so the run trains as it was fitted
    ckpt = resolve_settings(what_if(plan, device="cpu"), machine, world_size=1).activation_checkpointing

    def estimate(preset, b: int) -> str:
        p = what_if(preset, device="cpu", batch_size=b, activation_checkpointing=ckpt)
        return human_bytes(estimate_memory(p, settings=resolve_settings(p, machine, world_size=1)).total)

    assert trials == {b: estimate(plan, b) for b in trials}
    own = what_if(resolve_preset("cpu-small", over), device="cpu")
    assert all(estimate(own, b) != shown for b, shown in trials.items())  # (cpu-small's own model: other numbers)
    best = int(re.search(r"largest micro-batch that fits: (\d+) ", cp.stdout).group(1))
    assert lines[-1] == (f"wrote {tmp_path / 'cpu-small-fit.toml'}  (train with: workbench train cpu-small-fit "
                         "--init-from src)")
    written = tomllib.loads((tmp_path / "cpu-small-fit.toml").read_text())
    b, a = written["train"]["batch_size"], written["train"]["grad_accum"]
    assert b * a == 65536 and b == max(d for d in range(1, best + 1) if 65536 % d == 0), (b, a, best)
    # a preset to train with --init-from src again: the model comes from src then, so it is not recorded here
    assert "init" not in written and "source" not in written
    assert written["model"]["dim"] == 256
    assert ckpt is True and written["hardware"]["activation_checkpointing"] == "true"


# ----------------------------------------------------------------------------- 11. symbolic links, sorted globs

def _inspect(*corpus: str, cwd: Path) -> list[str]:
    out = json.loads(wb("data", "inspect", *corpus, "-n", "50", "--json", cwd=cwd, check=True).stdout)
    return [d["text"] for d in out["shown"]]


def test_a_corpus_directory_follows_symbolic_links(tmp_path):
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere" / "linked-file.txt").write_text("a file reached through a link\n")
    (tmp_path / "elsewhere" / "sub" / "deep.txt").write_text("a file in a linked directory\n")
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text("a plain file\n")
    (d / "b.txt").symlink_to(tmp_path / "elsewhere" / "linked-file.txt")
    (d / "c").symlink_to(tmp_path / "elsewhere" / "sub", target_is_directory=True)
    assert _inspect("corpus", cwd=tmp_path) == ["a plain file\n", "a file reached through a link\n",
                                                "a file in a linked directory\n"]


def test_a_corpus_glob_reads_its_matches_sorted(tmp_path):
    names = ["m", "c", "x", "a", "q", "b", "k", "e", "z", "d"]
    for n in names:  # created out of order (a directory lists in its own order: hash order on ext4)
        (tmp_path / "g" / n).mkdir(parents=True)
        (tmp_path / "g" / f"{n}.txt").write_text(f"doc {n}\n")
        (tmp_path / "g" / n / "inner.txt").write_text(f"inner {n}\n")
    assert _inspect("g/*.txt", cwd=tmp_path) == [f"doc {n}\n" for n in sorted(names)]
    # recursive: every match of the pattern, sorted by path
    paths = sorted([f"g/{n}.txt" for n in names] + [f"g/{n}/inner.txt" for n in names])
    texts = [f"doc {p[2]}\n" if p.count("/") == 1 else f"inner {p[2]}\n" for p in paths]
    assert _inspect("g/**/*.txt", cwd=tmp_path) == texts


# ----------------------------------------------------------------------------- 12. touched files

def test_a_touched_corpus_file_reuses_its_tokens_after_the_first_pass(tmp_path):
    _notes(tmp_path / "notes.jsonl")
    env = {"WORKBENCH_CACHE_DIR": str(tmp_path / "cache")}
    args = ["data", "prepare", "notes.jsonl", "--vocab-size", "300", "--set", "data.tokenizer_sample_mb=0.1", "--json"]
    first = json.loads(wb(*args, cwd=tmp_path, env=env, check=True).stdout)
    tokens = Path(first["cache_dir"]) / "tokens.bin"
    stamp = (tokens.stat().st_ino, tokens.stat().st_mtime_ns, tokens.read_bytes())
    st = (tmp_path / "notes.jsonl").stat()
    os.utime(tmp_path / "notes.jsonl", ns=(st.st_atime_ns, st.st_mtime_ns + 60 * 10**9))  # touched: same text
    cp = wb(*args, cwd=tmp_path, env=env, check=True)
    again = json.loads(cp.stdout)
    assert cp.stderr.splitlines() == [
        "corpus changed since it was encoded (notes.jsonl was modified): preparing it again",
        f"reading notes.jsonl ({human_bytes(st.st_size)}) for its size and a tokenizer sample ...",
        "the same text was prepared before: using its tokens"], cp.stderr  # the first pass, no tokenizer, no encoding
    assert again["cached"] and again["cache_dir"] == first["cache_dir"] and again["tokens"] == first["tokens"]
    assert (tokens.stat().st_ino, tokens.stat().st_mtime_ns, tokens.read_bytes()) == stamp
    # and from then on the touched file is known: nothing read at all
    cp = wb(*args, cwd=tmp_path, env=env, check=True)
    assert json.loads(cp.stdout)["cached"] and cp.stderr == ""


# ----------------------------------------------------------------------------- 13. the shipped presets

def _readme_presets() -> dict[str, tuple[str, str]]:
    """The docs' preset table (docs/reference/presets.md, once the README's): name -> (model column, params column)."""
    text = (REPO / "docs" / "reference" / "presets.md").read_text()
    table = text.split("| preset | for | model | params |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|") for line in table.splitlines()[2:]]
    return {cells[1].strip().strip("`"): (cells[3].strip(), cells[4].strip()) for cells in rows}


def test_the_shipped_presets_are_the_sizes_the_readme_gives():
    from workbench.config import preset_paths, resolve_preset
    from workbench.plan.fit.flops import count_params
    table = _readme_presets()
    assert set(table) == {n for n, (_p, kind) in preset_paths().items() if kind == "shipped"}
    for name, (model, params) in table.items():
        p = resolve_preset(name)
        m = p.model
        heads = re.search(r"(\d+)/(\d+) heads", model) or re.search(r"(\d+) heads / (\d+) KV head", model)
        want = {"dim": int(re.search(r"dim (\d+)", model).group(1)),
                "n_layers": int(re.search(r"(\d+) layers", model).group(1)),
                "n_heads": int(heads.group(1)), "n_kv_heads": int(heads.group(2)),
                "seq_len": int(re.search(r"seq (\d+)", model).group(1))}
        got = {"dim": m.dim, "n_layers": m.n_layers, "n_heads": m.n_heads, "n_kv_heads": m.n_kv_heads,
               "seq_len": m.seq_len}
        if (v := re.search(r"vocab (\d+)", model)):
            want["vocab_size"], got["vocab_size"] = int(v.group(1)), m.vocab_size
        if (b := re.search(r"batch (\d+)", model)):
            want["batch_size"], got["batch_size"] = int(b.group(1)), p.train.batch_size
        assert got == want, name
        value = re.fullmatch(r"(\d+(?:\.(\d+))?) M", params)
        decimals = len(value.group(2) or "")
        assert round(count_params(m) / 1e6, decimals) == float(value.group(1)), (name, count_params(m))


def test_the_shipped_presets_qk_norm_and_learning_rate_defaults():
    from workbench.config import preset_paths, resolve_preset
    shipped = sorted(n for n, (_p, kind) in preset_paths().items() if kind == "shipped")
    assert len(shipped) == 6
    assert {n: resolve_preset(n).model.qk_norm for n in shipped} == {n: True for n in shipped}
    t = resolve_preset("cpu-small").train
    assert (t.optimizer, t.schedule, t.decay_fraction, t.muon_ns) == ("muon", "wsd", 0.4, "polar-express")
    assert (t.lr, t.warmup_iters, t.beta2) == (3e-3, 30, 0.99)
    m = resolve_preset("medium").train
    assert (m.optimizer, m.schedule, m.decay_fraction, m.lr, m.beta2) == ("muon", "wsd", 0.4, 9e-4, 0.95)
    assert resolve_preset("cpu-small").hardware.nproc == 1  # "so cpu-small ships with nproc = 1"
    assert resolve_preset("datacenter-80gb").hardware.shard is True  # "(set in datacenter-80gb)"

