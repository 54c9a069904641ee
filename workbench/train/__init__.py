"""The training engine (torch): model, optimizers, LoRA, the loop, checkpoints, evaluation, sampling.

Run as ``python -m workbench.train RUN_DIR`` (``__main__``) by the launcher. Reads its data through
:mod:`workbench.data` and its resolved settings from :mod:`workbench.plan`. Never imports textual.

The model and how it is built:

- ``model``         the decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) and the fused loss
- ``lora``          low-rank adapters on a frozen model; adapter-only checkpoints, merging for export
- ``build``         the model as a run's settings say (activation checkpointing, compile, DDP, FSDP2)
- ``optim``         the optimizer: AdamW, or Muon for the hidden matrices and AdamW for the rest
- ``runtime``       the torch side of the settings: devices, the AMP dtype, backends
- ``dist``          who we are under torchrun, and the few collectives the loop needs

The loop and what it keeps:

- ``start``         the trainer's parts and their setup in named parts; the start record
- ``loop``          the :class:`Trainer`: setup, then a short loop over named steps
- ``batches``       what a step draws: token windows of text, packed rows of conversations
- ``skips``         each step's loss read back, non-finite steps skipped, when a rollback is due
- ``preference_losses`` the preference objectives (DPO, SimPO, ORPO, KTO) as losses on answer log-probabilities
- ``grpo``          GRPO's loss: group-normalised advantages, the clipped token-level ratio, the k3 KL, TRL's four
                    normalisations (dapo, grpo, bnpo, dr_grpo)
- ``grpo_step``     GRPO's step: G completions a prompt from the current policy, scored, and one policy-gradient loss
- ``grpo_run``      a GRPO run (``train.objective = grpo``) in the loop: each step's prompts rolled out and scored by
                    ``train.reward``, the loss, the reward records, the held-out prompts' reward as its eval
- ``objective``     a preference run's objective on its batches: the losses by the table's names (config.objectives),
                    the reference, the measures logged, the checks
- ``reference``     a precomputed reference: the pass over every answer before training, re-checked at each start
- ``budget``        ``train.time_budget``'s clock
- ``budget_steps``  the trainer's side of it: evals sized to the budget, the clock read after each step
- ``state``         the trainer's own state (step, tokens seen, the data sampler, RNGs) with
                    ``to_dict`` / ``from_dict``
- ``stateful``      the trainer's ``state_dict`` / ``load_state_dict`` pair (the horizon's state kept with it)
- ``checkpointer``  when to save, prune and report a checkpoint
- ``checkpoint``    atomic checkpoints, their retention, and ``load_run_model`` (sample, export, resume)
- ``reporter``      the log lines, typed records and status the trainer writes to its run directory

Evaluation and generation:

- ``evaluation``    mean loss and bits per byte over fixed batches of the train and val data
- ``task_eval``     scoring a model on eval tasks and held-out text (``train.eval_tasks``, ``workbench eval``)
- ``generate``      generation with a KV cache
- ``chat_reply``    a chat model's reply through the run's chat template
- ``batch_probe``   ``workbench fit``'s measurement: the largest micro-batch that fits a device
"""
