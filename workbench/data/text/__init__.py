"""Text into tokens: the tokenizer, a corpus prepared once, and the token store a run reads.

- ``tokenizer``        the tokenizer interface: workbench's sentencepiece BPE and a Hugging Face tokenizer.json
- ``tokenizer_formats`` one tokenizer written in the other's format (for export)
- ``prepare``          preparing a corpus once: scan, tokenizer, cached and resumable encoding
- ``encode``           the parallel, resumable shard encoder (its process pool encodes the chat shards too) and
                       the join into ``tokens.bin``
- ``tokens``           the token store a run reads: the train/validation split and the window sampler
"""
