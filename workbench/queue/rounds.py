"""Iterated on-policy tuning (Iterative RPO, Pang et al. 2024): rounds of sample -> pair -> DPO + NLL, each round a
queued run that starts from the last round's final checkpoint. Torch-free: the runner samples through the CLI.

A chain is a directory beside the runs, ``runs/CHAIN.rounds/`` (no ``preset.toml``: not a run), holding

- ``rounds.json``         its spec (:class:`Chain`): the source run and its checkpoint, the prompts and their
                          digest, the reward, the samples a prompt, the sampling settings, the preset, the ``--set``
                          values and the time budget each round trains with, and how many rounds;
- ``round-I-pairs.jsonl`` round I's pairs (and their sidecar, ``workbench pairs``' ``.meta.json``);
- ``round-I.json``        round I's record: the checkpoint it sampled, its pairs' count, the mean reward of its
                          samples (the reward of the model it starts from: the curve across rounds).

Round I is the queue item ``CHAIN-rI``: a ``train`` run on ``round-I-pairs.jsonl`` with ``--init-from`` the previous
round (round 1: the source), so lineage shows the chain. Only the next round is ever queued: when round I ends
``finished`` the runner queues round I+1 (:func:`round_ended`), and before it starts a round's trainer it writes the
round's pairs from the previous round's latest checkpoint and pins the item's ``--init-from`` to that very checkpoint
(:func:`prepare`). Everything is in files and the queue, so a kill anywhere is survived as the queue survives it: a
runner that starts again (``queue run``, or ``workbench rounds`` again) queues a round its dead predecessor left
unqueued (:func:`catch_up`), continues a pairs file a stop cut short (``workbench pairs`` continues), and resumes a
round's trainer from its checkpoint; a finished round is never redone.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psutil

from workbench import rundir
from workbench.cli_client import CliError, cli_argv, cli_env, error_line, last_line
from workbench.config.duration import TimeBudget
from workbench.fs import read_json, write_atomic
from workbench.queue.store import Item, NewItem, QueueError, QueueStore

SUFFIX = ".rounds"          # a chain's directory: runs/CHAIN.rounds
SPEC_FILE = "rounds.json"
ROUND_FILE = "round.json"   # a round's record, copied into its run directory once it has ended
VERSION = 1

# The settings a chain is made with: the same command again continues the chain; other values of these are refused
# (--rounds may grow: more rounds extend a finished chain; the source's step is the one the chain was made with, even
# when RUN's latest checkpoint has moved on since)
SETTINGS = ("source", "prompts", "prompts_sha256", "prompt_count", "reward", "samples", "sampling", "preset",
            "sets", "time_budget", "device")


def chain_dir(root: Path, name: str) -> Path:
    return Path(root) / f"{name}{SUFFIX}"


@dataclass(frozen=True)
class Chain:
    """A chain of rounds: its directory and its spec (``rounds.json``)."""
    dir: Path
    spec: dict[str, Any]

    @property
    def root(self) -> Path:
        return self.dir.parent

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def rounds(self) -> int:
        return int(self.spec["rounds"])

    def run_name(self, i: int) -> str:
        return f"{self.name}-r{i}"

    def pairs_path(self, i: int) -> Path:
        return self.dir / f"round-{i}-pairs.jsonl"

    def record_path(self, i: int) -> Path:
        return self.dir / f"round-{i}.json"

    def record(self, i: int) -> dict[str, Any] | None:
        return read_json(self.record_path(i))

    def source_of(self, i: int) -> str:
        """The run round ``i`` samples from and starts from."""
        return str(self.spec["source"]) if i == 1 else self.run_name(i - 1)

    def new_item(self, i: int) -> NewItem:
        s = self.spec
        return NewItem(s["preset"], tuple(s["sets"]), (str(self.pairs_path(i)),), TimeBudget.parse(s["time_budget"]),
                       f"{s['source']}:{s['step']}" if i == 1 else self.run_name(i - 1), bool(s.get("force")),
                       self.run_name(i))

    def round_of(self, name: str) -> int | None:
        prefix = f"{self.name}-r"
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return int(name[len(prefix):])
        return None


def load_chain(d: Path) -> Chain | None:
    spec = read_json(d / SPEC_FILE)
    return Chain(d, spec) if isinstance(spec, dict) and spec.get("version") == VERSION else None


def write_spec(d: Path, spec: dict[str, Any]) -> Chain:
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / SPEC_FILE, json.dumps(spec, indent=1) + "\n")
    return Chain(d, spec)


def chains(root: Path) -> list[Chain]:
    out = []
    for d in sorted(Path(root).glob(f"*{SUFFIX}")):
        if d.is_dir() and (c := load_chain(d)) is not None:
            out.append(c)
    return out


def round_of(root: Path, item: Item) -> tuple[Chain, int] | None:
    """The chain and round number of a queue item that is a round (its corpus is its chain's pairs file)."""
    if len(item.corpus) != 1:
        return None
    d = Path(item.corpus[0]).parent
    if not d.name.endswith(SUFFIX) or d.parent.resolve() != Path(root).resolve():
        return None
    chain = load_chain(d)
    i = chain.round_of(item.name) if chain else None
    return (chain, i) if chain is not None and i is not None else None


def round_seed(spec: dict[str, Any], i: int) -> int:
    """Round ``i``'s sampling seed: fresh samples each round (Iterative RPO samples anew from each round's model), no
    seed of one round's prompts reused by another's (``workbench pairs`` samples prompt k with seed + k)."""
    return int(spec["sampling"]["seed"]) + (i - 1) * int(spec["prompt_count"])


def sampling_args(spec: dict[str, Any], i: int) -> list[str]:
    s = spec["sampling"]
    return ["--temperature", repr(s["temperature"]), "--top-k", str(s["top_k"]), "--top-p", repr(s["top_p"]),
            "--seed", str(round_seed(spec, i)), "--max-new-tokens", str(s["max_new_tokens"])]


def run_pairs(argv: list[str], out: Path, env: dict[str, str] | None, say: Callable[[str], None]) -> None:
    """``workbench pairs`` to its end (a CliError with its one line), its pid beside the file while it samples: a
    runner killed alone (kill -9) leaves its pairs process sampling, and the next runner waits for that one to end
    rather than write the same file beside it (then continues what it left, or finds it complete)."""
    pid_file = out.with_name(out.name + ".pid")
    try:
        old = psutil.Process(int(pid_file.read_text()))
        if str(out) in old.cmdline():
            say(f"a pairs process (pid {old.pid}) a stopped runner left is still writing {out.name}: waiting for it")
            old.wait()
    except (OSError, ValueError, psutil.Error):
        pass
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, env=cli_env(env))
    except OSError as e:
        raise CliError(f"could not run {argv[0]}: {e.strerror}") from None
    write_atomic(pid_file, f"{proc.pid}\n", fsync=False)
    stdout, stderr = proc.communicate()
    pid_file.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise CliError(error_line(last_line(stderr or stdout) or f"`workbench pairs` exited with {proc.returncode}"))


