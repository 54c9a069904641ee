#!/usr/bin/env bash
# The CUDA checks we run on a lent GPU (device tool): first the GPU tests (tests/train/test_gpu.py, `pytest -m gpu`:
# precision auto, bf16 / fp16 + GradScaler / fp32, TF32, the fused loss on CUDA, --nproc 1 and NCCL), then a
# bf16 + compile run, kill -9 / resume agreement on CUDA, throughput and MFU for gpu-8gb and a ~124 M-parameter
# config, estimated vs measured peak memory. Exits non-zero when a GPU test fails.
# Usage: bash bench/gpu_check.sh [quick|tests|sweep-memory|preference|numbers|eval|muon|muon-time|medium-time|chat|mfu|profile|savers|recipe|budget|peers|peers-time]   (tests: the GPU tests alone; quick: the GPU
# tests, kill -9 / resume and fit's OOM path; numbers: the throughput runs and estimates alone; muon: Muon against AdamW,
# time a step and the Newton-Schulz share; mfu: the ~124 M config's MFU levers, each one trainer run, and the gpu-8gb
# defaults; eval: task scores while training on CUDA and `workbench eval` on CUDA and CPU; set WB_LEVERS to choose which;
# peers / peers-time: workbench against nanoGPT, tokens/s or time to its loss, bench/gpu_peers.py)
set -u
cd "$(dirname "$0")/.."
export WORKBENCH_CACHE_DIR=${WORKBENCH_CACHE_DIR:-/tmp/wbcache} PYTHONUNBUFFERED=1
PY=${PY:-python3}
R=/tmp/wbruns; rm -rf $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
# qk_norm=false: the levers (mfu, profile) and the README's first rows were measured before QK-norm became the presets'
# default; the numbers and muon modes add model.qk_norm=true, the presets' recipe
G124="model.qk_norm=false model.vocab_size=32768 model.dim=768 model.n_layers=12 model.n_heads=12 model.n_kv_heads=12 model.ffn_hidden=2560
      model.seq_len=1024 model.dropout=0.0 train.batch_size=32 hardware.activation_checkpointing=false
      hardware.chunked_loss=false data.builtin_mb=24"
