"""Which knobs the suite sets, read from the tests' source (issue 54: every knob a user sets has a wiring test).

Lists (a) every preset schema key (section.key) and whether a test under tests/ sets it to a value: a
``section.key=`` in a string (a --set / resolve_preset list), a ``key = ...`` line under ``[section]`` in a TOML a
test writes (or a .toml fixture), the dataclass field passed by name (``TrainConfig(beta1=...)``,
``dataclasses.replace(p.train, beta1=...)``), an assignment ``p.train.beta1 = ...`` or ``d["train"]["beta1"] = ...``;
(b) every option of every subcommand (walking the argparse parsers ``workbench.cli`` builds) and whether a test
passes it beside its subcommand's name (in one call or list); (c) every TUI binding (BINDINGS under
workbench/tui) whose action writes something (a file, a run, a queue entry, a delete), and whether a test
function presses its key while on its pane or screen.

It reads source only (``ast``: a name in a comment or a docstring's prose does not count; a string does, so a
key named in a test's message string would: rare, and the table says where it found each). A "yes" says a test
sets the knob, not that it asserts its effect: that judgment is the tests'.

    .venv/bin/python bench/wiring_audit.py            # a table
    .venv/bin/python bench/wiring_audit.py --json     # the same as JSON
    .venv/bin/python bench/wiring_audit.py --missing  # only what no test sets
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TESTS = REPO / "tests"
TEST_ROOT = REPO   # what the table's paths are relative to
TUI = REPO / "workbench" / "tui"

# Bindings whose action writes something (a preset file, a run directory, a queue entry, a delete, a pick), by
# (class, action): the rest only move, show or open a form. Kept by hand: an action that posts a message is
# written by the app's handler, which the source alone does not tie to the key.
WRITES = {
    ("ImportModelScreen", "start"): "imports a model into a new run directory",
    ("NewRunScreen", "start"): "makes a run directory and starts its trainer",
    ("NewRunScreen", "add_to_queue"): "a queue entry (and its run directory)",
    ("RunJobsScreen", "start"): "eval / export output (report card, exported files)",
    ("PresetsPane", "save"): "the preset file",
    ("PresetsPane", "save_as"): "a new preset file",
    ("PresetsPane", "train"): "a run (through the new-run form)",
    ("PresetsPane", "queue"): "a queue entry (through the new-run form)",
    ("QueuePane", "add"): "a queue entry (through the new-run form)",
    ("QueuePane", "pause"): "the queue's paused flag",
    ("QueuePane", "run"): "starts the queue runner (runs)",
    ("QueuePane", "move(-1)"): "a queue entry's place",
    ("QueuePane", "move(1)"): "a queue entry's place",
    ("QueuePane", "remove"): "deletes a queue entry",
    ("QueuePane", "save_best"): "a preset file from the sweep's best trial",
    ("RunsPane", "resume('latest')"): "the run resumed (status, metrics)",
    ("RunsPane", "resume('chosen')"): "the run resumed from a chosen checkpoint",
    ("RunsPane", "more"): "the run extended (its horizon, status)",
    ("RunsPane", "delete"): "deletes a run or a checkpoint",
    ("MonitorPane", "stop"): "the run stopped (its last checkpoint, status)",
    ("MonitorPane", "resume"): "the run resumed",
    ("SamplePane", "prefer('a')"): "preferences.jsonl (A chosen)",
    ("SamplePane", "prefer('b')"): "preferences.jsonl (B chosen)",
    ("SamplePane", "rate(True)"): "preferences.jsonl (a good label)",
    ("SamplePane", "rate(False)"): "preferences.jsonl (a bad label)",
    ("SamplePane", "train_on_picks"): "a DPO run on the picks",
}

# What puts a test function on a class's pane or screen, besides the class's own name: the tab's key, its ids.
PANE_TAB = {"HardwarePane": ("1", "hardware"), "PresetsPane": ("2", "presets"), "MonitorPane": ("3", "train"),
            "CurvesPane": ("4", "curves"), "SamplePane": ("5", "sample"), "RunsPane": ("6", "runs"),
            "QueuePane": ("7", "queue")}
HELPERS = {"NewRunScreen": ("new_run",),
           "RunJobsScreen": ("RunJobs",), "ImportModelScreen": ("ImportModel",)}


# ----------------------------------------------------------------------------- reading the tests

@dataclasses.dataclass
class TestFile:
    path: Path
    tree: ast.Module

    @property
    def rel(self) -> str:
        return str(self.path.relative_to(TEST_ROOT))


def set_tests(path: Path) -> None:
    """Read the tests under ``path`` (paths in the table stay relative to its parent, as tests/...)."""
    global TESTS, TEST_ROOT
    TESTS, TEST_ROOT = path.resolve(), path.resolve().parent


def test_files() -> list[TestFile]:
    out = []
    for p in sorted(TESTS.rglob("*.py")):
        try:
            out.append(TestFile(p, ast.parse(p.read_text(), str(p))))
        except SyntaxError as e:  # a file another developer is half-way through: say so, go on
            print(f"wiring_audit: skipped {p} ({e})", file=sys.stderr)
    return out


def strings(node: ast.AST) -> list[str]:
    """Every string literal under ``node`` (an f-string's literal parts too), docstrings left out."""
    doc_ids = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                doc_ids.add(id(first.value))
    return [n.value for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in doc_ids]


def callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def attr_chain(node: ast.AST) -> list[str]:
    """``p.train.beta1`` -> [p, train, beta1]; ``d["train"]["beta1"]`` -> [d, train, beta1]."""
    out: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            out.append(node.slice.value)
            node = node.value
        else:
            out.append(node.id if isinstance(node, ast.Name) else "?")
            return out[::-1]


# ----------------------------------------------------------------------------- (a) schema keys

def schema_keys() -> dict[str, list[str]]:
    from workbench.config.schema import SECTIONS
    return {sec: [f.name for f in dataclasses.fields(cls)] for sec, cls in SECTIONS.items()}


def toml_keys(text: str) -> set[tuple[str, str]]:
    """(section, key) set by a TOML text: parsed when it parses, else read line by line (an f-string's parts)."""
    out = set()
    try:
        data = tomllib.loads(text)
        for sec, body in data.items():
            if isinstance(body, dict):
                out |= {(sec, k) for k in body}
        return out
    except tomllib.TOMLDecodeError:
        pass
    sec = None
    for line in text.splitlines():
        if m := re.match(r"\s*\[([\w.]+)\]\s*$", line):
            sec = m.group(1)
        elif sec and (m := re.match(r"\s*(\w+)\s*=", line)):
            out.add((sec, m.group(1)))
    return out


def audit_keys(files: list[TestFile]) -> list[dict]:
    keys = schema_keys()
    where: dict[tuple[str, str], set[str]] = defaultdict(set)
    by_name = defaultdict(list)
    for sec, names in keys.items():
        for k in names:
            by_name[k].append(sec)
    cls_sec = {"ModelConfig": "model", "TrainConfig": "train", "DataConfig": "data", "HardwareConfig": "hardware"}
    set_re = re.compile(r"(?<![\w.])(model|train|data|hardware)\.(\w+)\s*=")
    for tf in files:
        for s in strings(tf.tree):
            for m in set_re.finditer(s):
                where[(m.group(1), m.group(2))].add(f"{tf.rel} (--set)")
            if "[" in s and "=" in s:
                for sk in toml_keys(s):
                    where[sk].add(f"{tf.rel} (toml)")
        for n in ast.walk(tf.tree):
            if isinstance(n, ast.Call):
                c = callee(n)
                secs = [cls_sec[c]] if c in cls_sec else None
                if c == "replace" and n.args:
                    ch = attr_chain(n.args[0])
                    secs = [ch[-1]] if ch[-1] in keys else list(keys)
                if secs:
                    for kw in n.keywords:
                        for sec in secs:
                            if kw.arg in keys[sec]:
                                where[(sec, kw.arg)].add(f"{tf.rel} (field)")
            elif isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    ch = attr_chain(t)
                    if len(ch) >= 3 and ch[-2] in keys and ch[-1] in keys[ch[-2]]:
                        where[(ch[-2], ch[-1])].add(f"{tf.rel} (assign)")
            elif isinstance(n, ast.Dict):  # {"train": {"beta1": ...}} (a preset dict a test writes)
                for k, v in zip(n.keys, n.values):
                    if isinstance(k, ast.Constant) and k.value in keys and isinstance(v, ast.Dict):
                        for kk in v.keys:
                            if isinstance(kk, ast.Constant) and kk.value in keys[k.value]:
                                where[(k.value, kk.value)].add(f"{tf.rel} (dict)")
    for p in sorted(TESTS.rglob("*.toml")):
        for sk in toml_keys(p.read_text()):
            where[sk].add(f"{p.relative_to(TEST_ROOT)} (fixture)")
    return [{"key": f"{sec}.{k}", "set": bool(where.get((sec, k))), "where": sorted(where.get((sec, k), ()))}
            for sec, names in keys.items() for k in names]


# ----------------------------------------------------------------------------- (b) CLI flags

def cli_flags() -> list[tuple[tuple[str, ...], list[str]]]:
    """(subcommand path, option strings) for every option of every subcommand (help and --runs-dir left out)."""
    from workbench.cli import build_parser
    out = []
    todo = [((), build_parser())]
    while todo:
        path, p = todo.pop(0)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                seen = set()
                for name, sp in a.choices.items():
                    if id(sp) not in seen:  # aliases share a parser
                        seen.add(id(sp))
                        todo.append(((*path, name), sp))
            elif a.option_strings and path and not isinstance(a, argparse._HelpAction) \
                    and "--runs-dir" not in a.option_strings:
                out.append((path, list(a.option_strings)))
    return out


def arg_groups(files: list[TestFile]) -> list[tuple[str, list[str]]]:
    """The string arguments of every call and list in the tests, in order (a shell line split into its words):
    where a subcommand's name and its flags stand together. A call to a helper function the tests define (one
    that runs ``chat RUN ...`` with the caller's flags) counts the strings of the helper's body as its own."""
    helpers = {fn.name: strings(fn) for tf in files for fn in ast.walk(tf.tree)
               if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("test")}
    # a class the tests call as a helper (tests/tui/test_serve.py: ``Served(tmp, "--host", ...)``): its __init__
    helpers |= {cls.name: strings(init) for tf in files for cls in ast.walk(tf.tree) if isinstance(cls, ast.ClassDef)
                for init in cls.body if isinstance(init, ast.FunctionDef) and init.name == "__init__"}
    out = []
    for tf in files:
        # a list spliced in (``*extra``, ``*tiny(...)``): its words, from the lists the file assigns to that name
        lists: dict[str, list[str]] = defaultdict(list)
        for n in ast.walk(tf.tree):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                lists[n.targets[0].id] += [c for c in strings(n.value)]

        def words_of(elts: list[ast.expr]) -> list[str]:
            words: list[str] = []
            for e in elts:
                if isinstance(e, ast.Constant) and isinstance(e.value, str):
                    words += e.value.split() if " " in e.value.strip() else [e.value]
                elif isinstance(e, ast.JoinedStr):
                    words += " ".join(v.value for v in e.values if isinstance(v, ast.Constant)).split()
                elif isinstance(e, ast.Starred) and isinstance(e.value, ast.Name):
                    words += lists.get(e.value.id, [])
                elif isinstance(e, ast.Starred) and isinstance(e.value, ast.Call) and callee(e.value) == "tiny":
                    words += ["--set", *strings(e.value)]   # tests.support.cli.tiny: --set TINY ...
            return words

        for n in ast.walk(tf.tree):
            elts = n.args if isinstance(n, ast.Call) else n.elts if isinstance(n, (ast.List, ast.Tuple)) else None
            if elts and (words := words_of(elts)):
                if isinstance(n, ast.Call) and callee(n) in helpers:   # a test's helper that names the command
                    words = helpers[callee(n)] + words
                out.append((tf.rel, words))
        for s in strings(tf.tree):  # a shell line in one string (the tmux tests)
            if s.count(" ") >= 2 and " --" in s:
                out.append((tf.rel, s.split()))
    return out


def passes(words: list[str], path: tuple[str, ...], opts: list[str]) -> bool:
    # a top-level command word may stand in a different position from its action (`queue ... add`): in order
    i = 0
    for w in words:
        if i < len(path) and w == path[i]:
            i += 1
    if i < len(path):
        return False
    return any(w == o or w.startswith(o + "=") for w in words for o in opts)


def audit_flags(files: list[TestFile]) -> list[dict]:
    groups = arg_groups(files)
    rows = []
    for path, opts in cli_flags():
        hits = sorted({f for f, words in groups if passes(words, path, opts)})
        rows.append({"command": " ".join(path), "flag": "/".join(opts), "passed": bool(hits), "where": hits})
    return rows


# ----------------------------------------------------------------------------- (c) TUI bindings

def bindings() -> list[dict]:
    out = []
    for p in sorted(TUI.rglob("*.py")):
        tree = ast.parse(p.read_text())
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for st in cls.body:
                if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "BINDINGS"
                                                      for t in st.targets) and isinstance(st.value, ast.List):
                    for b in st.value.elts:
                        if isinstance(b, ast.Call) and len(b.args) >= 2:
                            keys, action = (a.value for a in b.args[:2])
                            out.append({"class": cls.name, "keys": keys.split(","), "action": action,
                                        "file": str(p.relative_to(REPO))})
    return out


