"""The command line: one module per ``workbench`` subcommand (argument parsing and printing only; what a
command decides is asked of the layers below), wired together by ``workbench.cli``.

- ``train``          start a run from a preset (``--init-from`` a run's weights, ``--detach``)
- ``resume``         continue a run from a complete checkpoint, in place or as a branch; ``--more``
- ``stop``           ask a running trainer to save and exit
- ``queue``          the run queue: add, list, run, pause, resume, remove, move
- ``sweep``          many runs of one preset over a grid or a search, queued and ranked
- ``runs``           every run: state, progress, losses, checkpoints, disk use
- ``metrics``        a run's records as CSV or TensorBoard files
- ``doctor``         what is wrong with a run, and what to change
- ``estimate``       parameters, FLOPs, memory, fit, time, energy and cost of a preset; ``--gpu``, ``--compare``
- ``fit``            the largest micro-batch that fits this machine
- ``hw``             what this machine has, and the preset that suits it
- ``presets``        list, show, validate, copy presets
- ``data``           a corpus's tokenizer and tokens ahead of a run, and a look at its first documents
- ``chat_preview``   what ``data inspect|prepare`` show of a chat corpus (rendered, the trained part marked)
- ``sample``         stream text from a checkpoint
- ``chat``           talk with a chat-tuned checkpoint
- ``eval``           score checkpoints on tasks and held-out text, and on a reward over prompts (pass@k)
- ``pairs``          preference pairs from a checkpoint's own samples, scored by a reward
- ``rounds``         iterated on-policy tuning: queued rounds of sample -> pair -> DPO + NLL, each from the last
- ``export``         a checkpoint as a Hugging Face directory, safetensors or GGUF
- ``import_model``   ``workbench import``: a local Hugging Face model as a run to fine-tune from
- ``tui``            the terminal UI (also bare ``workbench``)
- ``serve``          the terminal UI in a web browser (textual-serve; localhost, or a token elsewhere)
- ``launch``         starting trainers: foreground or detached in their own session, alone or under torchrun
- ``common``         argument helpers the subcommands share
"""
