"""Data: from a user's files to the tokens a run trains on. No torch, no textual (the TUI may read it).

The interface and the entry point at the top; then a folder per wing, the shared ones first (corpus, text), each a
map of its own:

- ``train_data``       what the engine trains on, whatever its kind: the TrainData interface, its sampler, a Batch;
                       nothing above asks which kind it is
- ``preset_data``      the entry point: ``prepare_data``, a preset's data prepared as the kind it is (text,
                       conversations, preference records, a mixture), and the checks a start makes before it
- ``corpus/``          what ``data.corpus`` names and the one reader of records under every wing: the files
                       (``sources``), JSON lines and parquet (``record_reader``), documents (``documents``), the
                       corpus kinds and the objective each suggests (``kinds``)
- ``text/``            text into tokens: the tokenizer (``tokenizer``, ``tokenizer_formats``), a corpus prepared once
                       (``prepare``, ``encode``: the shard encoder every wing's preparation uses), the token store a
                       run reads (``tokens``)
- ``chat/``            conversations: templates (``chat_templates``), records read and encoded with their loss mask
                       (``conversations``), prepared once (``chat_prepare``), packed and drawn (``chat_data``)
- ``preference/``      preference records (pairs, KTO's labelled answers) read (``preference_records``) and drawn
                       (``preference_data``); a precomputed reference's log-probs (``reference_table``)
- ``tasks/``           eval tasks: task files read into items (``task_files``), the built-in ones (``builtin_tasks``)
- ``mixture/``         weighted mixtures: the plan, pure (``mixture_plan``), and the prepared mixture drawn in its
                       order (``mixture_data``)

The folders' ``__init__`` modules import nothing: ``workbench.data.corpus.kinds`` loads no reader, tokenizer or numpy.

May import: rundir, config, fs, fmt, faults, errors (and numpy, sentencepiece, tokenizers, pyarrow, zstandard,
jinja2).
"""
