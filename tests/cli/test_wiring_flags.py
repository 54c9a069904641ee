"""CLI flags that change what a command computes reach it (issue 54, round 4): each flag no test passed before
(bench/wiring_audit.py lists them) is given a value other than its default on the smallest real call that reaches
it, and its effect is read from what the command wrote (the estimate's JSON, a preset file, the queue's entries,
the run the queue started, the sweep's record, the eval's scores), not only its exit status."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.support.chat import conversations, write_jsonl
from tests.support.cli import tiny, wb
from tests.support.runs import read_jsonl, wait_until
from workbench import rundir


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A runs directory holding ``src``: a finished two-step tiny run with its checkpoint."""
    d = tmp_path_factory.mktemp("wiring-flags") / "runs"
    wb("train", "cpu-small", "--name", "src", "--runs-dir", str(d),
       *tiny("train.max_iters=2", "train.warmup_iters=0", "train.eval_interval=2", "train.ckpt_interval=2",
             "train.eval_iters=1"), check=True)
    return d


def ok(cp) -> str:
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    return cp.stdout


def queue(runs: Path) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(ok(wb("queue", "ls", "--json", "--runs-dir", str(runs))))["runs"]}


# ----------------------------------------------------------------------------- estimate

def test_estimate_precision_watts_and_prices_change_the_estimate(tmp_path):
    base = ["estimate", "cpu-small", "--json", "--no-calibrate", "--tokens-per-s", "10000"]
    plain = json.loads(ok(wb(*base, cwd=tmp_path)))
    bf16 = json.loads(ok(wb(*base, "--precision", "bf16", "--watts", "200", cwd=tmp_path)))
    assert (plain["settings"]["precision"], bf16["settings"]["precision"]) == ("fp32", "bf16")
    assert bf16["memory"]["precision"] == "bf16" and bf16["settings"]["autocast"] == "bf16"
    # bf16 activations and logits: a smaller estimate than fp32's
    assert bf16["memory"]["total"] < plain["memory"]["total"]
    assert (plain["cost"]["watts"], bf16["cost"]["watts"], bf16["cost"]["watts_source"]) == (65.0, 200.0, "given")
    assert bf16["cost"]["kwh"] == pytest.approx(plain["cost"]["kwh"] * 200 / 65, rel=1e-6)

    prices = tmp_path / "prices.toml"
    prices.write_text('"H100 SXM" = 1.5\n')
    gpu = json.loads(ok(wb("estimate", "cpu-small", "--gpu", "H100 SXM", "--prices", str(prices), "--json",
                           "--no-calibrate", cwd=tmp_path)))
    assert gpu["cost"]["usd"] == pytest.approx(gpu["cost"]["hours"] * 1.5, rel=1e-9) and gpu["cost"]["usd"] > 0


# ----------------------------------------------------------------------------- presets and fit

def test_presets_show_set_shows_the_overridden_value(tmp_path):
    out = ok(wb("presets", "show", "cpu-small", "--set", "train.lr=0.0123", "model.dim=96", cwd=tmp_path))
    lines = {ln.split("=")[0].strip(): ln.split("=")[1].split("#")[0].strip() for ln in out.splitlines() if "=" in ln}
    assert (lines["lr"], lines["dim"]) == ("0.0123", "96")


def test_fit_out_names_the_preset_and_force_overwrites_it(tmp_path):
    ok(wb("fit", "cpu-small", "--out", "mine", "--device", "cpu", cwd=tmp_path))
    written = tmp_path / "presets" / "mine.toml"
    assert tomllib.loads(written.read_text())["name"] == "mine"
    assert not (tmp_path / "presets" / "cpu-small-fit.toml").exists()
    before = written.read_bytes()
    refused = wb("fit", "cpu-small", "--out", "mine", "--device", "cpu", "--set", "train.batch_size=2", cwd=tmp_path)
    assert refused.returncode != 0 and "--force" in refused.stderr and written.read_bytes() == before
    ok(wb("fit", "cpu-small", "--out", "mine", "--device", "cpu", "--set", "train.batch_size=2", "--force",
          cwd=tmp_path))
    assert tomllib.loads(written.read_text())["train"]["batch_size"] == 2


# ----------------------------------------------------------------------------- the queue

def test_queue_add_yes_queues_what_does_not_fit(tmp_path):
    runs = tmp_path / "runs"
    huge = ["--set", "model.dim=16384", "model.n_layers=64", "model.n_heads=64", "model.n_kv_heads=64"]
    refused = wb("queue", "add", "cpu-small", "--name", "big", "--runs-dir", str(runs), *huge)
    assert refused.returncode != 0 and "--yes" in refused.stderr
    assert "big" not in (queue(runs) if (runs / "queue.db").exists() else {})
    ok(wb("queue", "add", "cpu-small", "--name", "big", "--yes", "--runs-dir", str(runs), *huge))
    assert queue(runs)["big"]["force"] is True


