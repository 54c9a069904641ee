"""What a run starts from and what it optimises.

- ``finetune``       ``--init-from``: the fine-tune's preset, its link to the source weights, which method fits
- ``objective_plan`` a preference run's objective decided once from its row of the table (config.objectives): its
  beta, summed or averaged log-probs, its reference
"""
