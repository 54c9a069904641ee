"""A corpus: what ``data.corpus`` names, and reading it, under every wing (text, chat, preference, tasks, prompts).

- ``sources``          listing what ``data.corpus`` names (files, directories, globs, ``builtin``), nothing read,
                       and opening a file's bytes (plain or compressed)
- ``record_reader``    the one reader of records (JSON lines, parquet): ``(where, record)``, and the wording
                       for a bad line, a JSON array, an unreadable or corrupt file
- ``documents``        a corpus and its documents (text, JSONL, parquet, built-in), streamed
- ``kinds``            the corpus kinds as messages name them and the objective each suggests (from the table of
                       objectives, ``workbench.config.objectives``; no reader loaded)
"""