def test_queue_add_init_from_starts_the_queued_run_from_that_checkpoint_and_follow_keeps_the_runner(root):
    ok(wb("queue", "add", "cpu-small", "--name", "ft", "--init-from", "src", "--runs-dir", str(root),
          *tiny("train.max_iters=2", "train.warmup_iters=0", "train.eval_interval=2", "train.ckpt_interval=2",
                 "train.eval_iters=1")))
    assert queue(root)["ft"]["init_from"] == "src"
    # a runner with --follow: it trains ft, then stays for more (without it, the runner ends with the queue: the
    # Queue tab's r, tests/tui/test_wiring_bindings.py)
    runner = subprocess.Popen([sys.executable, "-m", "workbench", "queue", "run", "--follow", "--runs-dir", str(root)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    try:
        wait_until(lambda: queue(root)["ft"]["state"] in ("finished", "failed"), timeout=180, every=0.5,
                   what="the queued run to end")
        time.sleep(2)   # more than a poll of the empty queue
        assert runner.poll() is None, runner.communicate()[0]
    finally:
        runner.terminate()
        out = runner.communicate(timeout=60)[0]
    assert queue(root)["ft"]["state"] == "finished", out
    ft = root / "ft"
    assert tomllib.loads((ft / "preset.toml").read_text())["init"] == {"run": "src", "step": 2}
    # its first eval scores src's last weights on the same eval batches: the same loss (a fresh model's is ~6.2)
    src_last = [r["val_loss"] for r in read_jsonl(root / "src" / "metrics.jsonl") if r["kind"] == "eval"][-1]
    ft_first = next(r["val_loss"] for r in read_jsonl(ft / "metrics.jsonl") if r["kind"] == "eval")
    assert ft_first == pytest.approx(src_last, abs=1e-4)


# ----------------------------------------------------------------------------- sweeps

def sweep_show(runs: Path, name: str) -> dict:
    return json.loads(ok(wb("sweep", "show", name, "--json", "--runs-dir", str(runs))))


def test_sweep_method_trials_seed_metric_and_pruner_reach_the_sweep(tmp_path):
    runs = tmp_path / "runs"
    grid = ["--set-grid", "train.lr=1e-3,3e-3,1e-2", "train.warmup_iters=0,5", "--time-budget", "30s"]
    common = ["--set", "model.dim=64", "model.n_layers=2", "--runs-dir", str(runs), "--print-commands"]

    def trials(*flags: str) -> list[str]:
        out = ok(wb("sweep", "cpu-small", *grid, *common, *flags))
        return [ln.split("--set ")[1].split(" model.dim")[0] for ln in out.splitlines() if "--name" in ln]

    assert len(trials()) == 6                                 # grid (the default): every combination
    r5 = trials("--method", "random", "--trials", "3", "--seed", "5")
    assert len(r5) == 3 and r5 == trials("--method", "random", "--trials", "3", "--seed", "5")
    assert any(r5 != trials("--method", "random", "--trials", "3", "--seed", str(s)) for s in (6, 7, 8))
    assert len(trials("--method", "random", "--trials", "4", "--seed", "5")) == 4

    ok(wb("sweep", "cpu-small", *grid, "--set", "model.dim=64", "model.n_layers=2", "--runs-dir", str(runs),
          "--name", "s", "--method", "random", "--trials", "2", "--seed", "5", "--metric", "val_bpb",
          "--pruner", "median"))
    spec = sweep_show(runs, "s")["sweep"]
    assert (spec["method"], spec["trials"], spec["seed"], spec["metric"], spec["pruner"]) == \
        ("random", 2, 5, "val_bpb", "median")
    assert sorted(n for n, r in queue(runs).items() if r["sweep"] == "s") == ["s-t0001", "s-t0002"]


def test_sweep_force_queues_trials_too_short_to_compare(tmp_path):
    runs = tmp_path / "runs"
    args = ["sweep", "cpu-small", "--set-grid", "train.lr=1e-3,3e-3", "--time-budget", "1s", "--runs-dir", str(runs)]
    refused = wb(*args, "--name", "short")
    assert refused.returncode != 0 and "--force" in refused.stderr
    ok(wb(*args, "--name", "short", "--force"))
    q = queue(runs)
    assert {q["short-t0001"]["force"], q["short-t0002"]["force"]} == {True}


# ----------------------------------------------------------------------------- eval and data

def test_eval_set_maps_a_task_files_fields(root, tmp_path):
    """Each item holds its gold answer twice, under idx and (the other choice) under alt: the two readings' accuracies
    add up to one, so the gold field the eval used is the one --set named."""
    task = tmp_path / "odd.jsonl"
    rows = [{"q": f"{i} plus one is", "opts": [f" {i + 1}", f" {i + 7}"], "idx": i % 2, "alt": 1 - i % 2}
            for i in range(6)]
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["eval", "src", "--task", str(task), "--json", "--no-save", "--runs-dir", str(root)]
    assert wb(*base).returncode != 0   # no "context" / "choices" / "gold" fields: nothing to score

    def score(gold: str) -> dict:
        out = json.loads(ok(wb(*base, "--set", "context_field=q", "choices_field=opts", f"gold_field={gold}",
                               "name=mapped")))
        (sc,) = out["checkpoints"][0]["tasks"]
        assert (sc["task"], sc["n"], sc["kind"]) == ("mapped", 6, "mc")
        return sc

    assert score("idx")["acc"] + score("alt")["acc"] == pytest.approx(1.0)


def test_data_inspect_preset_reads_with_that_presets_data_section(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"body": f"document number {i} under body", "text": f"other {i}"}) + "\n"
                              for i in range(40)))
    preset = tmp_path / "bodies.toml"
    preset.write_text('name = "bodies"\n[data]\ntext_field = "body"\n[model]\nvocab_size = 64\n')
    shown = json.loads(ok(wb("data", "inspect", str(corpus), "--preset", str(preset), "--json", "-n", "2",
                             cwd=tmp_path)))
    assert "document number 0 under body" in json.dumps(shown) and "other 0" not in json.dumps(shown)


