"""train.time_budget's durations ("45m", "2h", "1h30m", "90s"): text to seconds, or one line saying how to
write one."""

from __future__ import annotations

import re

from workbench.errors import WorkbenchError


class DurationError(WorkbenchError):
    pass


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
        raise DurationError(f"train.time_budget = {text!r} is not a duration; write it like 45m, 2h, 1h30m or 90s")
    h, mi, sec = (float(x) if x else 0.0 for x in m.groups())
    seconds = 3600 * h + 60 * mi + sec
    if seconds < 1:
        raise DurationError(f"train.time_budget = {text!r} is less than a second; give at least 1s (e.g. 10m)")
    return seconds
