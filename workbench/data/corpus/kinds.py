"""The kinds of corpus a run trains on, as the data layer names them: which are preference records, how each is
described in a message, and which objective a corpus of each kind suggests. The kinds themselves and which objective
trains on which are the table of objectives' (:mod:`workbench.config.objectives`); this module asks it and loads no
reader, so the planner (and the TUI's first frame, through it) can ask without the readers, the tokenizer or numpy. The
readers are :mod:`workbench.data.preference.preference_records` and :mod:`workbench.data.chat.conversations`."""

from __future__ import annotations

from workbench.config.objectives import CHAT, KTO, PAIRS, PROMPTS, TEXT, objectives_on

# preference records: a file's first record says which (workbench.data.preference.preference_records)
KINDS = (PAIRS, KTO)
# The objective a corpus of each preference kind suggests: the table's first that trains on it.
OBJECTIVE_FOR = {kind: objectives_on(kind)[0] for kind in KINDS}
DESCRIBE = {TEXT: "text", CHAT: "conversations", PAIRS: "preference pairs (prompt, chosen, rejected)",
            KTO: "labelled answers (prompt, completion, label)", PROMPTS: "prompts (a reward scores their completions)"}

__all__ = ["DESCRIBE", "KINDS", "KTO", "OBJECTIVE_FOR", "PAIRS"]
