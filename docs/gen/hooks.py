"""MkDocs hook (mkdocs.yml `hooks:`): adds the generated reference pages (docs/gen/reference.py) to the build, so
they are made from the code at every build and cannot go stale."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.structure.files import File

_spec = importlib.util.spec_from_file_location("workbench_docs_reference", Path(__file__).with_name("reference.py"))
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def on_files(files, config):
    for path, render in reference.PAGES.items():
        files.append(File.generated(config, path, content=render()))
    return files
