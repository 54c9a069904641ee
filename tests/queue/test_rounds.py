"""`workbench rounds` through the real CLI on a tiny chat-tuned run: a 2-round chain of sample -> pair -> DPO + NLL
through the queue, killed (runner, pairs and all) as soon as round 1 has finished and run again: round 1 is not
redone, round 2 samples round 1's final checkpoint and starts from it (lineage), each round's pairs file and record
(pairs' count, mean reward of its samples) are what its sidecar says; a round without a pair stops the chain in
one line; every bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.chat import conversations, write_jsonl
from tests.support.cli import tiny, wb
from tests.support.runs import read_jsonl, tree, wait_until
from workbench import rundir
from workbench.queue.store import QueueStore

ROUND_SETS = ["model.seq_len=64", "train.batch_size=4", "train.warmup_iters=0", "train.eval_interval=2",
              "train.ckpt_interval=2", "train.eval_iters=1", "train.log_interval=1", "hardware.nproc=1",
              "hardware.compile=false"]
SAMPLING = ["--temperature", "1.0", "--max-new-tokens", "12", "--seed", "3", "--device", "cpu"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A tiny chat-tuned run (ChatML) that has seen the generated task for 24 steps, and prompts of that task."""
    d = tmp_path_factory.mktemp("rounds")
    chats = write_jsonl(d / "chats.jsonl", conversations(200, seed=2))
    wb("train", "cpu-small", "--name", "chat", "--corpus", str(chats), "--runs-dir", str(d / "runs"),
       *tiny("model.seq_len=64", "train.max_iters=24", "train.eval_interval=24", "train.ckpt_interval=24",
             "train.eval_iters=1", "train.lr=3e-3"), check=True)
    prompts = [{"prompt": c["messages"][-2]["content"], "answer": c["messages"][-1]["content"]}
               for c in conversations(12, seed=5) if c["messages"][0]["role"] == "user"][:6]
    write_jsonl(d / "prompts.jsonl", prompts)
    return d / "runs" / "chat"


def fresh_root(source: Path, tmp_path: Path) -> Path:
    """A runs directory of this test's own holding a copy of the source run."""
    root = tmp_path / "runs"
    shutil.copytree(source, root / "chat")
    return root


def rounds_args(root: Path, prompts: Path, *extra: str) -> list[str]:
    return ["rounds", "chat", "--runs-dir", str(root), "--prompts", str(prompts), *SAMPLING, *extra]


def preset_init(run_dir: Path) -> dict:
    return tomllib.loads((run_dir / "preset.toml").read_text())["init"]


