"""The kinds of corpus a run trains on and which objective trains on which: names only, importing nothing, so
the planner (and the TUI's first frame, through it) can ask without loading the readers, the tokenizer or numpy.
The readers are :mod:`workbench.data.preference` and :mod:`workbench.data.chat`."""

from __future__ import annotations

PAIRS, KTO = "pairs", "kto"
KINDS = (PAIRS, KTO)
# What each objective trains on, and which objective trains on a corpus of each kind.
PAIRED = {"dpo": True, "simpo": True, "orpo": True, "kto": False}
DATA_KIND = {"dpo": PAIRS, "simpo": PAIRS, "orpo": PAIRS, "kto": KTO}
OBJECTIVE_FOR = {PAIRS: "dpo", KTO: "kto"}
DESCRIBE = {"text": "text", "chat": "conversations", PAIRS: "preference pairs (prompt, chosen, rejected)",
            KTO: "labelled answers (prompt, completion, label)"}
