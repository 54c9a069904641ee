"""Eval tasks: what ``workbench eval --task`` and ``train.eval_tasks`` name.

- ``task_files``       task files (multiple choice, exact match, chat) read into items
- ``builtin_tasks``    the built-in tasks, made from the built-in corpus's held-out documents
"""
