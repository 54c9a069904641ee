"""Data: from a user's files to the tokens a run trains on. No torch, no textual (the TUI may read it).

- ``listing``          listing what ``data.corpus`` names (files, directories, globs, ``builtin``), nothing read,
                       and opening a file's bytes (plain or compressed)
- ``documents``        a corpus and every reader of its documents (text, JSONL, parquet, built-in), streamed
- ``tokenizer``        the tokenizer interface: workbench's sentencepiece BPE and a Hugging Face tokenizer.json
- ``tokenizer_formats`` one tokenizer written in the other's format (for export)
- ``prepare``          preparing a corpus once: scan, tokenizer, cached and resumable encoding
- ``encode``           the parallel, resumable shard encoder and the join into ``tokens.bin``
- ``tokens``           the token store a run reads: the train/validation split and the window sampler

May import: config, fs, fmt, faults, errors (and numpy, sentencepiece, tokenizers, pyarrow, zstandard).
"""