if [ "${1:-}" = peers ] || [ "${1:-}" = peers-time ]; then
    # workbench against nanoGPT's model.py at issue 48's size (dim 768, 12 layers, 12 heads, seq 1024, vocab 32768,
    # batch 32, workbench ffn_hidden 2048: the same 110.1 M matrix params), one contender after the other in one
    # process (bench/gpu_peers.py). The nanoGPT checkout is brought in for the bench (WB_NANOGPT, never committed).
    # peers: tokens/s, MFU, peak memory and the estimate's error; nanoGPT, then gpu-24gb at that size as shipped,
    # with the plain loss, and also without QK-norm. Each compiles in its 5 warm-up steps (~40-60 s), then 20 timed
    # steps: ~4-5 minutes in all. peers-time: nanoGPT's train.py recipe against gpu-24gb's on the same built-in
    # corpus tokens, 200 steps, an eval every 25: ~4-6 minutes (the tokenizer ~10 s, each compile, 200 steps each).
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/wbinductor} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    NANO=${WB_NANOGPT:-peers/nanoGPT}
    if [ "$1" = peers ]; then
        # Each contender its own process; a wave's processes compile at once (the host's 16 cores), then take
        # their timed steps one at a time (bench/gpu_peers.py --barrier). Two waves keep the GPU's memory in
        # bounds (~80 GB each on 139 GB). shipped: gpu-24gb at the issue's size as shipped (auto's memory
        # savers); chunked: the fused loss forced, as the old auto chose it; no-qknorm; two QK-norm layout
        # variants; gpu-8gb at its own shape as shipped now (auto) and as before (checkpointing + fused loss).
        W=(nanogpt "shipped=gpu-24gb" "chunked=gpu-24gb hardware.chunked_loss=true"
           "no-qknorm=gpu-24gb model.qk_norm=false"
           "rbt=gpu-24gb variant=rope-before-transpose" "rbt-rms=gpu-24gb variant=rope-before-transpose+rms-norm-op"
           "g8=gpu-8gb native" "g8-before=gpu-8gb native hardware.activation_checkpointing=true hardware.chunked_loss=true")
        [ -n "${WB_CONTENDERS:-}" ] && eval "W=($WB_CONTENDERS)"   # nanogpt first, then NAME=PRESET ... strings
        WAVES=${WB_WAVES:-"0,1,2,3 4,5,6,7"}
        B=/tmp/wb-peers-bar; rm -rf $B; mkdir -p $B
        ARGS=(); for w in "${W[@]:1}"; do ARGS+=(--wb "$w"); done
        files=()
        for wave in $WAVES; do
            n=$(echo $wave | tr ',' '\n' | wc -l)
            for i in ${wave//,/ }; do
                name=${W[$i]%%=*}
                prof=(); [ "$name" = shipped ] && prof=(--profile shipped)
                $PY bench/gpu_peers.py --nanogpt "$NANO" --warmup 5 --steps ${WB_STEPS:-20} "${ARGS[@]}" \
                    --only $name --barrier $B/w$wave --barrier-count $n "${prof[@]}" --json $B/$name.json \
                    > $B/$name.log 2>&1 &
                files+=($B/$name.json)
            done
            wait
            for i in ${wave//,/ }; do name=${W[$i]%%=*}; echo "== $name"; grep -v "^workbench overrides" $B/$name.log; done
        done
        ok=(); for f in "${files[@]}"; do [ -f $f ] && ok+=($f); done
        $PY bench/gpu_peers.py --merge "${ok[@]}" --json ${OUT:-/tmp}/peers.json
    else
        $PY bench/gpu_peers.py --nanogpt "$NANO" --time-to-loss --warmup 5 --steps ${WB_STEPS:-200} --eval-every 25 \
            --wb shipped=gpu-24gb --json ${OUT:-/tmp}/peers_time.json ${WB_PEERS_ARGS:-}
    fi
    exit $?
fi
if [ "${1:-}" = sweep-memory ]; then  # issue 47: a sweep of gpu-8gb-sized trials, each its own process: no
    # out-of-memory failure, and the GPU's free memory after each trial against before the first (the runner
    # records both; nvidia-smi every second beside it, an independent record). WB_SWEEP_SET adds overrides
    # (the CPU smoke: a tiny model on the CPU).
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/wbinductor}
    S=/tmp/wbsweep; rm -rf $S
    SMI=
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=timestamp,memory.used,memory.free --format=csv,noheader -l 1 > ${OUT:-/tmp}/smi_sweep.csv &
        SMI=$!
    fi
    $PY -m workbench sweep gpu-8gb --set-grid train.lr=${WB_LRS:-3e-4,6e-4,1.2e-3} --time-budget ${WB_BUDGET:-30s} \
        --name gmem --runs-dir $S --set data.builtin_mb=8 ${WB_SWEEP_SET:-}
    $PY -m workbench queue run --runs-dir $S
    [ -n "$SMI" ] && kill $SMI
    $PY -m workbench sweep show gmem --runs-dir $S
    $PY -m workbench sweep show gmem --runs-dir $S --tsv
    $PY -m workbench queue ls --runs-dir $S
    exit 0
fi
if [ "${1:-}" = preference ]; then  # issue 46: bench/preference.py on the GPU, its arms WB_JOBS at a time (the
    # host's 16 cores start them; the tiny models share the card), for each kind of pairs and learning rate, several
    # seeds. DPO's reference is the frozen copy (live) here; then one DPO run with the default (a precomputed table
    # on CUDA, bf16) shows whether its start check passes there.
    P=${WB_PREF_OUT:-/tmp/wbpref}
    $PY bench/preference.py --out $P --device ${WB_DEVICE:-cuda} --jobs ${WB_JOBS:-16} --pairs ${WB_PAIRS:-onpolicy synthetic} \
        --lr ${WB_LRS:-1e-4} --sft ${WB_SFT:-300} --steps ${WB_STEPS:-100} --held ${WB_HELD:-500} \
        --seeds ${WB_SEEDS:-0 1 2 3} --arms ${WB_ARMS:-sft sft-pairs dpo dpo-sft dpop simpo orpo} \
        --set train.pref_reference=live ${WB_PREF_ARGS:-} | grep -v "^  WORKBENCH_CACHE_DIR"
    kind=${WB_PAIRS:-onpolicy}; kind=${kind%% *}
    $PY -m workbench train cpu-small --corpus $P/pairs-$kind-sft${WB_SFT:-300}${WB_SFT_SUFFIX:-}.jsonl --runs-dir $P/runs \
        --name dpo-precomputed --yes --init-from sft${WB_SFT:-300}${WB_SFT_SUFFIX:-} --set model.seq_len=128 hardware.compile=false \
        hardware.device=${WB_DEVICE:-cuda} train.objective=dpo train.max_iters=20 train.eval_interval=20 train.warmup_iters=5 \
        train.lr=1e-4 2>&1 | grep -E "reference|step 0|step 20|error|finished"
    exit 0
fi
if [ "${1:-}" = eval ]; then  # task scoring on CUDA: while training (bf16 autocast, per-block compile) and `workbench eval`
    E="model.dim=256 model.n_layers=4 model.seq_len=256 model.vocab_size=4096 train.batch_size=16 train.warmup_iters=20
       train.max_iters=200 train.ckpt_interval=100 train.eval_interval=100 train.log_interval=50 data.builtin_mb=6
       hardware.device=cuda hardware.compile=true hardware.activation_checkpointing=true
       train.eval_tasks=['builtin'] train.task_limit=100"
    $PY -m workbench train cpu-small --name ev --runs-dir $R --set $E 2>&1 | grep -E "tasks|compile|finished|error|warning"
    for dev in cuda cpu; do
        $PY -m workbench eval ev --runs-dir $R --checkpoint all --task builtin --limit 100 --device $dev --json --no-save \
            > /tmp/ev_$dev.json
    done
    $PY -m workbench eval ev --runs-dir $R --task builtin --device cuda  # all 400 items: the speed
    $PY - <<'PYEOF'
import json
from workbench.analysis.report_card import task_scores
tr = task_scores("/tmp/wbruns/ev")
for dev in ("cuda", "cpu"):
    for c in json.load(open(f"/tmp/ev_{dev}.json"))["checkpoints"]:
        for t in c["tasks"]:
            mine = tr[c["step"]][(t["task"], "centered")]
            print(f"{dev} step {c['step']} {t['task']}: {t['n']} items {t['items_per_s']:.0f}/s centered {t['centered']:.4f} "
                  f"acc {t['acc']:.4f} acc_norm {t['acc_norm']:.4f}; trainer (bf16, first {mine.n}) {mine.value:.4f}")
PYEOF
    exit 0
fi
if [ "${1:-}" = chat ]; then  # packed conversations on CUDA: the mask's cost in attention, and trained tokens/s
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/wbinductor}
    $PY bench/packed_attention.py
    $PY bench/packed_attention.py --min 16 --max 128   # short conversations: many a row
    $PY - <<'PYEOF'
