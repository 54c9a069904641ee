"""The documentation: the site in docs/ builds with MkDocs with warnings as errors (a broken link or anchor fails it),
its generated reference pages follow the code (the schema's keys, the CLI's commands), and the README stays a front
page whose test command is the one CI runs. One strict build is shared by the module, one more is broken on purpose:
~1-2 s each on a 2-core machine, the module 3-5 s in all."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` in a subprocess, as a user or CI would run it; it needs no network (no web fonts,
    no plugin that fetches)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, env=env, timeout=120)


def reference_module():
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "gen" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    cp = mkdocs_build(REPO / "mkdocs.yml", out)
    assert cp.returncode == 0, cp.stderr
    assert "WARNING" not in cp.stderr, cp.stderr
    return out


def test_the_site_builds_strict_with_every_page_in_the_nav(site):
    pages = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md")
             if "gen" not in p.relative_to(DOCS).parts}
    for page in pages:
        html = site / f"{page}.html"   # use_directory_urls: false, so the site navigates opened from disk
        assert html.exists(), page
    # opened from disk (file://), a link must name a file: the front page links getting-started.html, not a folder
    assert 'href="getting-started.html"' in (site / "index.html").read_text(encoding="utf-8")
    # every picture of the app (docs/gen/screenshots.py) is on a page
    shown = "".join(p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md"))
    assert [p.name for p in (DOCS / "images").glob("*.svg") if f"images/{p.name}" not in shown] == []
    # offline: nothing on a page is fetched from elsewhere (fonts, scripts, styles)
    fetched = [p for p in site.rglob("*.html")
               if re.search(r'<(?:link|script)[^>]+(?:href|src)="https?://', p.read_text(encoding="utf-8"))]
    assert fetched == []


def test_the_preset_keys_page_lists_every_schema_key_with_its_doc(site):
    from workbench.config.schema import SECTIONS
    html = (site / "reference" / "preset-keys.html").read_text(encoding="utf-8")
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f"<code>{section}.{f.name}</code>" in html, f"{section}.{f.name}"
    assert "Tokenizer vocabulary size (sentencepiece BPE trained on the corpus)." in html


def test_a_key_added_to_the_schema_shows_up_on_the_generated_page(monkeypatch):
    from workbench.config import schema
    extra = dataclasses.make_dataclass(
        "TrainWithExtra", [("new_knob", int, schema._f(7, "A knob added after the docs were written.", min=1))],
        bases=(schema.TrainConfig,))
    monkeypatch.setitem(schema.SECTIONS, "train", extra)
    page = reference_module().preset_keys_page()
    row = next(line for line in page.splitlines() if line.startswith("| `train.new_knob` |"))
    assert row == "| `train.new_knob` | `7` | ≥ 1 | A knob added after the docs were written. |"


def test_the_cli_options_page_has_every_command_and_option(site):
    from workbench.cli import build_parser
    html = (site / "reference" / "cli-options.html").read_text(encoding="utf-8")
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        assert f"<h2 id=\"workbench-{name.replace('_', '')}" in html or f">workbench {name}<" in html, name
        for action in p._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert flag in html, (name, flag)
    assert "workbench queue add" in html and "workbench sweep" in html


def test_a_broken_link_fails_the_build(tmp_path):
    """The same site with one link to a section that does not exist: the strict build refuses it and names it."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    (tmp_path / "workbench").symlink_to(REPO / "workbench")  # the hook generates from this tree's code
    page = tmp_path / "docs" / "recipes" / "sweep.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the queue](../reference/queues-and-sweeps.md#no-such)."
                    "\n", encoding="utf-8")
    cp = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert cp.returncode != 0
    said = cp.stdout + cp.stderr
    assert "does not contain an anchor '#no-such'" in said and "Aborted with 1 warnings in strict mode" in said, said


README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_front_page_whose_test_command_is_the_one_ci_runs():
    assert len(README.splitlines()) <= 250
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-2] == "# The README's test command, verbatim:"
    assert ci[-1] in README.splitlines()
    # the CPU-only install comes before the line it stands in for, and pastes as it is (one line, no placeholder)
    lines = README.splitlines()
    cpu = next(i for i, ln in enumerate(lines) if "download.pytorch.org/whl/cpu" in ln)
    gpu = next(i for i, ln in enumerate(lines) if ln == "python3 -m venv .venv && .venv/bin/pip install -e . && "
               ".venv/bin/workbench")
    assert cpu < gpu and lines[cpu].startswith("python3 -m venv .venv && ")


def test_the_readmes_links_reach_files_in_the_repository():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    assert targets
    assert [t for t in targets if not t.startswith("http") and not (REPO / t).exists()] == []


def _commands(text: str) -> list[str]:
    """The `workbench ...` command lines in a page's code (fenced or indented blocks), continuation lines joined."""
    commands, fence, line = [], False, ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("```"):
            fence = not fence
            continue
        if not (fence or raw.startswith("    ")):
            continue
        s = raw.strip()
        if line:
            line += " " + s
        elif re.match(r"(\.venv/bin/)?workbench( |$)", s) and not re.match(r"workbench( \S+)?: ", s):  # not output
            line = s
        else:
            continue
        if line.endswith("\\"):
            line = line[:-1]
            continue
        commands.append(line)
        line = ""
    return commands


def test_every_workbench_command_in_the_docs_parses():
    """Each example command on the front page and in the docs is one the CLI accepts (its parser: nothing runs), so
    a renamed flag or command fails here, not in a reader's terminal. `[--json]`-style optional parts are left out."""
    from workbench.cli import build_parser
    parser = build_parser()
    pages = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    refused, seen = [], 0
    for page in pages:
        for command in _commands(page.read_text(encoding="utf-8")):
            argv = [a for a in shlex.split(command, comments=True)[1:] if not re.fullmatch(r"\[.*\]", a)]
            seen += 1
            try:
                with contextlib.redirect_stderr(io.StringIO()) as said:
                    parser.parse_args(argv)
            except SystemExit:
                refused.append(f"{page.relative_to(REPO)}: {command}: {said.getvalue().strip().splitlines()[-1]}")
    assert seen > 50 and refused == []


def test_every_finding_the_doctor_makes_is_in_the_doctors_table():
    """Each code a `Finding(kind, code, ...)` in workbench/analysis/doctor/ can carry is a row of the findings table on
    docs/reference/doctor.md, so a new finding without its documentation fails here."""
    import ast
    codes = set()
    for source in (REPO / "workbench" / "analysis" / "doctor").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" and len(node.args) > 1:
                codes |= {c.value for c in ast.walk(node.args[1]) if isinstance(c, ast.Constant)}
    assert len(codes) > 30
    table = [ln for ln in (DOCS / "reference" / "doctor.md").read_text(encoding="utf-8").splitlines()
             if ln.startswith("| ")]
    assert sorted(c for c in codes if not any(f"`{c}`" in row.split("|")[2] for row in table)) == []
