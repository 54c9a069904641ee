"""Preference data: which answer is better, read into conversations the chat wing prepares, drawn in pairs.

- ``preference_records`` preference records (prompt/chosen/rejected pairs, KTO's prompt/completion/label) read into
                       conversations
- ``preference_data``  the prepared pairs or labelled answers drawn in resumable batches (PairBatch, AnswerBatch)
- ``reference_table``  a precomputed reference: each answer's log-prob, kept with the prepared data, checked as
                       it is opened (digest, rows, inputs), memory-mapped
"""
