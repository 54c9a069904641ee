"""train.time_budget's durations ("45m", "2h", "1h30m", "90s"): text to seconds, or one line saying how to
write one."""

from __future__ import annotations

import re
from dataclasses import dataclass

from workbench.errors import WorkbenchError


class DurationError(WorkbenchError):
    """``train.time_budget = 'TEXT' PROBLEM``. ``problem`` alone is for a caller that names where the text came
    from (``--time-budget 45x is not a duration; ...``); ``not_duration``: the text is no duration at all (the
    problem lists the forms), not one too short."""

    def __init__(self, text: str, problem: str, not_duration: bool = False):
        super().__init__(f"train.time_budget = {text!r} {problem}")
        self.problem, self.not_duration = problem, not_duration


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


def budget_seconds(text: str) -> float | None:
    """train.time_budget in seconds ("45m", "2h", "1h30m", "90s", "1.5h"; a bare number is minutes), None
    for "" (no budget); a PresetError for anything else."""
    text = str(text).strip().lower().replace(" ", "")
    if not text:
        return None
    if re.fullmatch(r"\d+(\.\d+)?", text):
        text += "m"
    m = _DURATION.fullmatch(text)
    if not m or not any(m.groups()):
        raise DurationError(text, "is not a duration; write it like 45m, 2h, 1h30m or 90s", not_duration=True)
    h, mi, sec = (float(x) if x else 0.0 for x in m.groups())
    seconds = 3600 * h + 60 * mi + sec
    if seconds < 1:
        raise DurationError(text, "is less than a second; give at least 1s (e.g. 10m)")
    return seconds


@dataclass(frozen=True)
class TimeBudget:
    """A run's time budget, parsed once where a run is asked for: the text as written (what the preset keeps,
    ``--time-budget`` passes on and the queue shows) and its seconds."""
    text: str
    seconds: float

    @classmethod
    def parse(cls, text: str | None) -> "TimeBudget | None":
        """``text`` (``45m``, ``2h``, ``90``) as a budget; None for None or ""; a DurationError for a bad one."""
        seconds = budget_seconds(text) if text is not None else None
        return None if seconds is None or text is None else cls(text, seconds)