# ----------------------------------------------------------------------------- chat's sampling

def test_chat_top_k_and_top_p_narrow_the_sampling_to_the_greedy_token(tmp_path):
    """On a barely trained chat model, hot sampling (temperature 1.5, no cut) wanders from the greedy reply;
    --top-k 1, or a --top-p so small that only the likeliest token is left, gives the greedy reply back, token
    for token. Either flag dropped leaves the default cut (50, 0.95) and the same wandering."""
    runs = tmp_path / "runs"
    chats = write_jsonl(tmp_path / "chats.jsonl", conversations(120, seed=4))
    wb("train", "cpu-small", "--name", "chat", "--corpus", str(chats), "--runs-dir", str(runs),
       *tiny("model.seq_len=64", "model.vocab_size=400", "train.max_iters=3", "train.warmup_iters=0",
             "train.eval_interval=3", "train.ckpt_interval=3", "train.eval_iters=1"), check=True)

    def reply(*flags: str) -> list[int]:
        out = ok(wb("chat", "chat", "--runs-dir", str(runs), "--message", "Sort: 5 2 9", "--max-new-tokens", "12",
                    "--json", *flags))
        return json.loads(out)["ids"]

    greedy = reply("--temperature", "0")
    hot = ("--temperature", "1.5", "--seed", "1")
    assert reply(*hot, "--top-k", "0", "--top-p", "1") != greedy
    assert reply(*hot, "--top-k", "1", "--top-p", "1") == greedy
    assert reply(*hot, "--top-k", "0", "--top-p", "0.0001") == greedy



# ----------------------------------------------------------------------------- round 5: what the audit still listed
# (bench/wiring_audit.py --missing on 2026-11-29: hardware.expected_memory_gb and ten flags; `fit --steps` is read
# only by the GPU probe, `serve --host/--token` are passed through tests/tui/test_serve.py's Served helper)

def test_estimate_corpus_items_make_a_mixture_whose_realized_shares_are_estimated(tmp_path):
    (tmp_path / "a.txt").write_text("alpha beta gamma delta\n" * 300)
    (tmp_path / "b.txt").write_text("one two three four five\n" * 300)
    base = ["estimate", "cpu-small", "--json", "--no-calibrate", "--tokens-per-s", "1000",
            "--set", "model.vocab_size=320"]
    plain = json.loads(ok(wb(*base, cwd=tmp_path)))
    mixed = json.loads(ok(wb(*base, "--corpus", "a=a.txt:3", "b=b.txt:1", cwd=tmp_path)))
    assert "mixture" not in plain
    mix = mixed["mixture"]
    seqs = {s["name"]: s["sequences"] for s in mix["sources"]}
    assert mix["exact"] and mix["refused"] == [] and sum(seqs.values()) == mix["horizon_sequences"]
    assert seqs["a"] == 3 * seqs["b"]     # 3:1 by the weights given on the command line
    assert {s["source"] for s in mix["sources"]} == {str(tmp_path / "a.txt"), str(tmp_path / "b.txt")}


