"""Data: from a user's files to the tokens a run trains on. No torch, no textual (the TUI may read it).

Text documents:

- ``sources``          listing what ``data.corpus`` names (files, directories, globs, ``builtin``), nothing read,
                       and opening a file's bytes (plain or compressed)
- ``record_reader``    the one reader of records (JSON lines, parquet): ``(where, record)``, and the wording
                       for a bad line, a JSON array, an unreadable or corrupt file
- ``documents``        a corpus and its documents (text, JSONL, parquet, built-in), streamed
- ``tokenizer``        the tokenizer interface: workbench's sentencepiece BPE and a Hugging Face tokenizer.json
- ``tokenizer_formats`` one tokenizer written in the other's format (for export)
- ``prepare``          preparing a corpus once: scan, tokenizer, cached and resumable encoding
- ``encode``           the parallel, resumable shard encoder (its process pool encodes the chat shards too) and
                       the join into ``tokens.bin``
- ``tokens``           the token store a run reads: the train/validation split and the window sampler
- ``train_data``       what the engine trains on, whatever its kind: the TrainData interface, its sampler, a Batch
- ``mixture``          a weighted mixture's plan: counts by apportionment, an order exact at every prefix, a
                       sampler whose state is a counter
- ``mixture_data``     a prepared mixture: each source a corpus prepared as today, drawn in the plan's order

Conversations:

- ``chat_templates``   chat templates rendered as transformers renders them, the built-in ChatML, the
                       characters each assistant turn contributes
- ``chat``             conversations read from chat records (OpenAI, ShareGPT, alpaca, prompt/completion), and
                       each encoded with its loss mask
- ``chat_prepare``     preparing a chat corpus once: rendered, encoded and labelled on every core, cached
- ``chat_data``        the prepared conversations packed into rows and drawn in resumable batches

Preference data:

- ``kinds``            the corpus kinds as messages name them and the objective each suggests (from the table of
                       objectives, ``workbench.config.objectives``; no reader loaded)
- ``preference_records`` preference records (prompt/chosen/rejected pairs, KTO's prompt/completion/label) read into
                       conversations
- ``preference_data``  the prepared pairs or labelled answers drawn in resumable batches (PairBatch, AnswerBatch)
- ``reference_table``  a precomputed reference: each answer's log-prob, kept with the prepared data, checked as
                       it is opened (digest, rows, inputs), memory-mapped

Eval tasks:

- ``tasks``            task files (multiple choice, exact match, chat) read into items
- ``builtin_tasks``    the built-in tasks, made from the built-in corpus's held-out documents

May import: rundir, config, fs, fmt, faults, errors (and numpy, sentencepiece, tokenizers, pyarrow, zstandard,
jinja2).
"""
