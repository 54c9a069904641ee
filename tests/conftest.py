"""Shared fixtures: one cache of tokenizers/corpora for the whole session, one tiny trained run. The helpers
tests share are in tests/support."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

# One torch thread per process: the test workers share the two cores (2 threads each was 9 % slower and 20 %
# more CPU time), and the CLI's fork server (tests/support/zygote.py) may only fork a process with one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bytecode written, whatever the environment says: with PYTHONDONTWRITEBYTECODE set (it is on this project's
# machines, CI's included) no workbench module ever had a .pyc, so every process the tests start (a CLI command,
# a trainer, a runner: well over a thousand) compiled the ~150 modules it imports from source again
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
if "torch" in sys.modules:
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

from tests.support import spawner  # noqa: E402
from tests.support.cli import FACTS, tiny, wb  # noqa: E402
from tests.support.schedule import longest_first  # noqa: E402
from tests.support.shared import built_once  # noqa: E402

# Detached trainers (the TUI's, the queue's, a sweep's trials) forked from a server with torch imported, not each
# a fresh interpreter (tests/support/spawner.py); every process the tests start inherits the variable.
if "WORKBENCH_TEST_SPAWN" not in os.environ and (_spawn := spawner.start()):
    os.environ["WORKBENCH_TEST_SPAWN"] = _spawn

# CI: a skip not marked gpu fails (tests/support/strict_skips.py)
pytest_plugins = ["tests.support.strict_skips"]


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory):
    """Tokenizers and encoded corpora are cached once per test session (subprocesses inherit it)."""
    d = tmp_path_factory.mktemp("wbcache")
    old = os.environ.get("WORKBENCH_CACHE_DIR")
    os.environ["WORKBENCH_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("WORKBENCH_CACHE_DIR", None)
    else:
        os.environ["WORKBENCH_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """One tiny real run on the built-in corpus, shared by the tests that only read it. In a fresh interpreter, as
    a user starts it: its peak RSS is held to the estimate (a forked child's leaves out untouched library pages)."""
    def train(out: Path) -> None:
        wb("train", "cpu-small", "--name", "tiny", "--runs-dir", str(out / "runs"),
           *tiny("train.max_iters=60", "train.eval_interval=20", "train.ckpt_interval=20", "model.dropout=0.1",
                 "train.lr=3e-3"), check=True, fresh=True)
    # trained once whatever the number of test workers (each trained it: issue 54's CI time); each worker its copy
    built = built_once(tmp_path_factory, "trained-run", train)
    return shutil.copytree(built / "runs", tmp_path_factory.mktemp("runs"), dirs_exist_ok=True) / "tiny"


@pytest.fixture(scope="session")
def facts_run(tmp_path_factory) -> Path:
    """A tiny model that has learned twelve facts ("code 003 means cloud."; tests.support.cli.FACTS) by heart:
    its greedy answers are known, for exact-match scoring (150 steps, ~5 s). 322 pieces: the 320 it was tuned at plus
    the two ChatML control pieces every tokenizer now reserves (the same merges, so the same facts learned)."""
    import random

    def train(d: Path) -> None:
        rng = random.Random(0)
        lines = [f"{q} {a}." for q, a in FACTS]
        blocks = []
        for _ in range(400):
            rng.shuffle(lines)
            blocks.append("\n".join(lines) + "\n")
        (d / "facts.txt").write_text("\n".join(blocks))
        wb("train", "cpu-small", "--name", "facts", "--runs-dir", str(d / "runs"), "--corpus", str(d / "facts.txt"),
           *tiny("model.vocab_size=322", "train.batch_size=8", "train.warmup_iters=5", "train.log_interval=10",
                 "train.max_iters=150", "train.eval_interval=50", "train.ckpt_interval=50", "train.lr=3e-3"),
           check=True)
    # trained once whatever the number of test workers; each worker its copy (its corpus stays where it was trained)
    built = built_once(tmp_path_factory, "facts-run", train)
    return shutil.copytree(built / "runs", tmp_path_factory.mktemp("facts") / "runs") / "facts"


# ----------------------------------------------------------------------------- fine-tuning (tests.support.hf)

@pytest.fixture(scope="session")
def hf_tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer (GPT-2 / Llama 3 / Qwen style) of 400 ids with two special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.support.hf import corpus_text  # transformers is imported only by the sessions that need it
    out = tmp_path_factory.mktemp("hf-tok")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([corpus_text()], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    import transformers
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>")
    fast.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory, hf_tokenizer_dir) -> dict[str, Path]:
    from tests.support.hf import KINDS, build_hf_model
    root = tmp_path_factory.mktemp("hf-models")
    return {kind: build_hf_model(root / kind, kind, hf_tokenizer_dir) for kind in KINDS}


@pytest.fixture(scope="session")
def imported(tmp_path_factory, hf_models) -> Path:
    """A runs directory with each model imported under its kind's name (in this process: the CLI is tested
    on its own)."""
    from workbench.interop.hf_import import import_model
    root = tmp_path_factory.mktemp("ft-runs")
    for kind, d in hf_models.items():
        import_model(d, root, kind, log=lambda m: None)
    return root


@pytest.fixture(scope="session")
def ft_corpus(tmp_path_factory) -> Path:
    from tests.support.hf import corpus_text
    path = tmp_path_factory.mktemp("ft-corpus") / "python.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


@dataclasses.dataclass
class LoraRun:
    root: Path
    run_dir: Path
    trained_state: dict     # the trainer's model state dict when it finished (frozen weights and adapters)
    log: str


@pytest.fixture(scope="session")
def lora_run(imported, ft_corpus) -> LoraRun:
    """A LoRA run of 30 steps on llama-gqa-tied, trained in this process by the CLI's own code path, with the
    trainer's model kept for inspection."""
    import torch

    from tests.support.hf import FT
    from workbench.cli import main
    from workbench.train.loop import Trainer
    kept: dict = {}
    original = Trainer.train

    def keep(self):
        state = original(self)
        kept["sd"] = {k: v.detach().clone() for k, v in self.built.model.state_dict().items()}
        return state

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "train", keep)
        rc = main(["train", "cpu-small", "--init-from", "llama-gqa-tied", "--corpus", str(ft_corpus), "--name", "lora",
                   "--runs-dir", str(imported), "--set", *FT, "train.finetune=lora", "train.max_iters=30",
                   "train.eval_interval=10", "train.ckpt_interval=10", "train.lr=3e-3", "train.lora_rank=4"])
    for s, h in handlers.items():
        signal.signal(s, h)
    torch.set_num_threads(threads)
    assert rc == 0
    run_dir = imported / "lora"
    return LoraRun(imported, run_dir, kept["sd"], (run_dir / "train.log").read_text())


@pytest.fixture(scope="session")
def hf_chat_model(tmp_path_factory, hf_models, hf_tokenizer_dir) -> Path:
    """A tiny Llama with a ChatML template, saved by transformers 5's save_pretrained (chat_template.jinja), as an
    instruct model is downloaded."""
    from tests.support.hf import build_chat_model
    return build_chat_model(tmp_path_factory.mktemp("hf-chat") / "tiny-chat", hf_models["llama-gqa-tied"],
                            hf_tokenizer_dir)


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of the module's own (tests/support/postgres.py: initdb and pg_ctl in a temporary
    directory on a free port, password authentication), stopped and removed at the module's end."""
    from tests.support.postgres import NoPostgres, postgres_server
    try:
        with postgres_server() as server:
            yield server
    except NoPostgres as e:
        pytest.fail(str(e))


def pytest_collection_modifyitems(config, items):
    """The longest test files first (tests/support/schedule.py), so the workers finish together."""
    longest_first(items)