import json, random
rng = random.Random(0)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(4000)]
with open("/tmp/conv.jsonl", "w") as f:  # 20,000 conversations, ~60-700 tokens
    for _ in range(20000):
        u = " ".join(rng.choice(words) for _ in range(rng.randint(10, 150)))
        a = " ".join(rng.choice(words) for _ in range(rng.randint(20, 300)))
        f.write(json.dumps({"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]}) + "\n")
PYEOF
    C="model.vocab_size=4096 train.max_iters=${WB_STEPS:-60} train.log_interval=10 train.warmup_iters=0
       train.eval_interval=1000 train.eval_iters=1 train.sample_prompt='' data.tokenizer_sample_mb=4"
    # model.dropout=0 in all three: flex attention (auto for packed rows) has no attention dropout
    for run in "flex data.packing=true" "mask data.packing=true hardware.attention_kernel=efficient" \
               "unpacked data.packing=false"; do
        set -- $run
        name=$1; shift
        $PY -m workbench train gpu-8gb --corpus /tmp/conv.jsonl --name chat-$name --runs-dir $R --yes \
            --set $C model.dropout=0.0 "$@" 2>&1 | grep -E "chat:|run chat|error" | cut -c1-260
    done
    $PY - <<'PYEOF'
import json, statistics, subprocess, sys
for packing in ("flex", "mask", "unpacked"):
    recs = [json.loads(x) for x in open(f"/tmp/wbruns/chat-{packing}/metrics.jsonl")]
    start = next(r for r in recs if r.get("event") == "start")
    tps = statistics.median(r["tokens_per_s"] for r in recs if r["kind"] == "train" and r.get("tokens_per_s"))
    c = start["chat"]
    print(f"{packing}: {tps:,.0f} positions/s, rows {c['row_fill']:.0%} filled, {c['trained_fraction']:.0%} of "
          f"tokens trained: ~{tps * c['row_fill'] * c['trained_fraction']:,.0f} trained tokens/s; "
          f"peak {max(r['mem_mb'] for r in recs if r.get('mem_mb')):,.0f} MiB")
    est = json.loads(subprocess.run([sys.executable, "-m", "workbench", "estimate",
                                     f"/tmp/wbruns/chat-{packing}/preset.toml", "--json", "--no-calibrate"],
                                    capture_output=True, text=True).stdout or "{}")
    if est:
        print(f"   estimate: peak allocated {est['memory']['peak_allocated'] / 2**20:,.0f} MiB")
PYEOF
    exit 0
fi
if [ "${1:-}" = muon-time ]; then  # time to AdamW + cosine's final val loss: Muon + wsd on gpu-8gb, one seed
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/wbinductor}
    W="train.warmup_iters=30 data.builtin_mb=24"
    $PY bench/time_to_loss.py "gpu-8gb $W" "gpu-8gb $W train.optimizer=muon train.schedule=wsd" \
        --steps ${WB_STEPS:-300} --eval-every 50 --eval-iters 8 --repeat ${WB_REPEAT:-1}
    exit 0
fi
if [ "${1:-}" = medium-time ]; then  # medium's old default (AdamW + cosine) against its new one (Muon + wsd), 200 steps,
    # WB_REPEAT seeds, one run after the other; eager (compile off), so the compile's seconds do not count in either
    $PY bench/time_to_loss.py "medium train.optimizer=adamw train.schedule=cosine train.lr=6e-4 train.warmup_iters=40
        hardware.device=cuda hardware.compile=false" "medium train.warmup_iters=20 hardware.device=cuda hardware.compile=false" \
        --steps 200 --eval-every 20 --eval-iters 4 --repeat ${WB_REPEAT:-3} --json ${OUT:-/tmp}/medium_time.json
    exit 0
fi
if [ "${1:-}" = recipe ]; then  # cpu-small's recipe screened on loss per step (fp32, 3 seeds, 8 runs at once):
    # a step's loss does not depend on the device's speed, so the CPU's candidates are screened here and the
    # winners timed on the CPU with bench/time_to_loss.py. WB_SCREEN ('"setting" "setting" ...') replaces the list, WB_SCREEN_ARGS adds
    # recipe_screen.py's options (--steps 200 --eval-every 20 --eval-iters 4 for medium).
    M="cpu-small train.optimizer=muon train.schedule=wsd train.lr=3e-3 train.muon_ns=polar-express"
    W="$M train.warmup_iters=30"
    S=(cpu-small "$M train.max_iters=500" "$W train.max_iters=500" "$W train.max_iters=450" "$W train.max_iters=400"
       "$W train.max_iters=350" "$M train.warmup_iters=10 train.max_iters=450" "$W train.max_iters=450 train.muon_lr=0.03"
       "$W train.max_iters=450 train.muon_lr=0.04" "$W train.max_iters=450 train.decay_fraction=0.4"
       "$W train.max_iters=400 train.decay_fraction=0.5" "$W train.max_iters=450 train.lr=6e-3"
       "$W train.max_iters=450 train.muon_ns=minimax-4" "$W train.max_iters=400 train.muon_lr=0.03 train.decay_fraction=0.4"
       "$M train.warmup_iters=15 train.max_iters=250 train.batch_size=16"
       "$M train.warmup_iters=15 train.max_iters=225 train.batch_size=16 train.muon_lr=0.03"
       "cpu-small train.schedule=wsd train.decay_fraction=0.4 train.max_iters=500")
    [ -n "${WB_SCREEN:-}" ] && eval "S=($WB_SCREEN)"
    set -- "${S[@]}"
    $PY bench/recipe_screen.py "$@" --seeds ${WB_SEEDS:-3} --parallel ${WB_PARALLEL:-8} --threads 2 \
        --set hardware.device=cuda hardware.precision=fp32 hardware.compile=false --json ${OUT:-/tmp}/screen.json ${WB_SCREEN_ARGS:-}
    exit 0
fi
if [ "${1:-}" = budget ]; then  # the time budget on CUDA: where the run ends against its budget (trainer's own clock)
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/wbinductor}
    for b in ${WB_BUDGETS:-90s}; do
        $PY -m workbench train gpu-8gb --name tb-$b --runs-dir $R --yes --time-budget $b \
            --set data.builtin_mb=24 2>&1 | grep -E "budget|compile|finished|error" | tail -6
        $PY -c "import json,sys; s=json.load(open('$R/tb-$b/status.json')); b=s['budget_s']; d=s['budget_spent_s']; \
print(f'budget {b:.0f} s: spent {d:.1f} s ({(d-b)/b:+.1%}), step {s[\"step\"]}'); \
ev=[json.loads(l) for l in open('$R/tb-$b/metrics.jsonl')]; \
print('evals (step, s):', [(r['step'], r['seconds']) for r in ev if r['kind']=='eval']); \
print('saves (step, s):', [(r['step'], r['seconds']) for r in ev if r.get('event')=='checkpoint'])"
    done
    exit 0
fi
if [ "${1:-}" = muon ]; then  # Muon vs AdamW: ms a step, the Newton-Schulz share (bench/muon_gpu.py), the trainer's tokens/s
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/wbinductor}
    $PY bench/muon_gpu.py gpu-8gb --steps 20
    $PY bench/muon_gpu.py gpu-8gb --steps 20 --set $G124 model.qk_norm=true
    $PY bench/throughput.py gpu-8gb --steps ${WB_STEPS:-60} --set train.optimizer=muon
    exit 0