def prepare(store: QueueStore, item: Item, chain: Chain, i: int, env: dict[str, str] | None,
            say: Callable[[str], None]) -> Item:
    """Before round ``i``'s trainer starts: its pairs, sampled from the previous round's latest checkpoint (round 1:
    the source's chosen one) by ``workbench pairs`` (continued if a stop cut it short), its record written, and the
    item's ``--init-from`` pinned to the checkpoint sampled. A CliError (one line) when the pairs cannot be made or
    there is no pair to train on: the round fails there and the chain stops."""
    s, root = chain.spec, chain.root
    src = chain.source_of(i)
    if i == 1:
        step = int(s["step"])
    else:
        try:
            step = int(rundir.select_checkpoint(root / src, "latest")["step"])
        except rundir.RunError as e:
            raise CliError(f"round {i}: {e}") from None
    out = chain.pairs_path(i)
    say(f"round {i} of {chain.name}: sampling {s['samples']} completions a prompt from {src} step {step:,}")
    run_pairs(cli_argv(root, "pairs", src, "--checkpoint", str(step), "--prompts", s["prompts"], "--reward",
                       s["reward"], "--reward-timeout", repr(s["reward_timeout"]), "--samples", str(s["samples"]),
                       "--out", str(out), "--device", s["device"], *sampling_args(s, i)), out, env, say)
    meta = read_json(out.with_name(out.name + ".meta.json")) or {}
    rec = {"chain": chain.name, "round": i, "run": item.name, "source": src, "step": step, "pairs_file": str(out),
           "pairs": int(meta.get("pairs", 0)), "prompts": int(meta.get("prompts_total", 0)),
           "samples": int(s["samples"]), "mean_reward": meta.get("mean_reward"),
           "no_signal": int(meta.get("no_signal", 0)), "reward": s["reward"], "seed": round_seed(s, i)}
    write_atomic(chain.record_path(i), json.dumps(rec, indent=1) + "\n")
    mean = f"{rec['mean_reward']:.3f}" if rec["mean_reward"] is not None else "-"
    if rec["pairs"] == 0:
        raise CliError(f"round {i}: every prompt's {s['samples']} samples from {src} step {step:,} scored the same "
                       f"(mean reward {mean}): no pair to train on, so the chain stops here; a hotter --temperature, "
                       "more --samples or a graded reward gives pairs")
    say(f"round {i} of {chain.name}: {rec['pairs']:,} pairs from {rec['prompts']:,} prompts, mean reward {mean}")
    return store.update(item.id, init_from=f"{src}:{step}")


