#!/usr/bin/env bash
# The GPU checks (issue 10 item 7, issue 14 item 1), in one run of about 8 minutes on one GPU:
#
#   bash scripts/gpu_check.sh OUT_DIR
#
# 1. `quickdraft models stepcost qwen2.5-coder-7b --random-weights --device cuda`, without and
#    with `--compile on` (static KV cache, torch.compile'd steps with CUDA graphs);
# 2. greedy identity with `ar` in bf16 on the tiny real-shaped pair, on the growing cache, the
#    static cache and the compiled static cache (python -m quickdraft.models.identity_report);
# 3. the same on the 7B-shaped random model, a few prompts.
#
# It needs torch and transformers only: nothing it imports needs pygls, lsprotocol, cattrs,
# tree-sitter, gguf or llama.cpp (QD_BLOCK_IMPORTS=1 proves it by refusing those imports).
# Each step has its own time limit and leaves its output in OUT_DIR whether or not it ends.
# A dry run on a CPU (smaller preset, 2 prompts, every limit times 6):
#   QD_DEVICE=cpu QD_PRESET=qwen2.5-coder-1.5b QD_QUICK=1 QD_TIME_SCALE=6 QD_BLOCK_IMPORTS=1 \
#     bash scripts/gpu_check.sh out
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:-gpu-out}" && cd "${1:-gpu-out}" && pwd)
device=${QD_DEVICE:-cuda}
preset=${QD_PRESET:-qwen2.5-coder-7b}
quick=${QD_QUICK:-0}
scale=${QD_TIME_SCALE:-1}
export PYTHONPATH="$PWD/server:$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python=(python3)
if [ "${QD_BLOCK_IMPORTS:-0}" = 1 ]; then python=(python3 -m gpu_check_guard); fi

step() {  # step NAME SECONDS COMMAND...: output in OUT/NAME.txt, exit status in OUT/summary.txt
  local name=$1 limit=$(($2 * scale)) started=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  local status=$?
  echo "$name: exit $status after $((SECONDS - started)) s" | tee -a "$out/summary.txt"
}

{
  date -u
  nvidia-smi 2>/dev/null || echo "no nvidia-smi"
  "${python[@]}" -c 'import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__)
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")'
} >"$out/env.txt" 2>&1

prompts=16 big_prompts=3 tokens=24 lengths=adaptive,2,4
if [ "$quick" = 1 ]; then prompts=2 big_prompts=1 tokens=8 lengths=adaptive,4; fi

stepcost=("${python[@]}" -m quickdraft.cli models stepcost "$preset" --random-weights
  --device "$device" --dtype bfloat16 --json)
step stepcost-eager 150 "${stepcost[@]}" --compile off
step stepcost-compiled 270 "${stepcost[@]}" --compile on

identity=("${python[@]}" -m quickdraft.models.identity_report --device "$device"
  --max-new-tokens "$tokens" --draft-lengths "$lengths")
# The two identity runs share the GPU (no timings are taken from them).
step identity-tiny 210 "${identity[@]}" --model tiny --prompts "$prompts" \
  --paths bfloat16,bfloat16+static,bfloat16+compiled,float32 --json "$out/identity-tiny.json" &
step identity-big 210 "${identity[@]}" --model "random:$preset" --prompts "$big_prompts" \
  --paths bfloat16 --static-cache-tokens 2048 --json "$out/identity-big.json" &
wait
cat "$out/summary.txt"
