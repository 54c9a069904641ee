"""The package's layers are enforced: import-linter's contracts hold (and break when violated), ruff passes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    exe = BIN / name
    if not exe.exists():
        pytest.fail(f"{name} is not installed in this environment; `pip install -e '.[dev]'` installs it")
    return str(exe)


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))  # the tree in cwd, not the installed package
    return subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_import_contracts_hold():
    r = _lint_imports(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("module,line,contract", [
    ("plan/fit/memory.py", "import workbench.commands.fit", "Layers"),          # planning importing the CLI
    ("rundir/__init__.py", "import workbench.config", "Layers"),                  # the contract importing presets
    ("tui/display.py", "import workbench.plan.settings, torch", "TUI never imports torch"),
    ("tui/display.py", "import workbench.train.model", "TUI never imports torch"),
    ("train/model.py", "import textual.app", "engine and interop never import textual"),
    ("plan/settings.py", "import torch", "no torch, no textual"),
    ("data/corpus/documents.py", "import torch", "Data: no torch, no textual"),       # the corpus pipeline
    ("data/text/tokens.py", "import workbench.train.model", "Layers"),             # data importing the engine
    ("analysis/doctor/speed.py", "import torch", "no torch, no textual"),          # reading past runs
    ("plan/report.py", "import workbench.analysis.history", "Layers"),            # planning reading past runs
    ("train/loop.py", "import workbench.interop.export", "Layers"),               # the engine importing interop
    ("interop/export.py", "import textual.app", "interop never import textual"),
    ("tui/display.py", "import workbench.interop.hf_layout", "TUI never imports torch"),
    ("queue/runner.py", "import torch", "no torch, no textual"),                  # the queue's runner stays light
    ("queue/launch.py", "import workbench.commands.launch", "Layers"),            # trials start through the CLI
    ("queue/store.py", "import workbench.train.loop", "Layers"),                  # the queue beside the engine
])
def test_a_violation_breaks_a_contract(tmp_path, module, line, contract):
    """A deliberate wrong-way import in a copy of the package makes lint-imports fail, naming the contract."""
    shutil.copytree(ROOT / "workbench", tmp_path / "workbench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "workbench" / module
    target.write_text(target.read_text() + f"\n{line}  # deliberate violation\n")
    r = _lint_imports(tmp_path)
    assert r.returncode != 0, r.stdout[-3000:]
    broken = [ln for ln in r.stdout.splitlines() if ln.rstrip().endswith("BROKEN")]
    assert any(contract in ln for ln in broken), r.stdout[-3000:]


def test_ruff_passes():
    r = subprocess.run([_tool("ruff"), "check", "workbench", "tests", "bench"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def _mypy(cwd: Path) -> subprocess.CompletedProcess:
    """mypy as pyproject.toml configures it ([tool.mypy]: the torch-free packages), on the tree in ``cwd``."""
    return subprocess.run([_tool("mypy"), "--cache-dir", str(cwd / ".mypy_cache")], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


# The packages mypy leaves out, each for the torch it imports (pyproject.toml's [tool.mypy] checks all the others,
# and the CLI's entry points; it does not read these two: what the commands import from them lazily is Any)
NOT_TYPE_CHECKED = {
    "train": "the engine",
    "interop": "the model's import (hf_import) and export (gguf_export, export: the checkpoint's loader)",
}


def test_types_check_in_the_torch_free_packages():
    """Every package but the engine and interop (and what they import: fs, fmt, errors, faults, cli_client)
    type-checks clean: config, rundir, plan, data, analysis, reward, machine (its probe too, torch not read), the
    queue, the TUI, and the CLI (cli.py, __main__.py and the commands, which load a model through the engine
    lazily)."""
    r = _mypy(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_mypy_checks_every_package_without_torch():
    """A package is type-checked from its first commit: [tool.mypy]'s files are every package of workbench but
    those left out above, and each of those does import torch (a package that no longer does is checked too)."""
    import re
    import tomllib
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    files = mypy["files"]
    packages = {d.name for d in (ROOT / "workbench").iterdir() if (d / "__init__.py").is_file()}
    assert sorted(Path(f).name for f in files if not f.endswith(".py")) == sorted(packages - set(NOT_TYPE_CHECKED))
    assert sorted(f for f in files if f.endswith(".py")) == ["workbench/__main__.py", "workbench/cli.py"]
    skipped = {m for o in mypy["overrides"] if o.get("follow_imports") == "skip" for m in o["module"]}
    assert {f"workbench.{pkg}" for pkg in NOT_TYPE_CHECKED} <= skipped  # not read through the commands' imports
    imports_torch = {pkg for pkg in NOT_TYPE_CHECKED  # at the top of a module, or inside a function
                     if any(re.search(r"^\s*(import|from) torch\b", f.read_text(), re.M)
                            for f in (ROOT / "workbench" / pkg).rglob("*.py"))}
    assert imports_torch == set(NOT_TYPE_CHECKED)


def test_a_type_error_breaks_the_type_check(tmp_path):
    """A deliberate type error in a copy of the package makes mypy fail, naming the line."""
    shutil.copytree(ROOT / "workbench", tmp_path / "workbench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    if (ROOT / ".mypy_cache").is_dir():  # the check of the tree's own cache: mypy rechecks what the error changed
        shutil.copytree(ROOT / ".mypy_cache", tmp_path / ".mypy_cache")   # (13 CPU seconds cold, 1 s so)
    target = tmp_path / "workbench" / "rundir" / "names.py"
    n = len(target.read_text().splitlines()) + 1
    target.write_text(target.read_text() + 'LOCK_TIMEOUT: int = "10 s"  # deliberate error\n')
    r = _mypy(tmp_path)
    assert r.returncode != 0 and f"workbench/rundir/names.py:{n}: error: Incompatible types" in r.stdout, r.stdout


def test_tests_share_helpers_only_through_tests_support():
    """No test module imports from another test module or a conftest: what tests share is in tests/support."""
    import ast
    wrong = []
    for f in sorted((ROOT / "tests").rglob("*.py")):
        if "support" in f.relative_to(ROOT / "tests").parts:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = "." * node.level + (node.module or "")
                if mod.startswith(".") or (mod.startswith("tests") and not mod.startswith("tests.support")):
                    wrong.append(f"{f.relative_to(ROOT)}: from {mod} import ...")
    assert wrong == []


def _modules(pkg: Path) -> list[str]:
    """A package's modules and subpackages, by name."""
    return sorted([p.stem for p in pkg.glob("*.py") if p.name != "__init__.py"]
                  + [d.name for d in pkg.iterdir() if (d / "__init__.py").is_file()])