def queue_round(store: QueueStore, chain: Chain, i: int, say: Callable[[str], None]) -> Item | None:
    """Queue round ``i`` unless it is past the chain's end or already queued (or run)."""
    if i > chain.rounds:
        return None
    name = chain.run_name(i)
    if store.find(name) is not None or (chain.root / name).exists():
        return None
    try:
        item = store.add(chain.new_item(i))
    except QueueError:   # queued meanwhile by another process (the command and a runner catching up together)
        return None
    say(f"queued round {i} of {chain.name} ({name}, from {chain.source_of(i)})")
    return item


def round_ended(store: QueueStore, item: Item, say: Callable[[str], None]) -> None:
    """A queue item ended: if it is a round, its record goes into its run directory, and a finished round queues
    the next."""
    found = round_of(store.root, item)
    if found is None:
        return
    chain, i = found
    rec = chain.record(i)
    run_dir = chain.root / item.name
    if rec is not None and run_dir.is_dir():
        write_atomic(run_dir / ROUND_FILE, json.dumps({**rec, "state": item.state}, indent=1) + "\n")
    if item.state != "finished":
        say(f"{chain.name} stops at round {i} ({item.state}); to try the round again, `workbench queue rm "
            f"{item.name}` (and move its run directory aside, if it has one), then the same `workbench rounds`")
        return
    if i >= chain.rounds:
        say(f"{chain.name}: all {chain.rounds} rounds finished")
        return
    queue_round(store, chain, i + 1, say)


def catch_up(store: QueueStore, say: Callable[[str], None], only: Chain | None = None) -> None:
    """Rounds a dead runner left unqueued: each chain's first round if nothing of it is queued, and the round after
    its last one that finished (its record copied in too)."""
    for chain in [only] if only is not None else chains(store.root):
        last = 0
        for i in range(1, chain.rounds + 1):
            if store.find(chain.run_name(i)) is None and not (chain.root / chain.run_name(i)).exists():
                break
            last = i
        if last == 0:
            queue_round(store, chain, 1, say)
            continue
        item = store.find(chain.run_name(last))
        # a finished round whose next round or record is missing; a chain that has ended is left unsaid (every
        # `queue run` said "all N rounds finished" again for each chain it had ever run)
        if item is not None and item.state == "finished" and (
                last < chain.rounds or not (chain.root / item.name / ROUND_FILE).exists()):
            round_ended(store, item, say)


@dataclass(frozen=True)
class RoundRow:
    round: int
    run: str
    state: str            # the queue's state of its item; "-" not queued yet
    source: str
    step: int | None      # the source's checkpoint it sampled
    pairs: int | None
    mean_reward: float | None
    note: str | None


def rows(store: QueueStore | None, chain: Chain) -> list[RoundRow]:
    out = []
    for i in range(1, chain.rounds + 1):
        item = store.find(chain.run_name(i)) if store is not None else None
        rec = chain.record(i) or {}
        out.append(RoundRow(i, chain.run_name(i), item.state if item else "-", chain.source_of(i), rec.get("step"),
                            rec.get("pairs"), rec.get("mean_reward"), item.note if item else None))
    return out
