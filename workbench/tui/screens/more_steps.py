"""Continue a finished run for N more steps: how many, and what that does to the learning rate."""

from __future__ import annotations

from workbench.config import Preset
from workbench.plan.schedule import extension_note
from workbench.tui.screens.dialogs import InputScreen


class MoreStepsScreen(InputScreen):
    """Dismisses with the number of steps to add, or None."""

    input_id = "more-n"
    input_type = "integer"
    ok_label = "Continue"
    live = True

    def __init__(self, run_id: str, preset: Preset, from_step: int):
        super().__init__(f"Continue [b]{run_id}[/b] from step {from_step:,} for how many more steps?",
                         str(max(1, preset.train.max_iters // 2)), wide=True)
        self.preset, self.from_step = preset, from_step

    def parse(self, text: str) -> tuple[int | None, str]:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            return None, "give a whole number of steps, at least 1"
        return n, (f"to step {self.from_step + n:,}; {extension_note(self.preset, self.from_step, n)}. "
                   "Recorded in the run's events as a change of train.max_iters.")
