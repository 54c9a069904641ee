"""Continue a finished run for N more steps: how many, and what that does to the learning rate."""

from __future__ import annotations

from workbench.config import Preset
from workbench.plan.run_plan import checkpoint_state
from workbench.plan.schedule.horizon import extension
from workbench.tui.screens.dialogs import InputScreen


def default_more(p: Preset, from_step: int) -> int:
    """The dialog's first offer: as many steps again as the run has trained (a run twice as long: the usual next
    try when a run was still improving), but at least enough to end at twice the preset's warmup, so the longer
    run leaves its warmup (resume refuses one that ends inside it), holds its peak rate and decays. Half the run
    (the old offer) gave 1 step to a 3-step budgeted run; eval_interval would offer 200 to a 3-step run and a
    sliver to a 20,000-step one."""
    return max(1, from_step, 2 * p.train.warmup_iters - from_step)


class MoreStepsScreen(InputScreen):
    """Dismisses with the number of steps to add, or None."""

    input_id = "more-n"
    input_type = "integer"
    ok_label = "Continue"
    live = True

    def __init__(self, run_id: str, preset: Preset, ckpt: dict):
        from_step = int(ckpt["step"])
        super().__init__(f"Continue [b]{run_id}[/b] from step {from_step:,} for how many more steps?",
                         str(default_more(preset, from_step)), wide=True)
        # the checkpoint's trainer state: a budgeted run's horizon (where its decay began) is kept there
        self.preset, self.from_step, self.state = preset, from_step, checkpoint_state(ckpt)

    def parse(self, text: str) -> tuple[int | None, str]:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            return None, "give a whole number of steps, at least 1"
        ext = extension(self.preset, self.state, self.from_step, n)  # what resume --more n does and says
        if ext.problem:
            return None, ext.problem
        where = ("a new run goes on from its checkpoint there" if ext.from_step != self.from_step else
                 "recorded in the run's events as a change of train.max_iters")
        return n, f"to step {ext.end_step:,}; {ext.note}; {where}."
