"""The TUI process must never import torch (not even through workbench.train)."""

import subprocess
import sys


def test_tui_does_not_import_torch():
    code = ("import sys, workbench.tui.app, workbench.tui.widgets.presets; "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'workbench.train'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"the TUI imported: {r.stdout} {r.stderr}"
