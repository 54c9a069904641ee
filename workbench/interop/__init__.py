"""Interop: other tools' model formats, above the engine (it loads and saves through it).

- ``hf_layout``    the Hugging Face Llama / Qwen layout: config.json and tensor names <-> workbench's
- ``hf_import``    a local Hugging Face model directory -> a run directory with step-0 weights (``workbench import``)
- ``export``       a run's checkpoint -> a Hugging Face directory (safetensors) or GGUF (``workbench export``)
- ``gguf_export``  the GGUF writer (llama.cpp, Ollama, LM Studio)

May import: train, data, rundir, config, fs, errors. Never textual.
"""