fi
if [ "${1:-}" = mfu ]; then
    # Compiled kernels shared between the runs (the trainer keeps a user's TORCHINDUCTOR_CACHE_DIR).
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/wbinductor}
    $PY bench/attention_kernels.py
    lever() {  # name, then overrides for the ~124 M config
        local name=$1; shift
        case " ${WB_LEVERS:-all} " in *" $name "*|" all ") ;; *) return;; esac
        echo "-- $name"
        timeout ${WB_LEVER_TIMEOUT:-240} $PY bench/throughput.py gpu-8gb --steps ${WB_STEPS:-40} --set $G124 "$@" \
            || echo "   $name: failed or timed out"
    }
    lever host-check hardware.nonfinite_check=host           # the check as it was: one host sync per step
    lever device-check                                        # the default now
    lever qk-norm model.qk_norm=true                          # the shipped presets' recipe since 2026-11-23
    case " ${WB_LEVERS:-all} " in *" gpu-8gb-defaults "*|" all ")
        echo "-- gpu-8gb-defaults"; $PY bench/throughput.py gpu-8gb --steps ${WB_STEPS:-40} ;; esac
    lever cudnn-attention hardware.attention_kernel=cudnn
    lever fused-loss hardware.chunked_loss=true
    lever cuda-graphs hardware.compile_kernels=reduce-overhead
    lever batch-48 train.batch_size=48
    lever max-autotune hardware.compile_kernels=max-autotune-no-cudagraphs
    exit 0
