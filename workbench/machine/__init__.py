"""What this machine has. ``detect`` (torch-free: psutil, NVML) and ``peaks`` (a table) may be
imported by any layer above, the TUI included; ``probe`` imports torch."""
