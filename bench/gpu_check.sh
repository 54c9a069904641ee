#!/usr/bin/env bash
# The CUDA checks we run on a lent GPU (device tool): first the GPU tests (tests/test_gpu.py, `pytest -m gpu`:
# precision auto, bf16 / fp16 + GradScaler / fp32, TF32, the fused loss on CUDA, --nproc 1 and NCCL), then a
# bf16 + compile run, kill -9 / resume agreement on CUDA, throughput and MFU for gpu-8gb and a ~124 M-parameter
# config, estimated vs measured peak memory. Exits non-zero when a GPU test fails.
# Usage: bash bench/gpu_check.sh [quick|tests]   (tests: the GPU tests alone)
set -u
cd "$(dirname "$0")/.."
export WORKBENCH_CACHE_DIR=${WORKBENCH_CACHE_DIR:-/tmp/wbcache} PYTHONUNBUFFERED=1
PY=${PY:-python3}
R=/tmp/wbruns; rm -rf $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
echo "== GPU tests (pytest -m gpu): skipped ones say why"
$PY -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_gpu.py
TESTS_RC=$?
[ "$TESTS_RC" = 0 ] || echo "GPU TESTS FAILED (exit $TESTS_RC)"
[ "${1:-}" = tests ] && exit $TESTS_RC
T="model.dim=64 model.n_layers=2 model.n_heads=4 model.n_kv_heads=2 model.seq_len=64 model.vocab_size=512
   train.batch_size=8 train.warmup_iters=2 train.eval_iters=2 train.log_interval=1 data.builtin_mb=0.3
   data.tokenizer_sample_mb=0.3 train.max_iters=30 train.lr_decay_iters=30 train.ckpt_interval=10
   train.eval_interval=10 model.dropout=0.1 hardware.device=cuda"
echo "== tiny CUDA run (auto precision, compile on), straight vs killed at 15 + resumed"
$PY -m workbench train cpu-small --name straight --runs-dir $R --set $T hardware.compile=true 2>&1 | grep -E "run straight|compile|finished|error" | cut -c1-220
WORKBENCH_TEST_KILL_AT_STEP=15 $PY -m workbench train cpu-small --name killed --runs-dir $R --set $T hardware.compile=true >/dev/null 2>&1
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
diff = max(abs(a[s] - b[s]) for s in a)
same = sum(a[s] == b[s] for s in a)
print(f"CUDA resume: {same}/{len(a)} steps bitwise equal, max |loss diff| = {diff:.3g}")
ev = [json.loads(l) for l in open("/tmp/wbruns/straight/metrics.jsonl") if '"compile_done"' in l]
print("compile_done event:", ev[:1])
PYEOF
[ "${1:-}" = quick ] && exit $TESTS_RC
echo "== throughput (bench/throughput.py)"
$PY bench/throughput.py gpu-8gb --steps 60
$PY bench/throughput.py gpu-8gb --steps 60 --set hardware.activation_checkpointing=false
G124="model.vocab_size=32768 model.dim=768 model.n_layers=12 model.n_heads=12 model.n_kv_heads=12 model.ffn_hidden=2560
      model.seq_len=1024 model.dropout=0.0 train.batch_size=32 hardware.activation_checkpointing=false
      hardware.chunked_loss=false data.builtin_mb=24"
$PY bench/throughput.py gpu-8gb --steps 60 --set $G124
$PY bench/throughput.py gpu-8gb --steps 60 --set $G124 hardware.compile=false
echo "== estimates"
$PY -m workbench estimate gpu-8gb --device cuda 2>&1 | head -30
$PY -m workbench estimate gpu-8gb --device cuda --set hardware.activation_checkpointing=false 2>&1 | grep -iE "total|activ|fits"
$PY -m workbench estimate gpu-8gb --device cuda --set $G124 2>&1 | grep -iE "total|activ|fits|param"
exit $TESTS_RC
