"""workbench: train small GPT-style language models on your own machine."""

__version__ = "0.1.0"