TAB_KEYS = {digit: name for digit, name in PANE_TAB.values()}
TAB_HELPERS = {"open_preset": "presets", "open_sample_on": "sample"}


def presses(files: list[TestFile]) -> list[tuple[str, list[tuple[str, str | None]], set[str]]]:
    """For each test function: the keys it presses, each with the tab shown then (the last tab key pressed, tab
    helper called or ``action_show_tab`` before it, else the app's ``initial_tab``; None when the function never
    says), and the words that place it on a screen (names, attributes, strings)."""
    out = []
    for tf in files:
        if not tf.rel.startswith("tests/tui/"):
            continue
        for fn in (n for n in ast.walk(tf.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and n.name.startswith("test")):
            events: list[tuple[tuple[int, int], str, str]] = []   # (where, "press" | "tab", value)
            words: set[str] = set()
            # ``for key in ("f6", "f5"): ... press(key)``: the keys a loop variable takes
            looped = {n.target.id: [e.value for e in n.iter.elts] for n in ast.walk(fn)
                      if isinstance(n, ast.For) and isinstance(n.target, ast.Name)
                      and isinstance(n.iter, (ast.Tuple, ast.List)) and n.iter.elts
                      and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.iter.elts)}
            for n in ast.walk(fn):
                if isinstance(n, ast.Call):
                    where = (n.lineno, n.col_offset)
                    c = callee(n)
                    if c == "press":
                        for a in n.args:
                            ks = [a.value] if isinstance(a, ast.Constant) and isinstance(a.value, str) else \
                                list(a.value.value) if isinstance(a, ast.Starred) \
                                and isinstance(a.value, ast.Constant) \
                                else looped.get(a.id, []) if isinstance(a, ast.Name) else []
                            for k in ks:
                                events.append((where, "press", k))
                                if k in TAB_KEYS:
                                    events.append(((where[0], where[1] + 1), "tab", TAB_KEYS[k]))
                    elif c in TAB_HELPERS:
                        events.append((where, "tab", TAB_HELPERS[c]))
                    elif c in ("action_show_tab", "show_tab") and n.args and isinstance(n.args[0], ast.Constant):
                        events.append((where, "tab", n.args[0].value))
                    for kw in n.keywords:
                        if kw.arg == "initial_tab" and isinstance(kw.value, ast.Constant):
                            events.append(((0, 0), "tab", kw.value.value))
                elif isinstance(n, ast.Name):
                    words.add(n.id)
                elif isinstance(n, ast.Attribute):
                    words.add(n.attr)
            words |= set(strings(fn))
            tab, keys = None, []
            for _, kind, value in sorted(events):
                if kind == "tab":
                    tab = value
                else:
                    keys.append((value, tab))
            if keys:
                out.append((f"{tf.rel}::{fn.name}", keys, words))
    return out