def test_expected_memory_gb_sizes_the_memory_savers_where_the_devices_memory_is_unknown(tmp_path):
    """An estimate for CUDA on this GPU-less machine: its memory unknown, `auto` sizes the savers for the
    preset's hardware.expected_memory_gb (0: not stated, the fused loss only where the logits pass 1 GiB)."""
    def settings(gb: str) -> dict:
        return json.loads(ok(wb("estimate", "cpu-small", "--device", "cuda", "--json", "--no-calibrate",
                                "--set", f"hardware.expected_memory_gb={gb}", cwd=tmp_path)))["settings"]
    unknown, roomy, tight = settings("0"), settings("8"), settings("0.05")
    assert unknown["savers_reason"].startswith("auto: the device's memory unknown")
    assert "of 8.00 GiB (hardware.expected_memory_gb" in roomy["savers_reason"], roomy["savers_reason"]
    assert not roomy["activation_checkpointing"] and not roomy["loss_chunk_tokens"]
    # 51 MiB: nothing fits, so the savers that save the most are on
    assert "nothing fits" in tight["savers_reason"] and tight["activation_checkpointing"], tight["savers_reason"]


def test_hw_no_torch_reports_without_importing_torch(tmp_path):
    argv = ["hw", "--no-torch"]
    code = (f"import sys; from workbench.cli import main; rc = main({argv!r}); "
            "print('torch imported:', 'torch' in sys.modules); sys.exit(rc)")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "torch     not checked (--no-torch)" in cp.stdout and "torch imported: False" in cp.stdout
    full = ok(wb("hw", cwd=tmp_path))
    assert "not checked" not in full and any(ln.startswith("torch     2.") for ln in full.splitlines()), full


def test_sample_device_names_a_device_this_machine_lacks_in_one_line(root):
    cp = wb("sample", "src", "--device", "cuda", "--runs-dir", str(root))
    assert cp.returncode == 2 and cp.stderr.strip().count("\n") == 0, (cp.stdout, cp.stderr)
    assert "'cuda'" in cp.stderr and "use --set hardware.device=auto (or cpu)" in cp.stderr
    assert ok(wb("sample", "src", "--device", "auto", "--runs-dir", str(root))).strip()  # auto: the CPU here


def test_export_progress_says_how_far_the_export_is_on_stderr(root, tmp_path):
    quiet = wb("export", "src", str(tmp_path / "q"), "--format", "safetensors", "--runs-dir", str(root))
    told = wb("export", "src", str(tmp_path / "p"), "--format", "safetensors", "--progress", "--runs-dir", str(root))
    ok(quiet), ok(told)
    assert "progress:" not in quiet.stderr
    lines = [ln for ln in told.stderr.splitlines() if ln.startswith("progress: ")]
    assert lines, told.stderr
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == sorted(p.name for p in (tmp_path / "p").iterdir())


def test_stop_timeout_gives_up_waiting_and_says_the_run_is_still_saving(tmp_path):
    runs = tmp_path / "runs"
    ok(wb("train", "cpu-small", "--name", "long", "--detach", "--runs-dir", str(runs),
          *tiny("train.max_iters=100000", "train.eval_interval=100000", "train.ckpt_interval=100000")))
    wait_until(lambda: rundir.read_status(runs / "long").step >= 1, timeout=120, what="the run's first step")
    cp = wb("stop", "long", "--timeout", "0", "--runs-dir", str(runs))
    assert cp.returncode == 1 and "is still saving after 0 s; check `workbench runs`" in cp.stdout, cp.stdout
    st = wait_until(lambda: (s := rundir.read_status(runs / "long")).state == "stopped" and s, timeout=120,
                    what="the asked stop to land")
    assert rundir.list_checkpoints(runs / "long")[-1]["step"] == st.step


def test_a_preset_written_from_a_fine_tune_starts_from_its_checkpoint_again(root):
    """A fine-tune's preset.toml names the checkpoint it started from ([init]): `train` of that preset starts from
    it again, as --init-from would (it failed with "run X has no init/model.pt")."""
    steps = ("train.max_iters=2", "train.warmup_iters=0", "train.eval_interval=2", "train.ckpt_interval=2",
             "train.eval_iters=1")
    ok(wb("train", "cpu-small", "--name", "ft1", "--init-from", "src", "--runs-dir", str(root), *tiny(*steps)))
    ok(wb("train", str(root / "ft1" / "preset.toml"), "--name", "ft2", "--runs-dir", str(root)))
    again = tomllib.loads((root / "ft2" / "preset.toml").read_text())
    assert again["init"] == {"run": "src", "step": 2}
    first = [next(r["val_loss"] for r in read_jsonl(root / n / "metrics.jsonl") if r["kind"] == "eval")
             for n in ("ft1", "ft2")]
    assert first[0] == pytest.approx(first[1], abs=1e-6)   # src's weights both times (a fresh model's is ~6.2)
