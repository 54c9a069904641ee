"""Presets: the [model] / [train] / [data] / [hardware] sections as dataclasses.

Each field's documentation lives once, here, in its ``doc`` metadata (shown by
``workbench presets show`` and the TUI), with its type, choices and limits.
Loading and validating a preset from parsed TOML is ``workbench.config.validate``.

This module imports neither torch nor textual.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from workbench.config.duration import budget_seconds
from workbench.config.objectives import (
    DEFAULT_SIMPO_GAMMA,
    GRPO_LOSSES,
    KTO,
    OBJECTIVE_NAMES,
    OBJECTIVES,
    PAIRS,
    SFT,
    objective_spec,
    objectives_on,
)
from workbench.errors import WorkbenchError


class PresetError(WorkbenchError):
    """A preset that cannot be used, with a message that says how to fix it."""


def _f(default: Any, doc: str, *, choices: tuple | None = None, min: float | None = None,
       max: float | None = None, min_exclusive: bool = False) -> Any:
    meta = {"doc": doc, "choices": choices, "min": min, "max": max, "min_exclusive": min_exclusive}
    return field(default=default, metadata=meta)


def _objective_doc() -> str:
    """train.objective's documentation, each objective's line from the table (workbench.config.objectives)."""
    paired = ", ".join(f"{o} ({OBJECTIVES[o].summary})" for o in objectives_on(PAIRS))
    labelled = ", ".join(objectives_on(KTO))
    return (f"What the run optimises. {SFT}: {OBJECTIVES[SFT].summary}. On preference data (records of "
            f"prompt/chosen/rejected, or prompt/completion/label): {paired} or, on labelled answers, {labelled}. "
            f"batch_size counts pairs ({labelled}: answers). grpo: {OBJECTIVES['grpo'].summary} (data.corpus a "
            "prompts file, batch_size prompts a step, train.grpo_group completions each). The reference is chosen "
            "for the run and stated at its start and in `workbench estimate`.")


@dataclass
class ModelConfig:
    vocab_size: int = _f(8192, "Tokenizer vocabulary size (sentencepiece BPE trained on the corpus).", min=64)
    dim: int = _f(256, "Width of the residual stream (embedding size).", min=8)
    n_layers: int = _f(4, "Number of transformer blocks.", min=1)
    n_heads: int = _f(8, "Attention (query) heads per block; dim must be divisible by it.", min=1)
    n_kv_heads: int = _f(4, "Key/value heads (grouped-query attention): n_heads for MHA, 1 for MQA; "
                            "must divide n_heads.", min=1)
    seq_len: int = _f(256, "Context length in tokens (training window and sampling context).", min=2)
    ffn_hidden: int = _f(0, "SwiGLU hidden width; 0 = 8/3 x dim rounded up to a multiple of 64.", min=0)
    dropout: float = _f(0.0, "Dropout probability on attention output, MLP output and embeddings.", min=0.0, max=0.9)
    rope_theta: float = _f(10000.0, "RoPE base frequency.", min=1.0)
    norm_eps: float = _f(1e-5, "RMSNorm epsilon.", min=0.0, min_exclusive=True)
    tie_embeddings: bool = _f(True, "Share the token embedding and the output projection.")
    zero_init_out: bool = _f(False, "Start each block's output projections (attention's wo, the MLP's w2) at zero, as "
                                    "modded-nanogpt does: every block begins as the identity. Only the initial "
                                    "weights change (export is unaffected).")
    # Keys an imported model may need (workbench import); their defaults are workbench's own model.
    head_size: int = _f(0, "Width of each attention head; 0 = dim / n_heads. Imported models whose heads are wider "
                           "(Qwen3) set it.", min=0)
    attn_bias: bool = _f(False, "Biases on the query, key and value projections (imported Qwen2 / Qwen2.5 models).")
    qk_norm: bool = _f(False, "RMSNorm on each head's queries and keys before RoPE (imported Qwen3 models).")
    rope_scaling: str = _f("none", "RoPE frequency scaling for contexts longer than the model was trained on: none, "
                                   "linear (positions / rope_factor) or llama3 (Llama 3.1 / 3.2's per-frequency "
                                   "scaling).", choices=("none", "linear", "llama3"))
    rope_factor: float = _f(1.0, "rope_scaling's factor.", min=1.0)
    rope_low_freq_factor: float = _f(1.0, "llama3 rope_scaling: wavelengths above original context / this are "
                                          "scaled by rope_factor.", min=0.0, min_exclusive=True)
    rope_high_freq_factor: float = _f(4.0, "llama3 rope_scaling: wavelengths below original context / this are "
                                           "kept.", min=0.0, min_exclusive=True)
    rope_original_context: int = _f(8192, "llama3 rope_scaling: the context the model was pretrained on.", min=1)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        h = int(8 * self.dim / 3)
        return 64 * ((h + 63) // 64)


@dataclass
class TrainConfig:
    batch_size: int = _f(8, "Micro-batch size in sequences, over all processes together (each of N "
                            "data-parallel processes takes batch_size / N).", min=1)
    grad_accum: int = _f(1, "Micro-batches per optimizer step; tokens/step = batch_size x grad_accum x seq_len.", min=1)
    max_iters: int = _f(2000, "Optimizer steps to train for (with time_budget: the end shown until estimated).",
                        min=1)
    time_budget: str = _f("", "Train for this long instead of max_iters (e.g. 45m, 2h, 1h30m, 90s; a bare number "
                              "is minutes), on the "
                              "trainer's own clock (evals counted; set-up and the first step's compile not): the "
                              "learning-rate schedule follows the clock (wsd decays over the last decay_fraction of "
                              "the budget) and the run ends at the budget with a checkpoint. \"\" = max_iters.")
    optimizer: str = _f("adamw", "adamw: AdamW for every parameter. muon: Muon (momentum, then Newton-Schulz "
                                 "orthogonalisation) for the hidden matrices (attention and MLP weights), AdamW "
                                 "(train.lr) for embeddings, the output head and norms.", choices=("adamw", "muon"))
    lr: float = _f(6e-4, "Peak learning rate of AdamW (with optimizer = muon: of the embeddings, head and norms), "
                         "reached after warmup.", min=0.0, max=1.0, min_exclusive=True)
    min_lr: float = _f(6e-5, "Learning rate at the end of the decay (Muon's ends at the same fraction of muon_lr).",
                       min=0.0, max=1.0)
    muon_lr: float = _f(0.02, "Peak learning rate of Muon for the hidden matrices (Keller Jordan's scale: each "
                              "update's RMS is about this x sqrt(max(1, rows/cols))).", min=0.0, max=1.0,
                        min_exclusive=True)
    muon_momentum: float = _f(0.95, "Muon's momentum (Nesterov).", min=0.0, max=1.0)
    muon_weight_decay: float = _f(0.0, "Muon's decoupled weight decay on the hidden matrices.", min=0.0, max=1.0)
    muon_ns: str = _f("jordan", "Muon's Newton-Schulz coefficients: jordan (Keller Jordan's quintic, 5 steps), "
                                "polar-express (the Polar Express paper's 5 minimax steps: the same cost, nearer "
                                "orthogonal), minimax-4 or minimax-3 (4 or 3 steps: 4/5 or 3/5 of the cost).",
                      choices=("jordan", "polar-express", "minimax-4", "minimax-3"))
    schedule: str = _f("cosine", "cosine: linear warmup, then cosine decay to min_lr at lr_decay_iters (default "
                                 "max_iters). wsd: linear warmup, stable at lr, then linear decay to min_lr over the "
                                 "last decay_fraction of max_iters; a run extended with --more continues its stable "
                                 "phase from where the decay began.", choices=("cosine", "wsd"))
    decay_fraction: float = _f(0.2, "wsd: the share of max_iters over which the learning rate decays.",
                               min=0.0, max=1.0, min_exclusive=True)
    warmup_iters: int = _f(100, "Linear warmup steps; must be < max_iters.", min=0)
    lr_decay_iters: int = _f(0, "cosine: the step at which the decay reaches min_lr; 0 = max_iters.", min=0)
    weight_decay: float = _f(0.1, "AdamW weight decay (applied to matrices only, not norms).", min=0.0, max=1.0)
    beta1: float = _f(0.9, "AdamW beta1.", min=0.0, max=1.0)
    beta2: float = _f(0.95, "AdamW beta2.", min=0.0, max=1.0)
    grad_clip: float = _f(1.0, "Clip the global gradient norm to this; 0 = no clipping.", min=0.0)
    eval_interval: int = _f(200, "Evaluate train and val loss every this many steps.", min=1)
    eval_iters: int = _f(0, "Batches of train and of val each eval scores (the same ones every eval); 0 = auto: "
                            "enough that the val loss is within ~0.05 nats of the whole split's (changes from eval "
                            "to eval within ~0.01), never more than the val split's distinct windows.", min=0)
    eval_shares: str | list[float] = _f("", "Shares of the run (of a time budget, or of max_iters) to evaluate at on "
                                            "the way, e.g. [0.25, 0.5] or \"0.25,0.5\"; '' = a budget's plan "
                                            "places them (even shares), a run counted in steps every eval_interval. "
                                            "A sweep's pruner sets its rungs here, so every trial is compared at the "
                                            "same shares.")
    log_interval: int = _f(10, "Write a train record to metrics.jsonl every this many steps.", min=1)
    ckpt_interval: int = _f(500, "Save a checkpoint every this many steps (and at the end).", min=1)
    keep_last: int = _f(3, "Checkpoints kept besides the best one (older ones are deleted).", min=1)
    milestone_interval: int = _f(0, "Also keep every checkpoint whose step is a multiple of this; 0 = none.", min=0)
    patience: int = _f(0, "Early stopping: evals without val-loss improvement before stopping; 0 = off.", min=0)
    min_delta: float = _f(0.0, "Smallest val-loss decrease that counts as an improvement.", min=0.0)
    max_skips: int = _f(5, "Consecutive non-finite steps tolerated before rolling back / failing.", min=1)
    seed: int = _f(1337, "Seed for weights, data windows and dropout.", min=0)
    sample_prompt: str = _f("", "If set, a short sample from this prompt is written to samples.jsonl at each eval.")
    sample_tokens: int = _f(64, "Tokens generated for each eval-time sample.", min=1)
    eval_tasks: str | list[str] = _f("", "Tasks scored while training (task records in metrics.jsonl): built-in "
                                     "names (stdlib-next-line, docs-cloze; builtin = both) or JSONL task files "
                                     "(see `workbench eval`); '' = none.")
    task_eval_every: int = _f(0, "Score train.eval_tasks every this many steps; 0 = at each checkpoint interval "
                                 "(and at step 0 and the end).", min=0)
    task_limit: int = _f(100, "Items of each task scored while training (its first N; `workbench eval` scores "
                              "all of them).", min=1)
    loss_on: str = _f("assistant", "chat data (data.format): the tokens the loss is computed on. assistant: every "
                                   "assistant message and its end-of-turn token; last_assistant: the last one of "
                                   "each conversation; all: every token.",
                      choices=("assistant", "last_assistant", "all"))
    objective: str = _f(SFT, _objective_doc(), choices=OBJECTIVE_NAMES)
    pref_beta: float = _f(0.0, "Preference objectives: the strength beta (orpo: lambda); 0 = the objective's own "
                               "default: dpo 0.1, kto 0.1, simpo 2.0, orpo 0.1.", min=0.0)
    pref_label_smoothing: float = _f(0.0, "dpo and simpo: the share of pairs assumed mislabelled (robust DPO; "
                                          "SimPO's conservative loss); 0 = plain.", min=0.0, max=0.49)
    pref_sft_weight: float = _f(0.0, "dpo and simpo: weight of an SFT term on the chosen answers (their token-mean "
                                     "negative log-likelihood) added to the loss; it holds the chosen answers' "
                                     "probability up while the margin widens. 0 = none.", min=0.0)
    pref_reference: str = _f("auto", "dpo and kto: how the reference's log-probs are had. live: computed every "
                                     "step beside the policy's (a LoRA run: the model with its adapters off; a "
                                     "full fine-tune: a frozen copy of the starting weights, a second copy in "
                                     "memory). precompute: once, before training, for every answer (one forward "
                                     "pass, cached with the prepared data, re-checked on 64 rows at each start): "
                                     "no second copy of the weights and no reference forward a step; not for kto "
                                     "(its KL rows pair answers by batch). auto: precompute for a full "
                                     "fine-tune's dpo, live otherwise.",
                              choices=("auto", "live", "precompute"))
    dpop_lambda: float = _f(0.0, "dpo: DPO-Positive's (DPOP, Pal et al. 2024) penalty lambda on the chosen answers' "
                                 "log-prob falling below the reference's: the margin less lambda * max(0, ref_c - "
                                 "pi_c) (summed log-probs). It keeps DPO from pushing the chosen answers down with "
                                 "rejected ones that share most of their tokens; the paper uses 50. 0 = plain DPO.",
                            min=0.0)
    simpo_gamma: float = _f(DEFAULT_SIMPO_GAMMA, "simpo: the target reward margin gamma (beta / 2 is the paper's "
                                                 "advice).", min=0.0)
    kto_desirable_weight: float = _f(1.0, "kto: weight of the desirable (label true) answers' loss.", min=0.0,
                                     min_exclusive=True)
    kto_undesirable_weight: float = _f(1.0, "kto: weight of the undesirable (label false) answers' loss.", min=0.0,
                                       min_exclusive=True)
    reward: str = _f("", "grpo: the reward that scores each completion (as `workbench pairs --reward`): exact[:FIELD], "
                         "regex:PATTERN, contains:TEXT, length:TARGET, lexicon:POS[,NEG], or FILE.py:FUNCTION "
                         "(FUNCTION(prompt, completion, record) -> float). Required by grpo; '' = none.")
    grpo_group: int = _f(8, "grpo: completions sampled for each prompt, G (TRL's num_generations; advantages are "
                            "normalised within each prompt's group).", min=2)
    grpo_clip: float = _f(0.2, "grpo: the ratio's clip epsilon (PPO's, DeepSeekMath's and TRL's 0.2).", min=0.0,
                          max=1.0, min_exclusive=True)
    grpo_clip_high: float = _f(0.0, "grpo: the clip's upper epsilon (DAPO's clip-higher: 0.28); 0 = grpo_clip.",
                               min=0.0)
    grpo_beta: float = _f(0.0, "grpo: weight of the k3 KL to the reference (the model the run started from); 0 = "
                               "none and no reference forward (TRL's default; DeepSeekMath used 0.04).", min=0.0)
    grpo_max_new_tokens: int = _f(0, "grpo: the longest completion sampled, in tokens (must be < model.seq_len; "
                                     "the prompt keeps the rest of the window); 0 = auto: 64, at most half of "
                                     "model.seq_len.", min=0)
    grpo_loss: str = _f("dapo", "grpo: how the tokens' losses are averaged (TRL's loss_type): dapo (over the "
                                "step's completion tokens: no length bias), grpo (each completion's mean, then the "
                                "mean), bnpo (over the micro-batch's tokens), dr_grpo (over completions x "
                                "grpo_max_new_tokens).", choices=GRPO_LOSSES)
    grpo_scale_std: bool = _f(True, "grpo: divide each advantage by its group's reward std (false: Dr. GRPO's "
                                    "mean-centred rewards).")
    finetune: str = _f("full", "full: train every weight. lora: (a run started with --init-from) freeze the "
                               "weights and train low-rank adapters on lora_targets; checkpoints hold only the "
                               "adapters, and export merges them.", choices=("full", "lora"))
    lora_rank: int = _f(8, "LoRA: rank r of each adapter (B [out, r] @ A [r, in]); at most model.dim.", min=1)
    lora_alpha: float = _f(16.0, "LoRA: the adapters' output is scaled by lora_alpha / lora_rank.",
                           min=0.0, min_exclusive=True)
    lora_dropout: float = _f(0.0, "LoRA: dropout on the adapters' input.", min=0.0, max=0.9)
    lora_targets: str | list[str] = _f("attention,mlp", "LoRA: the projections that get adapters, a list or a "
                                       "comma-separated string: attention (wq, wk, wv, wo), mlp (w1, w2, w3), or "
                                       "any of those names (or q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                       "down_proj).")

    @property
    def time_budget_s(self) -> float | None:
        """``time_budget`` in seconds, None without one: the one reading of the budget (the text stays as the user
        wrote it, in preset.toml). Checked when the preset is made (validate.py), so it parses here. A property,
        not a cache: ``vars()`` of this section is saved in checkpoints and must not gain a field."""
        return budget_seconds(self.time_budget)


@dataclass
class DataConfig:
    corpus: str | list[str] = _f("builtin", "A path, a glob or a list of them: text files, directories (recursive), "
                                            ".jsonl/.json lines, .parquet, each optionally .gz/.zst/.xz; or "
                                            "'builtin' (Python's own docs and stdlib sources).")
    mixture: list[dict] = field(default_factory=list, metadata={
        "doc": "Several corpora trained on in stated shares ([[data.mixture]] tables of name, corpus, weight and "
               "optionally max_repeat; on the command line --corpus NAME=PATH:WEIGHT, repeated); data.corpus is then "
               "unused. Shares are of sequences of model.seq_len tokens (= of tokens), exact within one sequence "
               "after every step; a source repeated more than its max_repeat times (0: no limit) is refused before "
               "training. Text sources only.",
        "choices": None, "min": None, "max": None, "min_exclusive": False})
    text_field: str = _f("text", "The JSON field or parquet column that holds each document's text.")
    skip_bad_records: bool = _f(False, "Skip JSONL/parquet records that are not valid or lack the text field "
                                       "(counted and reported) instead of stopping at the first.")
    val_fraction: float = _f(0.05, "Fraction held out for validation: the last documents of the corpus (the last "
                                   "tokens when it is one document).", min=0.0, max=0.5, min_exclusive=True)
    builtin_mb: float = _f(6.0, "Size cap of the built-in corpus in MB.", min=0.05)
    tokenizer_sample_mb: float = _f(8.0, "MB of text, drawn from the whole corpus, that the tokenizer is trained on.",
                                    min=0.05)
    tokenizer: str = _f("", "'' = train a sentencepiece BPE tokenizer of model.vocab_size pieces on the corpus; or "
                            "the tokenizer to encode it with as it is: a run directory's tokenizer.model or "
                            "tokenizer.json (Hugging Face), or a directory holding one. A run started with "
                            "--init-from uses its source run's.")
    format: str = _f("auto", "text: documents. chat: conversations (OpenAI messages, ShareGPT conversations, alpaca "
                             "instruction/input/output, or prompt/completion), rendered through data.chat_template, "
                             "the loss on the answers (train.loss_on). auto: chat when the first JSONL/parquet "
                             "record is a conversation, else text.", choices=("auto", "text", "chat"))
    messages_field: str = _f("", "chat: the field holding each record's list of messages when it is not messages "
                                 "or conversations; '' = detected.")
    chat_roles: str | list[str] = _f("", "chat: more role names, as name=role pairs (a list or a comma-separated "
                                         "string) mapping to system, user or assistant, e.g. 'bot=assistant'.")
    chat_template: str = _f("model", "chat: model (an imported model's own chat_template; for workbench's own "
                                     "tokenizer, chatml), chatml (the built-in ChatML template, whose pieces every "
                                     "workbench tokenizer reserves), or a path to a Jinja template file.")
    packing: bool = _f(True, "chat: place whole conversations into model.seq_len rows (best-fit decreasing), "
                             "attention and positions restarting in each; false = one conversation a row, padded.")
    overlong: str = _f("truncate", "chat: a conversation longer than model.seq_len is truncated to it, or dropped "
                                   "(either is counted and reported).", choices=("truncate", "drop"))


@dataclass
class HardwareConfig:
    device: str = _f("auto", "auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps.")
    precision: str = _f("auto", "auto, fp32, bf16 or fp16. auto: bf16 on CUDA with bf16 / MPS, fp16+GradScaler "
                                "on older CUDA, fp32 on CPU.",
                        choices=("auto", "fp32", "bf16", "fp16"))
    compile: str = _f("auto", "torch.compile: auto (on for CUDA; on a CPU when the rest of the run would take 10 "
                      "minutes or more eager, so the compile pays back), true or false.",
                      choices=("auto", "true", "false"))
    tf32: bool = _f(True, "Allow TF32 matmuls on Ampere or newer.")
    activation_checkpointing: str = _f("auto", "Recompute block activations in backward to save memory: auto (on only "
                                       "when the memory estimate says the step does not fit the device's free "
                                       "memory without it, keeping 10 % spare), true or false.",
                                       choices=("auto", "true", "false"))
    optimizer_states: str = _f("fp32", "AdamW's two moments per parameter: fp32 (8 bytes a parameter) or 8bit "
                               "(torchao's AdamW8bit: block-wise quantised, ~2 bytes a parameter; tensors under "
                               "4096 values keep fp32), or offload (fp32 moments in the host's memory and AdamW's "
                               "step on the CPU, torchao's CPUOffloadOptimizer: no moments on the GPU; CUDA, one "
                               "process, bf16 or fp32). Muon's momentum stays fp32 on the device. 8bit and offload "
                               "need torchao: pip install 'workbench[savers]'.", choices=("fp32", "8bit", "offload"))
    chunked_loss: str = _f("auto", "Fused loss: logits, softmax and their gradients a chunk of tokens at a time, so "
                           "the full logits never exist: auto (on CPU always, it is faster there; on GPUs only when "
                           "the memory estimate says the plain loss does not fit the device's free memory, keeping "
                           "10 % spare), true or false.", choices=("auto", "true", "false"))
    fused_adamw: str = _f("auto", "Fused AdamW kernel: auto (on for CUDA and CPU), true or false.",
                          choices=("auto", "true", "false"))
    compile_kernels: str = _f("default", "torch.compile's mode: default; reduce-overhead (CUDA graphs: fewer kernel "
                              "launches, more memory); max-autotune (also tries Triton matmul kernels: a much longer "
                              "first compile); max-autotune-no-cudagraphs.",
                              choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"))
    attention_kernel: str = _f("auto", "Which CUDA kernel attention uses: auto (torch's choice; flex for packed "
                               "conversations without dropout), flash, cudnn or efficient (SDPA with the others "
                               "switched off; bench/attention_kernels.py times each on your GPU), or flex (flex "
                               "attention for packed conversations: skips the blocks across conversations; needs "
                               "model.dropout = 0). No effect off CUDA.",
                               choices=("auto", "flash", "cudnn", "efficient", "flex"))
    deterministic: bool = _f(False, "Bit-for-bit reproducible steps on CUDA (a run, and a run killed and resumed, "
                             "give the same losses): torch's deterministic algorithms, cuBLAS's fixed workspace, "
                             "and the memory-efficient attention kernel (its backward has a deterministic mode; "
                             "flash and cuDNN accumulate with atomics). Slower. CPU runs are deterministic anyway.")
    nonfinite_check: str = _f("auto", "Where a step with a non-finite loss or gradient is caught and skipped: host "
                              "(the loss and gradient norm are copied to the CPU before every update: one wait for the "
                              "GPU per step), device (the fused AdamW kernel skips the update itself; the loop "
                              "learns of it a step later) or auto (device where it can: one process, fused AdamW, "
                              "no Muon, no fp16 GradScaler).", choices=("auto", "host", "device"))
    num_threads: int = _f(0, "CPU threads for torch; 0 = torch's default (torchrun sets 1 per process).", min=0)
    nproc: int = _f(1, "Trainer processes on this machine; > 1 trains data-parallel under torchrun (DDP; NCCL "
                       "on CUDA, one GPU each; gloo on CPU, one thread each). 0 = auto: one per GPU, or on a "
                       "CPU one per physical core. train.batch_size is split evenly over all processes.", min=0)
    shard: bool = _f(False, "With more than one process: shard parameters, gradients and optimizer state "
                     "over the processes with FSDP2 (fully_shard on each transformer block, then on the whole "
                     "model), so each holds about 1/N of them, instead of a full copy each with DDP. "
                     "Checkpoints stay whole (any process count resumes them). No effect with one process.")
    expected_memory_gb: float = _f(0.0, "Informational: the memory this preset was sized for (0 = not stated).",
                                   min=0.0)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "train": TrainConfig,
    "data": DataConfig,
    "hardware": HardwareConfig,
}


@dataclass
class Preset:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    name: str = "custom"
    description: str = ""
    # A run branched from another run's checkpoint records where it came from: {"run": id, "step": N}
    # (a [parent] table in its preset.toml). None for a run that starts from scratch.
    parent: dict | None = None
    # A run whose first weights are another run's checkpoint (train --init-from): {"run": id, "step": N}
    # (an [init] table); its weights are in the run's init/model.pt. None: random weights.
    init: dict | None = None
    # Where the weights first came from, for a model imported from Hugging Face and the runs trained from it:
    # {"model": directory, "architecture": ..., ...} (a [source] table). None for workbench's own models.
    source: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        for table in ("parent", "init", "source"):
            if getattr(self, table):
                out[table] = dict(getattr(self, table))
        for sec in SECTIONS:
            out[sec] = dataclasses.asdict(getattr(self, sec))
        return out

    def tokens_per_step(self) -> int:
        """Positions a step trains on: a preference pair is two rows (its chosen and its rejected answer)."""
        rows = objective_spec(self.train.objective).rows_per_item
        return rows * self.train.batch_size * self.train.grad_accum * self.model.seq_len