def on_class(cls: str, key: str, tab: str | None, words: set[str]) -> bool:
    """Whether pressing ``key`` with ``tab`` shown reaches ``cls``: a pane when its tab is shown (or, in a test
    that never names a tab, when the test names the pane); a screen when the test names it."""
    if cls in PANE_TAB:
        name = PANE_TAB[cls][1]
        if tab is not None:
            return tab == name
        return cls in words or f"{name}_pane" in words or any(f"{name}-pane" in w for w in words)
    return cls in words or any(h in w for h in HELPERS.get(cls, ()) for w in words)


def audit_bindings(files: list[TestFile]) -> list[dict]:
    tests = presses(files)
    rows = []
    for b in bindings():
        what = WRITES.get((b["class"], b["action"]))
        if what is None:
            continue
        hits = sorted({t for t, keys, words in tests for k, tab in keys
                       if k in b["keys"] and on_class(b["class"], k, tab, words)})
        rows.append({"class": b["class"], "key": ",".join(b["keys"]), "action": b["action"], "writes": what,
                     "pressed": bool(hits), "where": hits})
    return rows


# ----------------------------------------------------------------------------- output

def table(title: str, rows: list[dict], cols: list[str], ok: str, missing_only: bool) -> str:
    shown = [r for r in rows if not (missing_only and r[ok])]
    lines = [f"{title}: {sum(r[ok] for r in rows)} of {len(rows)} set by a test"]
    widths = [max([len(c)] + [len(str(r[c])) for r in shown]) for c in cols]
    lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths)) + f"  {ok:<6}  where")
    for r in shown:
        where = ", ".join(r["where"][:2]) + (f" (+{len(r['where']) - 2})" if len(r["where"]) > 2 else "")
        lines.append("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths))
                     + f"  {'yes' if r[ok] else 'NO':<6}  {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--missing", action="store_true", help="only the knobs no test sets")
    ap.add_argument("--tests", type=Path, default=TESTS,
                    help="the tests directory to read (default: this checkout's; e.g. an older commit's, from "
                         "`git archive COMMIT tests | tar -x -C DIR`, for a before/after)")
    args = ap.parse_args(argv)
    set_tests(args.tests)
    files = test_files()
    out = {"keys": audit_keys(files), "flags": audit_flags(files), "bindings": audit_bindings(files)}
    if args.json:
        if args.missing:
            out = {"keys": [r for r in out["keys"] if not r["set"]],
                   "flags": [r for r in out["flags"] if not r["passed"]],
                   "bindings": [r for r in out["bindings"] if not r["pressed"]]}
        print(json.dumps(out, indent=1))
        return 0
    print(table("schema keys", out["keys"], ["key"], "set", args.missing))
    print()
    print(table("CLI flags", out["flags"], ["command", "flag"], "passed", args.missing))
    print()
    print(table("TUI bindings that write", out["bindings"], ["class", "key", "action"], "pressed", args.missing))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
