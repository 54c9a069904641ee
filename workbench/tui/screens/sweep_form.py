"""The sweep form (Presets ``ctrl+f``, Queue ``s``): a sweep of a preset, as ``workbench sweep PRESET --set-grid
...`` makes one, with each trial's estimate and the warnings shown as the user types.

The searched keys are one a line, ``train.lr = 1e-3, 3e-3`` (what ``--set-grid train.lr=1e-3,3e-3`` takes); the
method (grid, random or tpe with a trial count), the time budget per trial, the pruner, a name, fixed ``--set``
values and ``force`` (``sweep --force``) beside them. The spec is built by ``queue.sweep_spec.build_spec`` and each
trial admitted by ``queue.sweep.plan_trials`` (the admission ``create_sweep`` runs: auto-fit, the budget's plan and
its refusal unless forced), in-process and torch-free, so the form shows the lines ``workbench sweep`` prints.
Queueing runs ``workbench sweep`` itself with the checked spec's arguments (``launcher.sweep_command``, as the Queue
tab's ``b`` runs ``sweep save-best`` and ``a`` runs ``queue add``): the same ``build_spec`` and ``create_sweep``,
this machine's speed measured first where it never was, and Optuna kept out of the TUI process. What it refuses is
one line in the form, which stays open; nothing is queued then."""

from __future__ import annotations

import dataclasses
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, TextArea

from workbench.cli_client import CliError
from workbench.config import preset_paths
from workbench.errors import WorkbenchError
from workbench.machine.detect import Machine, detect
from workbench.queue.admit import admit
from workbench.queue.store import QueueStore, trial_name
from workbench.queue.sweep import plan_trials
from workbench.queue.sweep_spec import (
    METHODS,
    PRUNERS,
    SpecError,
    SweepSpec,
    build_spec,
    parse_set_grid,
    point_sets,
    toml_literal,
)
from workbench.rundir import runs_root
from workbench.tui import launcher
from workbench.tui.screens.dialogs import form_field

PARAMS_HINT = "one searched key a line, its values after =, e.g.\ntrain.lr = 1e-3, 3e-3\ntrain.warmup_iters = 10, 50"
MAX_CHECKED = 200   # a bigger search is checked trial by trial when it is queued, not as the user types
UNMEASURED = "time: unknown until this machine's speed is measured"


@dataclass(frozen=True)
class SweepFields:
    """What the form holds, as typed."""
    preset: str
    params: str              # one ``key = v1, v2`` a line
    method: str = "grid"
    trials: str = ""         # random, tpe: how many
    budget: str = ""         # each trial's time budget (--time-budget); "" runs max_iters
    pruner: str = "none"
    name: str = ""           # "" : the first free of PRESET-sweep, PRESET-sweep-2, ...
    sets: str = ""           # fixed --set values, as the new-run form takes them
    force: bool = False


@dataclass(frozen=True)
class SweepQueued:
    """What the form dismisses with: the sweep queued and the last line `workbench sweep` printed."""
    name: str
    said: str


def grid_lines(text: str) -> list[str]:
    """The searched-keys box as ``--set-grid`` items (blank and ``#`` lines left out)."""
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def free_name(root: Path, preset: str) -> str:
    """`workbench sweep`'s default name, PRESET-sweep, or the first of PRESET-sweep-2, -3 ... that is free."""
    base = f"{Path(preset).stem}-sweep"
    store = QueueStore.open_existing(root, readonly=True)
    if store is None:
        return base
    try:
        k = 1
        while store.name_in_use(base if k == 1 else f"{base}-{k}"):
            k += 1
        return base if k == 1 else f"{base}-{k}"
    finally:
        store.close()


def _sets(text: str) -> tuple[str, ...]:
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    return tuple(w.removeprefix("--set=") for w in words if w != "--set")