def test_each_package_docstring_names_every_module_of_the_package():
    """A package's ``__init__`` is its map: a newcomer finds every module there, as ``name`` (or ``name.py``,
    ``name/``), with what it owns."""
    import ast
    import re
    missing = []
    for init in sorted((ROOT / "workbench").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        missing += [f"{init.parent.relative_to(ROOT)}: {m}" for m in _modules(init.parent)
                    if not re.search(rf"``{re.escape(m)}(\.py|/)?``", doc)]
    assert missing == []


def test_the_readme_module_table_names_every_module():
    """The docs' Architecture table (docs/architecture.md, once the README's) names each module: by its path
    (`data/corpus/record_reader.py`), or by its name in the row
    of its package (`config/` ... (`duration.py`))."""
    section = (ROOT / "docs" / "architecture.md").read_text()  # the README's section, moved into the docs
    rows = ["|".join(cells) for cells in (ln.split("|") for ln in section.splitlines() if ln.startswith("| "))
            if len(cells) > 3]
    missing = []
    for f in sorted((ROOT / "workbench").rglob("*.py")):
        rel = f.relative_to(ROOT / "workbench")
        if f.name == "__init__.py" or f"`{rel.as_posix()}`" in section:
            continue
        pkg = f"`{rel.parent.as_posix()}/`" if rel.parent.parts else f"`{f.name}`"
        if not any(pkg in row.split("|")[2] and (f"`{f.name}`" in row or f"`{f.stem}`" in row) for row in rows):
            missing.append(rel.as_posix())
    assert missing == []


def test_every_package_is_installed():
    """A non-editable install ships exactly the packages in pyproject's [tool.setuptools] list: every folder of
    workbench with an ``__init__.py`` (a subpackage too) is in it, so none is left out of a wheel."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "workbench").rglob("__init__.py")}
    assert sorted(packages - listed) == [] and sorted(listed - packages - {"workbench._presets"}) == []
