"""``--reward SPEC`` made into a :class:`Reward`, and every call of it guarded.

A SPEC is a built-in, ``NAME`` or ``NAME:ARG`` (:mod:`workbench.reward.builtin`: exact, regex, contains, length,
lexicon), or the user's own function, ``FILE.py:FUNCTION``: the file is run as a module (its own directory first
on ``sys.path`` while it loads, so it may import its neighbours) and FUNCTION is called as
``FUNCTION(prompt, completion, record) -> float``, ``record`` the prompt's whole record (a dict: its ``prompt`` and
any other fields of the prompts file's line). A file is told from a built-in by the ``.py`` before its last colon.

Each call is guarded (:meth:`Reward.score`): a reward that raises, returns what is not a number (a string, None; a
bool counts as 1.0 / 0.0), a NaN or an infinity, or runs longer than ``timeout_s`` (default
:data:`TIMEOUT_S`) is a :class:`RewardError` naming the reward, the prompt and the completion (each shortened),
which the CLI prints as one line with exit status 2. The time limit is a ``SIGALRM`` timer (``setitimer``), so it
holds in the main thread on Unix, where the CLI calls rewards; elsewhere (another thread, Windows) calls run
without a limit. A function stuck inside C code that never returns to Python is interrupted only when it does.

What a reward is, for the record written beside its results (:meth:`Reward.describe`): its ``name`` (the spec,
with a file's path as given), ``sha256`` (a user file's bytes, or a lexicon's word lists; None for the rest) and
the time limit.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import numbers
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from workbench.reward.builtin import BUILTINS, RewardError, Scorer

TIMEOUT_S = 5.0
SHOWN = 40          # characters of a prompt or completion a message shows


def shorten(text: str, n: int = SHOWN) -> str:
    """``text`` as a message quotes it: repr, cut to ``n`` characters with an ellipsis."""
    return repr(text if len(text) <= n else text[:n] + "…")


class _TimedOut(BaseException):
    """Raised into a reward by the alarm: a BaseException, so a user's ``except Exception`` does not swallow it."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _TimedOut


@dataclass(frozen=True)
class Reward:
    """A reward made from its spec: ``score`` calls it, guarded."""
    name: str                   # the spec as given: "exact:answer", "rewards/check.py:score"
    kind: str                   # the built-in's name, or "file"
    fn: Scorer
    field: str | None = None    # the record field every prompt must have (exact's)
    sha256: str | None = None   # a user file's digest, or a lexicon's word lists'
    timeout_s: float = TIMEOUT_S

    @property
    def short(self) -> str:
        """The name with a file's directory left out (``check.py:score``), for tables and task names."""
        return self.name if self.kind != "file" else f"{Path(self.name.rsplit(':', 1)[0]).name}:" \
                                                     f"{self.name.rsplit(':', 1)[1]}"

    def describe(self) -> dict[str, Any]:
        """What results written with this reward record of it."""
        return {"name": self.name, "kind": self.kind, "sha256": self.sha256, "timeout_s": self.timeout_s}

    def check_record(self, record: dict[str, Any], where: str) -> None:
        """Refuse, before anything is sampled, a prompt's record without the field the reward reads."""
        if self.field is not None and self.field not in record:
            have = ", ".join(map(repr, record)) or "no fields"
            raise RewardError(f"{where}: --reward {self.name} compares with the record's {self.field!r} field, which "
                              f"this record lacks (it has {have}); give a JSONL prompts file with "
                              f"{{\"prompt\": ..., \"{self.field}\": ...}} lines, or exact:FIELD")

    def score(self, prompt: str, completion: str, record: dict[str, Any]) -> float:
        """The reward of one completion, as a float; :class:`RewardError` (one line) if the reward fails."""
        timed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
        old: Any = None
        if timed:
            old = signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
        try:
            value = self.fn(prompt, completion, record)
        except _TimedOut:
            raise self._failed(f"took longer than {self.timeout_s:g} s (--reward-timeout)", prompt,
                               completion) from None
        except Exception as e:  # noqa: BLE001 - any failure of the user's code is reported, in one line
            detail = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
            raise self._failed(f"raised {type(e).__name__}" + (f": {detail}" if detail else ""), prompt,
                               completion) from None
        finally:
            if timed:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, numbers.Real):
            raise self._failed(f"returned {shorten(repr(value), 30)} ({type(value).__name__}), not a number",
                               prompt, completion)
        number = float(value)
        if not math.isfinite(number):
            raise self._failed(f"returned {number}, not a finite number", prompt, completion)
        return number

    def _failed(self, what: str, prompt: str, completion: str) -> RewardError:
        return RewardError(f"reward {self.short} {what} on prompt {shorten(prompt)} and completion "
                           f"{shorten(completion)}; fix the reward (nothing was written for this prompt)")