def build(fields: SweepFields, root: Path) -> SweepSpec:
    """The checked spec, as `workbench sweep PRESET --set-grid ...` builds it (``_spec``: build_spec over
    parse_set_grid), forced as ``--force`` forces it; a SpecError (WorkbenchError) names the first problem."""
    trials = None
    if fields.method != "grid":
        try:
            trials = int(fields.trials)
        except ValueError:
            raise SpecError(f"method {fields.method} needs the number of trials (a whole number, e.g. 12)") from None
    spec = build_spec(name=fields.name or free_name(root, fields.preset), preset=fields.preset,
                      method=fields.method, params=parse_set_grid(grid_lines(fields.params)), trials=trials,
                      time_budget=fields.budget or None, sets=_sets(fields.sets), pruner=fields.pruner)
    if fields.name:
        store = QueueStore.open_existing(root, readonly=True)
        why = store.name_in_use(spec.name) if store else None
        if store:
            store.close()
        if why:  # (create_sweep's refusal, said before a process starts)
            raise SpecError(f"sweep name {spec.name!r} is taken: {why}; choose another name")
    return dataclasses.replace(spec, force=fields.force)


def sweep_args(spec: SweepSpec) -> list[str]:
    """The arguments of `workbench sweep` that make ``spec`` (its values written exactly, as --set takes them)."""
    args = [spec.preset]
    for p in spec.params:
        args += ["--set-grid", f"{p.key}=" + ",".join(toml_literal(v) for v in p.values)]
    if spec.time_budget:
        args += ["--time-budget", spec.time_budget]
    args += ["--method", spec.method, *(["--trials", str(spec.trials)] if spec.method != "grid" else []),
             "--pruner", spec.pruner, "--name", spec.name]
    for s in spec.sets:
        args += ["--set", s]
    return args + (["--force"] if spec.force else [])


def estimate(spec: SweepSpec, root: Path, info: dict) -> tuple[Text, int]:
    """What the form shows for ``spec`` on this machine: the sweep's line, each trial's estimate (its budget's
    plan: steps, warmup, evals and their share, the speed it assumes; or its time for max_iters) and, a line a
    trial, what `workbench sweep` does with it (queued, with its warnings or its auto-fit, or refused and why);
    and how many would be queued. Random and tpe draw their trials from the values' points: each point is shown
    as a drawn trial would be admitted."""
    machine = Machine.from_info(info)
    size = math.prod(len(p.values) for p in spec.params)
    shape = " x ".join(str(len(p.values)) for p in spec.params)
    head = (f"{spec.trials} trial(s) " + (f"(grid {shape})" if spec.method == "grid" else
                                         f"drawn by {spec.method} from {size} point(s)")
            + f" of {spec.preset}" + (f", {spec.time_budget} each" if spec.time_budget else ", max_iters each")
            + f", ranked by {spec.metric.name} ({spec.metric.goal})"
            + (f", {spec.pruner} pruner" if spec.pruner != "none" else ""))
    out = Text(head, style="bold")
    if size > MAX_CHECKED:
        out.append(f"\n{size:,} points: each trial is estimated when the sweep is queued", style="dim")
        return out, spec.trials
    grid = spec if spec.method == "grid" else dataclasses.replace(spec, method="grid", trials=size)
    made = plan_trials(root, grid, machine, info)   # the admission create_sweep runs (a bad value raises)
    times: dict[str, list[int]] = {}
    memory = set()
    for k, m in enumerate(made, 1):
        if m.item is not None:
            check = admit(root, m.item, machine, info).check   # the queued run's own estimate (auto-fit included)
            times.setdefault(check.time, []).append(k)
            memory.add(check.memory)
    for line, which in times.items():
        who = "each trial" if len(which) == len(made) else ", ".join(_label(spec, k) for k in which)
        out.append(f"\n{who}: ", style="bold")
        out.append(line, style="yellow" if "warning:" in line else "")
        if line.startswith(UNMEASURED) and spec.time_budget:
            out.append("\n  (`workbench sweep` measures this machine's speed first, a few seconds, and plans the "
                       "budgets with it)", style="dim")
    if len(memory) == 1:
        out.append(f"\nmemory: {memory.pop()}", style="dim")
    for k, m in enumerate(made, 1):
        what = ("queued" + (f" ({m.note})" if m.note else "")) if m.item is not None else f"refused: {m.note}"
        style = "red" if m.item is None else "yellow" if m.note and "warning:" in m.note else ""
        out.append(f"\n  {_label(spec, k)}  {' '.join(point_sets(m.params))}  ", style="dim")
        out.append(what, style=style)
    ok = sum(m.item is not None for m in made)
    if spec.method == "grid":
        out.append(f"\n{ok} of {len(made)} trial(s) would be queued", style="bold" if ok else "bold red")
        if ok < len(made) and not spec.force:
            out.append(" (force queues the refused ones anyway)" if any("--force" in (m.note or "") for m in made)
                       else "", style="dim")
    else:
        out.append(f"\n{ok} of {len(made)} point(s) can be queued; a refused draw is drawn again",
                   style="bold" if ok else "bold red")
    return out, ok if spec.method == "grid" else (spec.trials if ok else 0)


