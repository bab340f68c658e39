#!/usr/bin/env bash
# The fp16 stability demonstration of adaptive gradient clipping (docs/training.md): a small GPT
# (d_model 512, 6 layers, 8 heads, 1024 bytes per sequence, 8 sequences per step) trained in fp16
# with dynamic loss scaling on the repository's own text (its docs and sources as bytes), at an
# aggressive learning rate (2e-3, 20 warmup steps) and at that rate raised 30% (2.6e-3), with
# adaptive clipping; and, for comparison, the raised rate without clipping. The adaptive run at
# the raised rate must log no NaN or infinite loss (scripts/check_train_log.py); the other two
# rows are reported. About a minute on an H200 (300 steps of 8K tokens each, three runs).
#
#   scripts/train_fp16_stability.sh [SCIATTN] [OUT] [STEPS]
#
# SCIATTN defaults to .carry/train/sciattn, then build/gpu/tools/sciattn; OUT to $OUT or results;
# STEPS to 300. Exits non-zero when the adaptive run at the raised rate has a non-finite loss.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
sciattn=${1:-}
if [ -z "$sciattn" ]; then
  for candidate in .carry/train/sciattn build/gpu/tools/sciattn; do
    [ -x "$candidate" ] && sciattn=$candidate && break
  done
fi
[ -x "$sciattn" ] || { echo "no sciattn program (give its path)"; exit 2; }
out=${2:-${OUT:-results}}
steps=${3:-300}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The data: every text file of the repository's docs and sources, one document each, as bytes.
mapfile -t files < <(find docs src include tools -type f \( -name '*.md' -o -name '*.cpp' \
  -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
"$sciattn" data --text "${files[@]}" --shuffle --seed 1 --out "$work/text.tok" | tail -1

cat > "$work/gpt.json" <<'JSON'
{"vocab_size": 257, "d_model": 512, "n_layers": 6, "n_heads": 8, "sequence_length": 1024,
 "positions": "rotary", "seed": 1}
JSON
# config LR CLIPPING: the DeepSpeed config of one run.
config() {
  cat <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8,
 "optimizer": {"type": "AdamW", "params": {"lr": $1, "betas": [0.9, 0.95], "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": $1,
               "warmup_num_steps": 20, "warmup_type": "linear", "total_num_steps": $steps}},
 "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 100,
          "hysteresis": 2, "min_loss_scale": 1},
 "gradient_clipping": $2,
 "steps_per_print": 50}
JSON
}
adaptive='{"enabled": true, "type": "adaptive", "threshold": 1.0, "history_window": 100, "adjustment_factor": 0.2}'
status=0
# name LR CLIPPING MUST_BE_FINITE
run() {
  config "$2" "$3" > "$work/$1.json"
  echo "== $1: lr $2, gradient_clipping $3"
  "$sciattn" train --config "$work/$1.json" --model "$work/gpt.json" --data "$work/text.tok" \
    --steps "$steps" --log "$out/fp16_$1.jsonl" --plot "$out/fp16_$1.png" > "$out/fp16_$1.log" 2>&1
  local rc=$?
  tail -3 "$out/fp16_$1.log"
  if ! scripts/check_train_log.py "$out/fp16_$1.jsonl" --name "$1"; then
    [ "$4" = yes ] && status=1
  fi
  [ $rc -eq 0 ] || { [ "$4" = yes ] && status=1; }
}
run base_adaptive 2e-3 "$adaptive" no
run raised_adaptive 2.6e-3 "$adaptive" yes
run raised_unclipped 2.6e-3 0 no
exit $status