fi
TESTS_RC=0
if [ "${1:-}" != numbers ]; then
if [ -z "${WB_SKIP_TESTS:-}" ]; then  # WB_SKIP_TESTS=1: the quick mode's resume check alone (tests run apart)
echo "== GPU tests (pytest -m gpu): skipped ones say why"
$PY -m pytest -m gpu -q -rs -p no:cacheprovider tests/train/test_gpu.py
TESTS_RC=$?
[ "$TESTS_RC" = 0 ] || echo "GPU TESTS FAILED (exit $TESTS_RC)"
fi
[ "${1:-}" = tests ] && exit $TESTS_RC
T="model.dim=64 model.n_layers=2 model.n_heads=4 model.n_kv_heads=2 model.seq_len=64 model.vocab_size=512
   train.batch_size=8 train.warmup_iters=2 train.eval_iters=2 train.log_interval=1 data.builtin_mb=0.3
   data.tokenizer_sample_mb=0.3 train.max_iters=30 train.lr_decay_iters=30 train.ckpt_interval=10
   train.eval_interval=10 model.dropout=0.1 hardware.device=cuda"
# Per-block compile (activation checkpointing on), as gpu-8gb trains.
T="$T hardware.compile=true hardware.activation_checkpointing=true hardware.deterministic=true ${WB_RESUME_SET:-}"
echo "== tiny CUDA run (auto precision, per-block compile, deterministic), straight vs killed (kill -9) at 15 + resumed"
echo "   overrides: $T"
$PY -m workbench train cpu-small --name straight --runs-dir $R --set $T 2>&1 | grep -E "run straight|compile|finished|error" | cut -c1-220
# a second straight run: the same steps twice in a row, to tell a resume's difference from a run's own
$PY -m workbench train cpu-small --name again --runs-dir $R --set $T >/dev/null 2>&1
WORKBENCH_TEST_KILL_AT_STEP=15 $PY -m workbench train cpu-small --name killed --runs-dir $R --set $T >/dev/null 2>&1
$PY -m workbench resume killed --runs-dir $R 2>&1 | grep -E "resumed|finished|error"
$PY - <<'PYEOF'
import json
def losses(p):
    out = {}
    for line in open(p):
        r = json.loads(line)
        if r["kind"] == "train": out[r["step"]] = r["loss"]
    return out
