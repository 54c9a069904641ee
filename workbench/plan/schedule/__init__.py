"""A run's course: where it ends, its learning rate at each step, its evals.

- ``horizon``     where a run ends, a wsd decay's start and the learning rate at each step; ``resume --more``'s note
- ``evals``       how many eval batches auto takes
"""
