"""Will it fit: a preset's size and memory, the savers auto decides, the micro-batch search, the recommended preset.

- ``flops``       parameter counts and FLOPs per token
- ``activations`` what one block saves for backward (QK-norm, LoRA, packed rows)
- ``memory``      training memory by component (a frozen MemoryEstimate)
- ``savers``      the memory savers auto decides (the fused loss, activation checkpointing) from the estimate
- ``batch``       the micro-batch search and gradient-accumulation plan ``fit`` uses
- ``recommend``   the preset that suits a machine, and what to change when one does not fit
"""
