"""What this machine has, and the GPUs it could have.

- ``detect``    what this machine has, without torch (CPU, RAM, NVML, MPS): the typed ``Machine``
- ``gpus``      the GPU table: memory, peak FLOP/s, bandwidth, power, and where each number comes from
- ``peaks``     a device name's row of that table
- ``activity``  what else the machine is doing while a run trains: CPU shares by process, GPU processes and
                clock throttle reasons (the run doctor's hardware snapshot)
- ``rates``     the matmul rates measured here, kept between processes: the best is the peak
- ``probe``     what torch sees (CUDA, MPS, fused kernels) and a measured matmul rate

All but ``probe`` are torch-free and may be imported by any layer above, the TUI included; ``probe``
imports torch."""
