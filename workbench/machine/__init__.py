"""What this machine has, and the GPUs it could have. ``detect`` (torch-free: psutil, NVML), ``gpus``
(the GPU table: memory, peak FLOP/s, bandwidth, power, sources) and ``peaks`` (a device name's row of
it) may be imported by any layer above, the TUI included; ``probe`` imports torch."""