def test_a_killed_two_round_chain_resumes_and_each_round_starts_from_the_last(source, tmp_path):
    root = fresh_root(source, tmp_path)
    prompts = source.parent.parent / "prompts.jsonl"
    args = rounds_args(root, prompts, "--reward", "length:12", "--samples", "3", "--rounds", "2", "--steps", "2",
                       "--set", *ROUND_SETS)
    # killed, runner and the pairs it samples together, the moment round 1 has finished (round 2 queued or started)
    proc = subprocess.Popen([sys.executable, "-m", "workbench", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, text=True)

    def r1_finished() -> bool:
        store = QueueStore.open_existing(root)
        if store is None:
            return False
        try:
            item = store.find("chat-rpo-r1")
        except sqlite3.Error:   # the database is being made
            return False
        finally:
            store.close()
        return item is not None and item.state == "finished"
    try:
        wait_until(r1_finished, timeout=120, what="round 1 to finish", every=0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        out1 = proc.communicate()[0]
    assert "queued round 2 of chat-rpo" in out1 or "chat-rpo-r1 finished" in out1, out1
    r1_starts = [r for r in read_jsonl(root / "chat-rpo-r1" / "metrics.jsonl") if r.get("event") == "start"]

    cp = wb(*args)   # the same command again: the chain goes on
    assert cp.returncode == 0, cp.stdout + cp.stderr
    store = QueueStore(root)
    r1, r2 = store.get("chat-rpo-r1"), store.get("chat-rpo-r2")
    assert (r1.state, r2.state) == ("finished", "finished")
    # round 1 was not redone: one launch, the same single start in its log
    assert r1.launches == 1
    assert [r for r in read_jsonl(root / "chat-rpo-r1" / "metrics.jsonl") if r.get("event") == "start"] == r1_starts
    assert len(r1_starts) == 1
    # lineage: round 1 from the source's checkpoint, round 2 from round 1's final one (the step it sampled)
    chat_step = max(int(p.name.split("_")[1]) for p in (root / "chat" / "checkpoints").iterdir())
    assert preset_init(root / "chat-rpo-r1") == {"run": "chat", "step": chat_step}
    assert preset_init(root / "chat-rpo-r2") == {"run": "chat-rpo-r1", "step": 2}
    assert (r1.init_from, r2.init_from) == (f"chat:{chat_step}", "chat-rpo-r1:2")
    again = wb("queue", "run", "--runs-dir", str(root), check=True).stdout  # a runner started later: nothing to do
    assert "rounds finished" not in again and "chat-rpo" not in again, again
    listed = wb("runs", "--runs-dir", str(root), check=True).stdout
    assert "from chat@24" in listed and "from chat-rpo-r1@2" in listed, listed
    d = root / "chat-rpo.rounds"
    for i, (src, step) in enumerate([("chat", chat_step), ("chat-rpo-r1", 2)], 1):
        pairs = read_jsonl(d / f"round-{i}-pairs.jsonl")
        meta = json.loads((d / f"round-{i}-pairs.jsonl.meta.json").read_text())
        rec = json.loads((d / f"round-{i}.json").read_text())
        assert (meta["settings"]["run"], meta["settings"]["step"], meta["done"]) == (src, step, 6)
        assert rec["pairs"] == meta["pairs"] == len(pairs) > 0
        assert (rec["source"], rec["step"], rec["mean_reward"]) == (src, step, meta["mean_reward"])
        assert 0 <= rec["mean_reward"] <= 1
        assert all(p["chosen_reward"] > p["rejected_reward"] for p in pairs)
        assert rec["seed"] == meta["settings"]["sampling"]["seed"] == 3 + (i - 1) * 6   # fresh samples each round
        assert json.loads((root / f"chat-rpo-r{i}" / "round.json").read_text()) == {**rec, "state": "finished"}
        run = root / f"chat-rpo-r{i}"
        start = next(r for r in read_jsonl(run / "metrics.jsonl") if r.get("event") == "start")
        assert start["preference"]["items"] == len(pairs)   # trained on exactly its round's pairs
        preset = tomllib.loads((run / "preset.toml").read_text())
        assert preset["train"]["objective"] == "dpo" and preset["train"]["pref_sft_weight"] == 1.0
        assert preset["data"]["corpus"] == str(d / f"round-{i}-pairs.jsonl")
    # the curve a user wants: reward per round, in the chain's table
    shown = wb("rounds", "chat", "--runs-dir", str(root), "--show", check=True).stdout
    for i in (1, 2):
        rec = json.loads((d / f"round-{i}.json").read_text())
        assert f"chat-rpo-r{i}  finished" in shown and f"{rec['mean_reward']:.3f}" in shown, shown
    # the chain with another reward is refused in one line, nothing touched
    before = tree(root)
    other = wb(*[a if a != "length:12" else "length:20" for a in args])
    assert other.returncode == 2 and other.stderr.strip().count("\n") == 0, other.stderr
    assert ("chain chat-rpo was made with other settings (reward: 'length:12' then, 'length:20' now;" in other.stderr
            and tree(root) == before), other.stderr


def test_every_rounds_flag_reaches_the_chain_and_its_first_round(source, tmp_path):
    """The flags only this test gives, each off its default, read back from what the chain records: its spec and
    queue entry (--name, --checkpoint, --yes; --queue-only: the round queued, no runner here), the pairs round 1
    sampled (--top-k, --top-p and --reward-timeout in the pairs file's settings, from --checkpoint's step) and round
    1's run (the checkpoint it starts from, --sft-weight's NLL weight, --time-budget's budget, --preset's values)."""
    root = fresh_root(source, tmp_path)
    wb("resume", "chat", "--more", "2", "--runs-dir", str(root), check=True)  # checkpoints at 24 and 26: latest 26
    preset = tmp_path / "rounds-preset.toml"   # cpu-small (the source's preset) but for a weight decay of its own
    text = (Path(__file__).resolve().parents[2] / "presets" / "cpu-small.toml").read_text()
    preset.write_text(text.replace('name = "cpu-small"', 'name = "rounds-preset"')
                      .replace("[train]\n", "[train]\nweight_decay = 0.037\n", 1))
    cp = wb("rounds", "chat", "--runs-dir", str(root), "--prompts", str(source.parent.parent / "prompts.jsonl"),
            "--reward", "length:12", "--rounds", "1", "--samples", "3", "--temperature", "1.0", "--max-new-tokens",
            "12", "--seed", "3", "--device", "cpu", "--checkpoint", "24", "--reward-timeout", "7.5", "--time-budget",
            "2s", "--sft-weight", "0.25", "--preset", str(preset), "--name", "mine", "--top-k", "5", "--top-p", "0.9",
            "--yes", "--queue-only", "--set", *ROUND_SETS)
    assert cp.returncode == 0 and "`workbench queue run` starts it" in cp.stdout, cp.stdout + cp.stderr
    item = QueueStore(root).get("mine-r1")
    assert item.state == "queued" and not (root / "mine-r1").exists()          # --queue-only: nothing ran
    assert (item.init_from, item.time_budget, item.force) == ("chat:24", "2s", True), item
    assert item.preset == str(preset) and "train.pref_sft_weight=0.25" in item.sets, item
    spec = json.loads((root / "mine.rounds" / "rounds.json").read_text())
    assert spec["reward_timeout"] == 7.5 and (spec["sampling"]["top_k"], spec["sampling"]["top_p"]) == (5, 0.9)

    wb("queue", "run", "--runs-dir", str(root), check=True)
    meta = json.loads((root / "mine.rounds" / "round-1-pairs.jsonl.meta.json").read_text())
    assert (meta["settings"]["run"], meta["settings"]["step"], meta["reward_timeout_s"]) == ("chat", 24, 7.5), meta
    assert (meta["settings"]["sampling"]["top_k"], meta["settings"]["sampling"]["top_p"]) == (5, 0.9), meta
    run = root / "mine-r1"
    trained = tomllib.loads((run / "preset.toml").read_text())
    assert trained["init"] == {"run": "chat", "step": 24}
    assert trained["train"]["pref_sft_weight"] == 0.25 and trained["train"]["weight_decay"] == 0.037, trained["train"]
    st = rundir.read_status(run)
    assert st.state == "finished" and st.budget_s == 2.0, st


def test_a_round_without_a_pair_stops_the_chain_in_one_line(source, tmp_path):
    root = fresh_root(source, tmp_path)
    cp = wb(*rounds_args(root, source.parent.parent / "prompts.jsonl", "--reward", "contains:QQQQ", "--rounds", "2",
                         "--steps", "2", "--samples", "2", "--set", *ROUND_SETS))
    assert cp.returncode == 2
    assert cp.stderr.strip().count("\n") == 0 and "no pair to train on" in cp.stderr, cp.stderr
    assert "round 1 (chat-rpo-r1) failed" in cp.stderr
    store = QueueStore(root)
    assert store.get("chat-rpo-r1").state == "failed" and store.find("chat-rpo-r2") is None   # the chain stopped
    assert not (root / "chat-rpo-r1").exists()   # no trainer was started
    assert json.loads((root / "chat-rpo.rounds" / "round-1.json").read_text())["pairs"] == 0


def test_bad_input_is_one_line_exit_2_and_nothing_written(source, tmp_path):
    root = fresh_root(source, tmp_path)
    prompts = source.parent.parent / "prompts.jsonl"
    (tmp_path / "empty.jsonl").write_text("")
    bare = root / "bare"   # a run without a checkpoint
    bare.mkdir()
    shutil.copy(root / "chat" / "preset.toml", bare / "preset.toml")
    plain = root / "plain"   # a run that is not chat-tuned
    shutil.copytree(root / "chat", plain)
    for f in plain.glob("chat_template*"):
        f.unlink()
    good = ["--reward", "length:12", "--rounds", "2"]
    cases = {
        "no reward": (rounds_args(root, prompts, "--rounds", "2"), "--reward is missing"),
        "no prompts file": (rounds_args(root, tmp_path / "nope.jsonl", *good), "nope.jsonl"),
        "empty prompts": (rounds_args(root, tmp_path / "empty.jsonl", *good), "has no prompts"),
        "no rounds": (rounds_args(root, prompts, "--reward", "length:12", "--rounds", "0"), "--rounds 0"),
        "no checkpoint": (["rounds", "bare", "--runs-dir", str(root), "--prompts", str(prompts), *good],
                          "no complete checkpoint"),
        "not chat-tuned": (["rounds", "plain", "--runs-dir", str(root), "--prompts", str(prompts), *good],
                           "not chat-tuned"),
        "bad --set": (rounds_args(root, prompts, *good, "--set", "train.nope=1"), "nope"),
    }
    before = tree(root)
    for what, (argv, says) in cases.items():
        cp = wb(*argv)
        lines = cp.stderr.strip().splitlines()
        assert cp.returncode == 2 and len(lines) == 1 and says in lines[0], (what, cp.stderr)
        assert tree(root) == before, what
    assert not (root / "queue.db").exists()


def test_a_round_waits_for_the_pairs_process_a_killed_runner_left(tmp_path):
    """A runner killed alone leaves its `workbench pairs` sampling; the next one waits for it to end before it
    samples into the same file (here a stand-in process holding the file's path, as `pairs --out PATH` does)."""
    import psutil

    from workbench.cli_client import CliError
    from workbench.queue.rounds import run_pairs
    out, go = tmp_path / "round-1-pairs.jsonl", tmp_path / "go"
    # the stand-in writes once the runner says it waits (its say line makes the go file): decided by what happened,
    # not by a sleep a loaded machine could outlast (it gives up after 60 s, so a runner that did not wait fails)
    orphan = subprocess.Popen([sys.executable, "-c", "import os, sys, time; t = time.time()\n"
                               "while not os.path.exists(sys.argv[2]) and time.time() - t < 60: time.sleep(0.05)\n"
                               "open(sys.argv[1], 'a').write('orphan\\n')", str(out), str(go)])
    # a real pairs process is long past its start: the runner knows it by its command line (a fork not yet exec'd,
    # under load, still had the test's: a CI run saw no wait)
    wait_until(lambda: str(out) in psutil.Process(orphan.pid).cmdline(), 30, "the stand-in's command line")
    (tmp_path / "round-1-pairs.jsonl.pid").write_text(f"{orphan.pid}\n")
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        go.touch()
    run_pairs([sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('next\\n')", str(out)], out, None,
              say)
    assert out.read_text() == "orphan\nnext\n" and orphan.poll() is not None
    assert said and f"pid {orphan.pid}" in said[0] and not (tmp_path / "round-1-pairs.jsonl.pid").exists()
    with pytest.raises(CliError, match="^the reward said no$"):
        run_pairs([sys.executable, "-c", "import sys; sys.exit('workbench: error: the reward said no')"], out, None,
                  said.append)
