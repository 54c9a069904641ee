"""A run's course: where it ends, its learning rate at each step, its evals.

- ``horizon``     where a run ends, a wsd decay's start and the learning rate at each step; ``resume --more``'s note
- ``budget_plan`` what a time budget buys at a speed: its evals within their share, its steps, its warmup, and
  whether it buys a complete run (the estimate, ``train``'s first line, ``sweep`` and the trainer ask it)
- ``evals``       how many eval batches auto takes
"""
