"""What the tests share, in one place (no test module imports from another):

- ``cli``      the real ``workbench`` CLI in a subprocess (``wb``), the tiny preset overrides (``TINY``, ``tiny``),
               the ~124 M GPU config (``G124``)
- ``runs``     reading a run back: records, losses and evals by step, waiting for a state, a tree snapshot
               (hashes, or the files' text)
- ``files``    zstd-compressed text (``zst_open``, an opener beside ``gzip.open``), the token file a preparation
               child names (``tokens_path``)
- ``load``     a busy neighbour: processes spinning on every CPU (``cpu_hog``)
- ``rundirs``  writing a run directory as the trainer would, through the typed records (no torch)
- ``oracles``  slow plain implementations the fast ones are checked against: generation without a KV cache
               (``generate_recomputed``), answers' log-probs from full logits (``answer_logps``)
- ``mixtures`` two small text corpora of different look for mixture tests (``write_two_corpora``)
- ``postgres`` a PostgreSQL server of the tests' own (``postgres_server``; the ``postgres`` fixture in conftest)
"""
