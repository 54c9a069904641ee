"""Command palette (ctrl+p): every action of the workbench, including per-run ones."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Callable, Iterator

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from workbench.tui.app import WorkbenchApp

Command = tuple[str, str, Callable[[], object]]


def workbench_commands(app: "WorkbenchApp") -> Iterator[Command]:
    for tab, label in app.TAB_LABELS.items():
        yield f"Go to {label}", f"show the {label} pane", partial(app.action_show_tab, tab)
    rec = app.recommended[0] if app.recommended else "the recommended preset"
    yield "New run…", "start training a preset (detached: keeps running if the TUI closes)", app.action_new_run
    yield f"Train recommended preset ({rec})", "start a run with the preset picked for this machine", \
        app.action_train_recommended
    if app.monitored:
        yield f"Stop run {app.monitored}", "SIGTERM the trainer; it saves a checkpoint and exits", app.action_stop_run
        yield f"Resume run {app.monitored} from latest", "restart training from its last checkpoint", \
            app.action_resume_run
    for s in app.summaries:
        yield f"Monitor {s.id}", f"{s.state}, step {s.step}", partial(app.monitor, s.id)
        yield f"Loss curves: add {s.id}", "overlay this run's loss", partial(app.open_curves, s.id)
        yield f"Sample from {s.id}", "generate text from its latest checkpoint", partial(app.open_sample, s.id)
        if s.state not in ("starting", "running"):
            yield f"Resume {s.id} from latest", f"{len(s.checkpoints)} checkpoint(s)", \
                partial(app.resume, s.id, "latest")
            yield f"Delete run {s.id}…", "remove its directory (asks first)", partial(app.delete_run, s.id)
    yield "Loss curves: toggle log scale", "", partial(app.curves_action, "toggle_log")
    yield "Loss curves: step / tokens on x", "", partial(app.curves_action, "toggle_x")
    yield "Loss curves: cycle smoothing", "EMA 0 / 0.6 / 0.9 / 0.97", partial(app.curves_action, "cycle_smoothing")
    yield "Loss curves: train / val / both", "", partial(app.curves_action, "cycle_show")
    yield "Generate sample", "run the sampler on the chosen checkpoint(s)", app.action_generate
    yield "Stop sampling", "", app.action_cancel_sampling
    yield "Save preset", "atomic; shipped presets are saved as a user copy", partial(app.save_preset, False)
    yield "Save preset as…", "save the editor's preset under a new name", partial(app.save_preset, True)
    yield "Refresh hardware", "", app.action_refresh_hardware
    yield "Refresh runs", "", app.action_refresh_runs


class WorkbenchCommands(Provider):
    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in workbench_commands(self.app):  # type: ignore[arg-type]
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, text=name, help=help_text or None)

    async def discover(self) -> Hits:
        for name, help_text, callback in workbench_commands(self.app):  # type: ignore[arg-type]
            yield DiscoveryHit(name, callback, text=name, help=help_text or None)