def _label(spec: SweepSpec, k: int) -> str:
    return trial_name(spec.name, k) if spec.method == "grid" else f"point {k}"


class SweepFormScreen(ModalScreen["SweepQueued | None"]):
    BINDINGS = [Binding("escape", "cancel", "Cancel"),
                # priority: the form's one action key wins wherever the focus is (the searched-keys box too)
                Binding("ctrl+s", "queue", "Queue the sweep", priority=True)]
    DEFAULT_CSS = """
    #sw-params { height: 5; width: 1fr; }
    #sw-estimate-box { height: auto; max-height: 14; }
    """
    WIDTH = 120   # the estimate's lines are long (the dialogs' 64 or 90 columns would wrap each twice)

    def __init__(self, preset: str | None, runs_dir: Path | None = None, machine_info: dict | None = None):
        """``preset``: the one chosen (Presets pane); ``machine_info``: the hardware the estimate is for (the app's,
        as the new-run form's; default: detected now)."""
        super().__init__()
        self.preset = preset
        self.root = runs_root(runs_dir)
        self.machine_info = machine_info
        self.queued: int | None = None   # how many trials the estimate shown would queue (None: not estimated)
        self.busy = False
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        names = sorted(preset_paths())
        initial = self.preset if self.preset in names else (names[0] if names else Select.NULL)
        with Vertical(classes="dialog", id="sweep-form"):
            yield Label("[b]New sweep[/b]: trials queued as runs, ranked by what they reach (`workbench sweep`)")
            yield form_field("preset", Select([(n, n) for n in names], value=initial, allow_blank=False,
                                              id="sw-preset"))
            yield form_field("search", TextArea("", id="sw-params", placeholder=PARAMS_HINT, soft_wrap=False))
            yield form_field("method", Select([(m, m) for m in METHODS], value="grid", allow_blank=False,
                                              id="sw-method"),
                             Label("trials", classes="field-label"),
                             Input("", placeholder="(grid: all)", id="sw-trials", type="integer"),
                             Label("pruner", classes="field-label"),
                             Select([(p, p) for p in PRUNERS], value="none", allow_blank=False, id="sw-pruner"))
            yield form_field("budget", Input("", placeholder="each trial's time: 20s, 5m (empty: max_iters)",
                                             id="sw-budget"),
                             Label("name", classes="field-label"),
                             Input("", placeholder="(PRESET-sweep)", id="sw-name"))
            yield form_field("--set", Input("", placeholder="fixed values: train.warmup_iters=10 …", id="sw-sets"))
            yield Checkbox("force: queue trials whose budget cannot buy a complete run (`sweep --force`)",
                           id="sw-force")
            with VerticalScroll(id="sw-estimate-box"):
                yield Static("", id="sw-estimate")
            yield Static("", id="sw-error", classes="error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Queue (ctrl+s)", id="queue", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        dialog = self.query_one("#sweep-form")
        dialog.styles.width = self.WIDTH
        # a short terminal (80 x 24) scrolls the form rather than cut off its estimate and buttons
        dialog.styles.max_height = "100%"
        dialog.styles.overflow_y = "auto"
        self.query_one("#sw-params", TextArea).focus()
        self._name_hint()
        self.show_estimate()

    # ------------------------------------------------------------------ reading the form

    def fields(self) -> SweepFields:
        return SweepFields(preset=str(self.query_one("#sw-preset", Select).value),
                           params=self.query_one("#sw-params", TextArea).text,
                           method=str(self.query_one("#sw-method", Select).value),
                           trials=self.query_one("#sw-trials", Input).value.strip(),
                           budget=self.query_one("#sw-budget", Input).value.strip(),
                           pruner=str(self.query_one("#sw-pruner", Select).value),
                           name=self.query_one("#sw-name", Input).value.strip(),
                           sets=self.query_one("#sw-sets", Input).value,
                           force=self.query_one("#sw-force", Checkbox).value)

    def _name_hint(self) -> None:
        preset = str(self.query_one("#sw-preset", Select).value)
        self.query_one("#sw-name", Input).placeholder = f"({free_name(self.root, preset)})"

    # ------------------------------------------------------------------ the estimate, as the user types

    @on(Input.Changed)
    @on(TextArea.Changed)
    @on(Checkbox.Changed)
    @on(Select.Changed)
    def _changed(self, event: Message) -> None:
        if isinstance(event, Select.Changed) and event.select.id == "sw-preset":
            self._name_hint()
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(0.3, self.show_estimate)

    def show_estimate(self) -> None:
        if not self.is_attached or not self.query("#sw-estimate"):
            return
        fields = self.fields()
        if not grid_lines(fields.params):
            self._show(fields, Text("Type the searched keys, one a line: train.lr = 1e-3, 3e-3", style="dim"), "",
                       None)
            return
        self._estimate(fields)

    @work(thread=True, exclusive=True, group="sweep-estimate", exit_on_error=False)
    def _estimate(self, fields: SweepFields) -> None:
        try:
            spec = build(fields, self.root)
            text, ok = estimate(spec, self.root, self.machine_info or detect())
        except (WorkbenchError, OSError) as e:
            self.app.call_from_thread(self._show, fields, Text(""), str(e), None)
            return
        self.app.call_from_thread(self._show, fields, text, "", ok)

    def _show(self, fields: SweepFields, text: Text, error: str, ok: int | None) -> None:
        if not self.is_attached or not self.query("#sw-estimate") or fields != self.fields():  # typed on since
            return
        self.queued = ok
        self.query_one("#sw-estimate", Static).update(text)
        if not self.busy:
            self.query_one("#sw-error", Static).update(error)

    # ------------------------------------------------------------------ queueing

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "queue":
            self.action_queue()
        else:
            self.action_cancel()

    def on_input_submitted(self) -> None:
        self.action_queue()

    def action_queue(self) -> None:
        """Check the sweep here as the estimate does (a bad value, key or name is one line, before any process
        starts), then run `workbench sweep` with its arguments: its refusal, if it refuses, is the form's line and
        nothing is queued; once it has queued the sweep the form closes with its last line."""
        if self.busy:
            return
        self.busy = True
        self.query_one("#queue", Button).disabled = True
        self.query_one("#sw-error", Static).update(Text("checking the trials…", style="dim"))
        self._queue(self.fields())

    @work(thread=True, exclusive=True, group="sweep-queue", exit_on_error=False)
    def _queue(self, fields: SweepFields) -> None:
        try:
            spec = build(fields, self.root)
            estimate(spec, self.root, self.machine_info or detect())   # a value the preset refuses raises here
        except (WorkbenchError, OSError) as e:
            self.app.call_from_thread(self._refused, str(e))
            return
        self.app.call_from_thread(self._say, Text(f"queueing: workbench sweep {shlex.join(sweep_args(spec))}",
                                                  style="dim"))
        try:
            said = launcher.sweep_command(self.root, *sweep_args(spec), timeout=300)
        except CliError as e:
            self.app.call_from_thread(self._refused, str(e))
            return
        self.app.call_from_thread(self._queued, SweepQueued(spec.name, said))

    def _queued(self, queued: SweepQueued) -> None:
        if self.is_attached and self.app.screen is self:
            self.dismiss(queued)
        else:  # closed (esc) while `workbench sweep` ran: it went on, and the toast says what it did
            self.app.notify(f"Sweep {queued.name}: {queued.said}")

    def _say(self, text: Text | str) -> None:
        if self.is_attached and self.query("#sw-error"):
            self.query_one("#sw-error", Static).update(text)

    def _refused(self, why: str) -> None:
        self.busy = False
        if self.is_attached and self.query("#sw-error"):
            self.query_one("#queue", Button).disabled = False
            self.query_one("#sw-error", Static).update(why)
        else:
            self.app.notify(f"The sweep was not queued: {why}", severity="error")

    def action_cancel(self) -> None:
        self.dismiss(None)
