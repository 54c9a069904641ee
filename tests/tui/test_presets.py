"""Saving a preset under a new name: the name key is set in the user's own text."""

from __future__ import annotations

import tomllib

from workbench.tui.widgets.presets import with_name

PRESET = '''# my small preset
# (tuned on the laptop)
description = """A preset.
name = "not this one"
"""
name = "cpu-small"   # the shipped one's name

[model]
dim = 64  # small

[data]
corpus = 'C:\\corpora'
'''


def test_the_name_line_is_replaced_and_everything_else_kept():
    out = with_name(PRESET, "my-small")
    assert out.splitlines()[5] == 'name = "my-small"'
    assert tomllib.loads(out) == dict(tomllib.loads(PRESET), name="my-small")
    # comments, the layout and the multi-line description stay as the user wrote them
    assert out.replace('name = "my-small"', 'name = "cpu-small"   # the shipped one\'s name') == PRESET


def test_a_preset_without_a_name_gets_one_before_its_tables():
    text = "[model]\ndim = 64\n"
    out = with_name(text, "x")
    assert out == 'name = "x"\n' + text
    assert tomllib.loads(out) == {"name": "x", "model": {"dim": 64}}


def test_a_name_in_a_table_is_not_the_preset_name():
    text = 'description = "d"\n[model]\nname = "inner"\n'
    out = with_name(text, "x")
    assert tomllib.loads(out) == {"name": "x", "description": "d", "model": {"name": "inner"}}


def test_names_that_need_escaping_are_written_as_toml_strings():
    out = with_name('name = "a"\n', 'we\\ird "one"')
    assert tomllib.loads(out)["name"] == 'we\\ird "one"'


def test_a_name_no_line_edit_can_set_is_written_from_the_data():
    text = 'name = """\nmulti"""\n[model]\ndim = 64\n'  # the name spans two lines
    out = with_name(text, "x")
    assert tomllib.loads(out) == {"name": "x", "model": {"dim": 64}}
