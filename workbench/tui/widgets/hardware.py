"""Hardware pane: CPU, RAM, NVIDIA GPUs (live), MPS, capabilities, recommended preset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static

from workbench.fmt import human_bytes
from workbench.tui import hwinfo
from workbench.tui.widgets.pane import Pane


def _gb(n: float | None) -> str:
    return "—" if n is None else human_bytes(n)


def render_hardware(info: dict, recommended: tuple[str, str]) -> Group:
    cpu = info.get("cpu") or {}
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("CPU", f"{cpu.get('model', '?')} ({cpu.get('arch', '?')})")
    t.add_row("cores", f"{cpu.get('physical_cores', '?')} physical, {cpu.get('logical_cores', '?')} threads"
              + (f", {cpu['usable_cores']} usable" if cpu.get("usable_cores") else ""))
    t.add_row("RAM", f"{_gb(cpu.get('ram_available'))} free of {_gb(cpu.get('ram_total'))}")
    parts: list = [t, Text("")]

    gpus = info.get("nvidia") or []
    if gpus:
        g = Table(title="NVIDIA GPUs", title_justify="left", title_style="bold", expand=False,
                  show_edge=False, pad_edge=False)
        for col in ("#", "name", "VRAM used / total", "cc", "util", "temp", "power", "driver"):
            g.add_column(col, no_wrap=col != "name")
        for d in gpus:
            power = "—" if d.get("power_w") is None else f"{d['power_w']:.0f}/{d.get('power_limit_w') or 0:.0f} W"
            g.add_row(str(d.get("index", "?")), str(d.get("name", "?")),
                      f"{_gb(d.get('vram_used'))} / {_gb(d.get('vram_total'))}",
                      str(d.get("compute_capability") or "—"),
                      "—" if d.get("utilization_pct") is None else f"{d['utilization_pct']}%",
                      "—" if d.get("temperature_c") is None else f"{d['temperature_c']}°C",
                      power, str(d.get("driver") or "—"))
        parts.append(g)
    else:
        parts.append(Text(str(info.get("nvidia_note") or "no NVIDIA GPU"), style="dim"))
    parts.append(Text("Apple MPS: available" if info.get("mps") else "Apple MPS: not present", style="dim"))
    parts.append(Text(""))

    c = Table(title="What training can use here (from the hardware; torch not loaded)", title_justify="left",
              title_style="bold", show_edge=False, pad_edge=False)
    for col in ("device", "precision", "TF32", "attention", "torch.compile"):
        c.add_column(col)
    for row in hwinfo.capabilities(info):
        c.add_row(*row)
    parts.append(c)
    parts.append(Text(""))
    name, why = recommended
    rec = Text.assemble(("Recommended preset: ", "bold"), (name, "bold green"),
                        (f"  ({why})" if why else "", "dim"), ("   press t to start a run with it", "italic"))
    parts.append(rec)
    if info.get("note"):
        parts.append(Text(info["note"], style="yellow"))
    return Group(*parts)


class HardwarePane(VerticalScroll, Pane):
    """The machine, read again every few seconds while the pane is shown (in a thread: reading the
    GPUs takes a while). Each reading is posted as ``HardwarePane.Read``, for the app too."""

    can_focus = True
    BINDINGS = [
        Binding("t", "train", "Train recommended"),
        Binding("f", "refresh", "Refresh"),
    ]

    @dataclass
    class Read(Message):
        """The hardware was read; ``recommended`` is the preset picked for it: (name, why)."""
        info: dict
        recommended: tuple[str, str]

    @dataclass
    class TrainRequested(Message):
        """Open the new-run form on this preset (the one recommended for this machine)."""
        preset: str

    def __init__(self, info: dict | None = None, interval: float = 3.0, **kw: Any) -> None:
        """``info`` replaces live detection (tests and snapshots); ``interval`` in seconds."""
        super().__init__(**kw)
        self.injected = info
        self.interval = interval
        # picked once, from the first reading: it does not change while a GPU's load does
        self.recommended: tuple[str, str] | None = hwinfo.recommend(info) if info else None

    def compose(self) -> ComposeResult:
        yield Static("reading hardware…", id="hw-body")

    def on_mount(self) -> None:
        if self.injected is not None:
            self.query_one("#hw-body", Static).update(render_hardware(self.injected, self.recommended or ("?", "")))
            return
        self.read_hardware()
        self.set_interval(self.interval, self._read_if_shown)

    def tab_shown(self) -> None:
        self.read_hardware()

    def read_hardware(self) -> None:
        """Read the hardware again now (unless it was given)."""
        if self.injected is None:
            self._read()

    def _read_if_shown(self) -> None:
        if self.is_on_screen:
            self.read_hardware()

    @work(thread=True, exclusive=True, group="hardware", exit_on_error=False)
    def _read(self) -> None:
        info = hwinfo.detect()
        self.post_message(self.Read(info, self.recommended or hwinfo.recommend(info)))

    @on(Read)
    def _hardware_read(self, msg: Read) -> None:
        if self.recommended is None:
            self.recommended = msg.recommended
        self.query_one("#hw-body", Static).update(render_hardware(msg.info, self.recommended))

    def action_train(self) -> None:
        if self.recommended is None:
            self.notify("Still reading the hardware…", severity="warning")
            return
        self.post_message(self.TrainRequested(self.recommended[0]))

    def action_refresh(self) -> None:
        self.read_hardware()