a, b = losses("/tmp/wbruns/straight/metrics.jsonl"), losses("/tmp/wbruns/killed/metrics.jsonl")
c = losses("/tmp/wbruns/again/metrics.jsonl")
for what, other in (("resume", b), ("the same run again", c)):
    diff = max(abs(a[s] - other[s]) for s in a)
    same = sum(a[s] == other[s] for s in a)
    first = min((s for s in a if a[s] != other[s]), default=None)
    print(f"CUDA {what}: {same}/{len(a)} steps bitwise equal, first different step {first}, "
          f"max |loss diff| = {diff:.3g}")
ev = [json.loads(l) for l in open("/tmp/wbruns/straight/metrics.jsonl") if '"compile_done"' in l]
print("compile_done event:", ev[:1])
PYEOF
[ -n "${WB_SKIP_FIT:-}" ] && exit $TESTS_RC
echo "== fit driven into a real CUDA out-of-memory error (a ~0.8 B model without activation checkpointing, batch 48)"
$PY -m workbench fit gpu-8gb --out oom-fit --force --runs-dir $R --set model.dim=1536 model.n_layers=24 \
    model.n_heads=12 model.n_kv_heads=12 model.ffn_hidden=4096 hardware.activation_checkpointing=false \
    hardware.chunked_loss=false train.batch_size=48 2>&1 | tail -25
echo "fit exit: ${PIPESTATUS[0]}"
fi
[ "${1:-}" = quick ] && exit $TESTS_RC
if [ "${1:-}" = savers ]; then  # 8-bit AdamW states against fp32 on the ~124 M config: peak memory, tokens/s
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/wbinductor}
    $PY bench/savers.py --steps 30 --states fp32,8bit,offload --set $G124 hardware.device=cuda hardware.compile=true \
        model.vocab_size=32768
    exit $TESTS_RC
fi
if [ "${1:-}" = profile ]; then  # where the ~124 M step's time goes, and two model changes timed beside it
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/wbinductor}
    $PY bench/profile_step.py gpu-8gb --set $G124 --variant fused-proj --variant bf16-rope
    echo "== peak memory of the compiled ~124 M config at batch 16 (batch 32 is in the mfu mode)"
    $PY bench/throughput.py gpu-8gb --steps 20 --set $G124 train.batch_size=16
    exit $TESTS_RC
fi
echo "== throughput (bench/throughput.py; the presets' recipe, QK-norm on, unless a line says qk_norm=false)"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/wbinductor}
S=${WB_STEPS:-60}
$PY bench/throughput.py gpu-8gb --steps $S
$PY bench/throughput.py gpu-8gb --steps $S --set hardware.activation_checkpointing=false hardware.chunked_loss=false
$PY bench/throughput.py gpu-8gb --steps $S --set $G124 model.qk_norm=true
$PY bench/throughput.py gpu-8gb --steps $S --set $G124 model.qk_norm=true hardware.compile=false
$PY bench/throughput.py gpu-8gb --steps $S --set $G124   # qk_norm=false: against the README's earlier H100 rows
echo "== estimates"
$PY -m workbench estimate gpu-8gb --device cuda 2>&1 | head -30
$PY -m workbench estimate gpu-8gb --device cuda --set hardware.activation_checkpointing=false hardware.chunked_loss=false 2>&1 | grep -iE "total|activ|fits"
$PY -m workbench estimate gpu-8gb --device cuda --set $G124 model.qk_norm=true 2>&1 | grep -iE "total|activ|fits|param"
$PY -m workbench estimate gpu-8gb --device cuda --set $G124 model.qk_norm=true hardware.compile=false 2>&1 | grep -iE "total|activ|fits|param"
exit $TESTS_RC
