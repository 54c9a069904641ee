"""A corpus directory is read without its hidden files and hidden directories (README, Corpus): a
project checkout's .git, .env or .cache never reaches the tokenizer or the tokens. Through the CLI,
as a user points workbench at a folder."""

from __future__ import annotations

import json

from tests.support.cli import wb


def _write_project(root):
    visible = {
        "a.txt": "def visible_one():\n    return 1\n" * 40,
        "sub/b.md": "Visible two: a paragraph of prose.\n" * 40,
        "sub/deeper/c.py": "print('visible three')\n" * 40,
    }
    hidden = {
        ".env": "SECRET_TOKEN=hidden-file\n" * 40,
        ".git/objects/ab/cdef": "SECRET hidden directory\n" * 40,
        "sub/.cache/notes.txt": "SECRET nested hidden directory\n" * 40,
        "sub/deeper/.hidden.txt": "SECRET nested hidden file\n" * 40,
    }
    for rel, text in {**visible, **hidden}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return visible


def test_hidden_files_and_directories_are_not_read(tmp_path):
    corpus = tmp_path / "project"
    visible = _write_project(corpus)
    cache = {"WORKBENCH_CACHE_DIR": str(tmp_path / "cache")}
    shown = wb("data", "inspect", str(corpus), "-n", "10", env=cache, check=True).stdout
    assert "SECRET" not in shown
    assert shown.count("--- document ") == len(visible)
    for text in visible.values():
        assert text.splitlines()[0] in shown
    prepared = wb("data", "prepare", str(corpus), "--set", "model.vocab_size=300", "--json", env=cache,
                  check=True).stdout
    info = json.loads(prepared)
    assert info["documents"] == len(visible)
    assert info["bytes"] == sum(len(t.encode()) for t in visible.values())