def load_function(path: Path, name: str, spec: str) -> tuple[Scorer, str]:
    """``name`` from the Python file ``path``, and the file's sha256; one line for each way it can fail."""
    path = path.expanduser()
    if not path.is_file():
        raise RewardError(f"--reward {spec}: reward file {path} does not exist; give FILE.py:FUNCTION")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RewardError(f"--reward {spec}: cannot read reward file {path}: {e.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    module_name = f"workbench_reward_{digest[:16]}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise RewardError(f"--reward {spec}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    here = str(path.resolve().parent)
    sys.path.insert(0, here)
    # nothing written beside the user's file: Python would leave __pycache__/NAME.cpython-*.pyc in their folder
    # (hidden where PYTHONDONTWRITEBYTECODE is set, as on the machines these tests first ran on)
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001 - a syntax error, an import that fails, a sys.exit at import
        detail = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        raise RewardError(f"--reward {spec}: loading {path} raised {type(e).__name__}"
                          + (f": {detail}" if detail else "") + "; fix the file") from None
    finally:
        sys.dont_write_bytecode = dont_write
        if here in sys.path:
            sys.path.remove(here)
    fn = getattr(module, name, None)
    if fn is None:
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module_name)
        have = f"it defines {', '.join(found)}" if found else "it defines no functions"
        raise RewardError(f"--reward {spec}: reward file {path} has no {name!r} ({have})")
    if not callable(fn):
        raise RewardError(f"--reward {spec}: {name!r} in {path} is a {type(fn).__name__}, not a function")
    return fn, digest


def is_file_spec(spec: str) -> bool:
    return ":" in spec and spec.rsplit(":", 1)[0].endswith(".py")


def parse_reward(spec: str, timeout_s: float = TIMEOUT_S) -> Reward:
    """``--reward SPEC`` as a :class:`Reward` (a user file loaded, a built-in's argument checked); one line for a
    spec that is neither."""
    if not timeout_s > 0:
        raise RewardError(f"--reward-timeout must be a positive number of seconds, not {timeout_s:g}")
    if is_file_spec(spec):
        file, name = spec.rsplit(":", 1)
        if not name.isidentifier():
            raise RewardError(f"--reward {spec}: {name!r} is not a Python function name; give FILE.py:FUNCTION")
        fn, digest = load_function(Path(file), name, spec)
        return Reward(spec, "file", fn, sha256=digest, timeout_s=timeout_s)
    kind, _, arg = spec.partition(":")
    if kind not in BUILTINS:
        if spec.endswith(".py"):
            hint = f"; name the function too: {spec}:FUNCTION"
        else:
            hint = ""
        raise RewardError(f"--reward {spec!r} is neither a built-in ({', '.join(BUILTINS)}) nor FILE.py:FUNCTION"
                          + hint)
    made = BUILTINS[kind](arg)
    return Reward(spec, kind, made.score, field=made.field, sha256=made.sha256, timeout_s=timeout_s)


__all__ = ["Reward", "RewardError", "SHOWN", "TIMEOUT_S", "is_file_spec", "load_function", "parse_reward",
           "shorten"]
