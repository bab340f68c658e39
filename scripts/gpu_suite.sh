#!/usr/bin/env bash
# Runs the GPU checks and benchmarks on the GPU machine from prebuilt binaries (built here with
# the `gpu` preset and carried in .carry/, because build trees hold absolute paths;
# scripts/pack_gpu_binaries.sh builds and packs all of them into .carry/bins.tar.xz):
#   the gpu-labelled test programs, compute-sanitizer memcheck and racecheck on small cases, the
#   Google Benchmark of the kernels, and the peer comparisons (bench/compare/evoformer.py and
#   bench/compare/block_sparse.py).
# Usage on the GPU machine:
#   scripts/gpu_suite.sh [tests|sanitize|cli|profile|stalls|sass|bench|compare|sparse|sparse_compare|
#                         sparse_sanitize|sparse_profile|python|train|train_sanitize|train_bench|
#                         train_step|train_long|train_compare|train_compare_long|
#                         portable|portable_sanitize|portable_bench|sm80|ab_sweep|all]...
# `ab_sweep` times two builds of the C API library in one call, alternating, for a before / after
# claim (the machines are shared, so absolute times move between calls): bench/compare/
# evoformer_sweep.py without peers for each of AB_LIBS (default ".carry/base .carry/new", folders
# that hold a libsciattn_capi.so each), AB_ROUNDS rounds (default 2), head dims AB_DIMS and
# triangle lengths AB_LENGTHS (defaults below); each sweep's JSON and summary under
# $out/ab/<folder name><round>/. Not part of `all`.
# `portable` runs the three attention suites on the mma.sync kernels that sm_80, 86 and 89 run
# (SCIATTN_CUDA_KERNELS=portable, then portable-99k, which also holds every launch to sm_86's and
# sm_89's 99 KiB of shared memory), then memcheck and racecheck on their small cases (those alone:
# `portable_sanitize`);
# `portable_bench` both families' Google Benchmarks with SCIATTN_CUDA_KERNELS=auto, portable and
# portable-99k in turn (one log); `sm80` the test programs of the gpu-sm80 build (.carry/sm80/,
# `pack_gpu_binaries.sh --sm80`), whose kernels the driver compiles from compute_80 PTX. The
# four are not part of `all`.
# `python` builds the PyTorch extension there (scripts/build_torch_ext.sh; carry .carry/deps made
# here by `scripts/build_torch_ext.sh --carry-deps`) and runs tests/python on CUDA tensors.
# `sparse` runs the block-sparse GPU test programs (test_sparse_attention_cuda,
# test_block_sparse_ops_cuda, whichever are in .carry) and `sciattn sparse --device cuda`;
# `sparse_compare` runs bench/compare/block_sparse.py through the Python package (built with
# --cuda first when the one in bindings/torch/python has no CUDA kernels).
# `train`, `train_sanitize` and `train_bench` run the trainer's CUDA back end: test_train_cuda (every
# layer against the CPU back end, the optimizer kernels) and test_train_step_cuda (whole steps of a
# tiny GPT against the CPU, the memory techniques on and off, the offloaded optimizer, resume),
# compute-sanitizer memcheck and racecheck on small cases of both, and bench_train_cuda (the
# layers at the 1.3B GPT's sizes). `train_step` runs `sciattn train` on the GPU: the fp16
# stability demonstration (scripts/train_fp16_stability.sh, about a minute), then one step of the
# 1.3B GPT at 32,768 tokens with every technique and --memory (the ledger, GPU and host), with the
# plan of that configuration on this machine first. `train_long` shows the memory holding at long
# lengths: the 1.3B configuration's plan, a step of the 1.3B GPT at 262,144 tokens, and a step of
# a 2-layer model of the same width at 1,048,576 tokens (the per-layer working set of the full
# model at 1M tokens; the other 22 layers add model states and host checkpoints, which the plan
# counts). `train_compare` runs bench/compare/gpt_long_sequence.py (PyTorch recipes against
# sciattn train) at 32,768 tokens, every default recipe (about 6 minutes), and `train_compare_long`
# at 131,072 tokens, the tiled recipe with and without the attention outputs kept (about 4
# minutes); TRAIN_COMPARE_ARGS replaces
# the arguments of the first. The last four are not part of `all`.
# They need, in .carry/train.tar.xz (or unpacked in .carry/), made on a CPU machine with:
#   cmake --preset gpu -DBLAS_LIBRARIES=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.a
#   cmake --build build/gpu -j2 --target test_train_cuda test_train_step_cuda bench_train_cuda \
#     sciattn_cli
#   mkdir -p .carry/train && cp build/gpu/tests/cuda/test_train_cuda \
#     build/gpu/tests/cuda/test_train_step_cuda build/gpu/bench/bench_train_cuda \
#     build/gpu/tools/sciattn .carry/train/ && \
#     cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian .carry/train/ &&
#   tar cJf .carry/train.tar.xz -C .carry train && rm -r .carry/train
# (Linked against the shared OpenBLAS instead, also carry libopenblas.so.0, libgfortran.so.5 and
# libquadmath.so.0 from /usr/lib/x86_64-linux-gnu.)
# The trainer links OpenBLAS (Debian 12's libopenblas0-openmp: libopenblas.so.0, which needs
# libgfortran.so.5 and libquadmath.so.0) and the Google Benchmark of Debian (libbenchmark.so.1debian);
# the GPU machine has none of them, so they travel with the binaries. cuBLASLt (libcublasLt.so.13)
# comes from the GPU machine's CUDA toolkit (its lib64 folder is put on LD_LIBRARY_PATH below), and
# libgomp.so.1 from its GCC. (A gpu build configured with
# -DBLAS_LIBRARIES=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.a links OpenBLAS
# statically, docs/training.md; then only libbenchmark.so.1debian has to travel.)
# Environment: BENCH_FILTER, BENCH_MIN_TIME (Google Benchmark), PROFILE_FILTER (profile, stalls:
# the Evoformer bench row, default triangle 384), COMPARE_DTYPES (peer comparison),
# SPARSE_BENCH_FILTER (bench_sparse_attention_cuda; default: D 64, L 4096 and 16384),
# TRAIN_BENCH_FILTER (bench_train_cuda; default: every row),
# SPARSE_COMPARE_ARGS (block_sparse.py's options; default --quick).
# Results go to $OUT (or results/ when OUT is unset).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-results}
mkdir -p "$out"
bin=.carry
# Shared libraries the carried binaries need that the GPU machine lacks (Google Benchmark).
export LD_LIBRARY_PATH="$PWD/$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The trainer's programs: their shared libraries (OpenBLAS and its Fortran runtime) beside them, and
# the toolkit's cuBLASLt.
cuda_root=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
export LD_LIBRARY_PATH="$PWD/$bin/train:$LD_LIBRARY_PATH:$cuda_root/lib64:$cuda_root/targets/x86_64-linux/lib:/usr/local/cuda/lib64"
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(all)
want() { for w in "${what[@]}"; do [ "$w" = "$1" ] || [ "$w" = all ] && return 0; done; return 1; }
status=0

# The binaries may travel as one xz archive (the carry limit is 64 MiB; each binary holds every
# kernel instantiation).
if [ -f "$bin/bins.tar.xz" ]; then tar xJf "$bin/bins.tar.xz" -C "$bin"; fi
nvidia-smi -L || true
# compute-sanitizer TOOL PROGRAM FILTER [OPTION...]: runs the gtest program's FILTER subset under
# the tool (with the sanitizer's OPTIONs), appends the whole output to $out/sanitizers.log (one
# file for every run: the device tool brings back only a few files) and prints its summary; a
# finding fails the suite.
sanitize() {
  echo "== compute-sanitizer --tool $1 $2"
  local log
  log=$(mktemp)
  compute-sanitizer --tool "$1" --error-exitcode 1 "${@:4}" "$bin/$2" --gtest_brief=1 \
    --gtest_filter="$3" > "$log" 2>&1
  local rc=$?
  { echo "== compute-sanitizer --tool $1 $2 --gtest_filter=$3 (exit $rc)"; cat "$log"; } \
    >> "$out/sanitizers.log"
  tail -3 "$log"
  rm -f "$log"
  [ $rc -eq 0 ] || status=1
}
if want tests; then
  echo "== gpu tests"
  if [ -x "$bin/test_cuda_device" ]; then "$bin/test_cuda_device" --gtest_brief=1 || status=1; fi
  "$bin/test_evoformer_cuda" --gtest_brief=1 2>&1 | tee "$out/test_evoformer_cuda.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want sanitize; then
  # Small shapes of every instantiation family (both dtypes, head dims 16..128, both directions),
  # the L = 300 cases (N = 1), whose whole tiles take the lean copies, every bias-type
  # instantiation, and the fused backward's small cases (three query-tile buffers).
  filter='Cases/EvoformerCuda.*L17*:Cases/EvoformerCuda.*L1H*:EvoformerCudaEdges.FullyMasked*:Cases/EvoformerCuda.*L300*'
  filter+=':EvoformerCudaEdges.EveryBiasTypeInstantiation:Fused/*L150*:Fused/*L200*:Fused/*L40H*'
  for tool in memcheck racecheck; do
    sanitize "$tool" test_evoformer_cuda "$filter"
  done
fi
if want cli && [ -x "$bin/sciattn" ]; then
  # The command-line program on the GPU: the demo (bf16 kernels against the CPU reference) and
  # one fp32 run, each checked against the naive reference.
  echo "== sciattn demo (GPU)"
  "$bin/sciattn" demo 2>&1 | tee "$out/demo.log" | tail -30
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  "$bin/sciattn" evoformer --device cuda --dtype f32 --n 16 --len 96 --backward 2>&1 | tail -4
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want profile && [ -x "$bin/bench_evoformer_cuda" ]; then
  # Per-kernel device time of one forward + backward (triangle [1,384,384,4,32], bf16, unless
  # PROFILE_FILTER names another bench_evoformer_cuda row).
  echo "== kernel durations (ncu)"
  ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 10 \
    "$bin/bench_evoformer_cuda" \
    --benchmark_filter="${PROFILE_FILTER:-N:384/L:384/H:4/D:32/bias2:1/dtype:2/bwd:1}" \
    --benchmark_min_time=0.001 > "$out/ncu_durations.log" 2>&1
  grep -E "evoformer|gpu__time_duration" "$out/ncu_durations.log" | paste - - | \
    sed -E 's/ +/ /g; s/\(([0-9]+, ?)+[0-9]+\)x\([0-9, ]+\)//g' | cut -c1-160
fi
if want stalls && [ -x "$bin/bench_evoformer_cuda" ]; then
  # Why each kernel of one forward + backward waits (triangle 384, bf16): occupancy, issue-slot
  # use and the warp-stall breakdown, for the perf record.
  echo "== warp states (ncu)"
  ncu --clock-control none --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --launch-count 5 \
    "$bin/bench_evoformer_cuda" \
    --benchmark_filter="${PROFILE_FILTER:-N:384/L:384/H:4/D:32/bias2:1/dtype:2/bwd:1}" \
    --benchmark_min_time=0.001 > "$out/ncu_stalls.log" 2>&1
  grep -E "^  [a-z_]+.*evoformer|Achieved Occupancy|Issue Slots Busy|No Eligible|Registers Per|Stall|Warp Cycles Per Issued|Executed Ipc A|Theoretical Occ" "$out/ncu_stalls.log" | cut -c1-120 | head -80
fi
if [[ " ${what[*]} " == *" sass "* ]] && [ -x "$bin/bench_evoformer_cuda" ]; then
  # Only when named (not part of `all`). Executed count of every SASS instruction of each kernel
  # of one forward + backward (triangle 384, bf16, unless PROFILE_FILTER names another row):
  # which instructions of the generic code actually run, per tile. The per-kernel
  # CSVs (source page) and the per-opcode summary come back xz-compressed.
  echo "== executed SASS (ncu source counters)"
  ncu --clock-control none --section SourceCounters --section InstructionStats -k regex:evoformer \
    --launch-count 6 -f -o "$out/sass" "$bin/bench_evoformer_cuda" \
    --benchmark_filter="${PROFILE_FILTER:-N:384/L:384/H:4/D:32/bias2:1/dtype:2/bwd:1}" \
    --benchmark_min_time=0.001 \
    > "$out/ncu_sass_run.log" 2>&1 || status=1
  ncu -i "$out/sass.ncu-rep" --page source --csv --print-source sass > "$out/sass_source.csv" \
    2> "$out/sass_source.err" || status=1
  ncu -i "$out/sass.ncu-rep" --page details --print-details all > "$out/sass_details.log" 2>&1
  xz -T4 -6 "$out/sass_source.csv" "$out/sass_details.log"
  rm -f "$out/sass.ncu-rep"
  ls -la "$out"/sass*
fi
if want bench && [ -x "$bin/bench_evoformer_cuda" ]; then
  echo "== Google Benchmark"
  "$bin/bench_evoformer_cuda" --benchmark_filter="${BENCH_FILTER:-.}" --benchmark_min_time="${BENCH_MIN_TIME:-0.2}" \
    --benchmark_out="$out/bench_evoformer_cuda.json" --benchmark_out_format=json > "$out/bench.log" 2>&1
  grep -E "^BM_" "$out/bench.log" | sed -E 's/min_time:[0-9.]+\/manual_time//' | cut -c1-150
fi
if want bench && [ -x "$bin/bench_sparse_attention_cuda" ]; then
  echo "== Google Benchmark (block-sparse attention)"
  "$bin/bench_sparse_attention_cuda" \
    --benchmark_filter="${SPARSE_BENCH_FILTER:-L:(4096|16384)/block:[0-9]+/D:64/}" \
    --benchmark_min_time="${BENCH_MIN_TIME:-0.2}" \
    --benchmark_out="$out/bench_sparse_attention_cuda.json" --benchmark_out_format=json \
    > "$out/bench_sparse.log" 2>&1
  grep -E "^BM_" "$out/bench_sparse.log" | sed -E 's/min_time:[0-9.]+\/manual_time//' | cut -c1-170
fi
# The Python package with its CUDA kernels, built here unless the checkout's already has them
# (the Evoformer comparison's package columns and the block-sparse comparison use it).
package_with_cuda() {
  PYTHONPATH=bindings/torch/python python3 -c \
    'import sciattn, sys; sys.exit(0 if sciattn.built_with_cuda() else 1)' 2>/dev/null && return 0
  scripts/build_torch_ext.sh --cuda --python python3 > "$out/torch_build.log" 2>&1 \
    || { tail -30 "$out/torch_build.log"; return 1; }
}
if want compare; then
  echo "== peer comparison"
  package_with_cuda || echo "(no package columns: the extension did not build)"
  PYTHONUNBUFFERED=1 PYTHONPATH=bindings/torch/python python3 bench/compare/evoformer.py \
    --lib "$bin/libsciattn_capi.so" --out "$out" --dtypes "${COMPARE_DTYPES:-bfloat16,float16}" \
    2>&1 | tee "$out/compare.log" | tail -40
fi
if [[ " ${what[*]} " == *" ab_sweep "* ]]; then
  echo "== A/B sweep"
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for lib in ${AB_LIBS:-.carry/base .carry/new}; do
      dst="$(cd "$out" && pwd)/ab/$(basename "$lib")$round"
      so="$(cd "$lib" && pwd)/libsciattn_capi.so"
      mkdir -p "$dst"
      (cd bench/compare && python3 evoformer_sweep.py --lib "$so" \
        --out "$dst" --peers "" --lengths "${AB_LENGTHS:-256,300,384,768}" \
        --dims "${AB_DIMS:-20,32,33,40,48,52,64,100,116,120,128}" > "$dst/summary.txt" 2>&1)
      [ $? -eq 0 ] || status=1
      echo "$(basename "$lib") round $round:"; tail -4 "$dst/summary.txt"
    done
  done
fi
if want sparse; then
  # Block-sparse kernels against the CPU reference (the test programs skip nothing on a GPU).
  echo "== block-sparse gpu tests"
  for t in test_sparse_attention_cuda test_block_sparse_ops_cuda; do
    if [ -x "$bin/$t" ]; then
      "$bin/$t" --gtest_brief=1 2>&1 | tee "$out/$t.log" | tail -30
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    else
      echo "($t not in $bin; build it here with the gpu preset and carry it)"
    fi
  done
  if [ -x "$bin/sciattn" ]; then
    for algorithm in fused composite; do
      echo "== sciattn sparse --device cuda --algorithm $algorithm"
      "$bin/sciattn" sparse --device cuda --algorithm "$algorithm" --mode bigbird --heads 4 \
        --block 64 --len 1000 --dim 64 --dtype bf16 --backward 2>&1 | tail -4
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
  fi
fi
if want sparse_sanitize; then
  # Small shapes of the block-sparse kernels (fused and ops; every dtype, head dim, block size).
  for t in test_sparse_attention_cuda test_block_sparse_ops_cuda; do
    [ -x "$bin/$t" ] || continue
    for tool in memcheck racecheck; do
      sanitize "$tool" "$t" '*Small*'
    done
  done
fi
if want sparse_profile && [ -x "$bin/bench_sparse_attention_cuda" ]; then
  # Per-kernel time, occupancy, issue use and warp stalls of one fused forward + backward
  # (BigBird, 65,536 tokens, block 64, D 64, bf16).
  echo "== block-sparse kernels (ncu)"
  ncu --clock-control none --section SpeedOfLight --section Occupancy --section SchedulerStats \
    --section WarpStateStats --kernel-name regex:sparse_attention \
    --launch-skip "${SPARSE_PROFILE_SKIP:-24}" --launch-count 8 "$bin/bench_sparse_attention_cuda" \
    --benchmark_filter="${SPARSE_PROFILE_FILTER:-layout:0/L:65536/block:64/D:64/alg:0/bwd:1}" \
    --benchmark_min_time=0.001 > "$out/ncu_sparse.log" 2>&1
  grep -E "^  [a-z_]+.*sparse|Duration|Achieved Occupancy|Theoretical Occ|Issue Slots Busy|No Eligible|Registers Per|Stall [A-Z]|Warp Cycles Per Issued|Compute \(SM\) Th|Memory Th|Shared Memory Config|Dynamic Shared" \
    "$out/ncu_sparse.log" | cut -c1-120 | head -120
fi
if want sparse_compare; then
  echo "== block-sparse peer comparison"
  package_with_cuda || status=1
  # shellcheck disable=SC2086  # SPARSE_COMPARE_ARGS is a list of options
  PYTHONUNBUFFERED=1 PYTHONPATH=bindings/torch/python python3 bench/compare/block_sparse.py \
    --out "$out" ${SPARSE_COMPARE_ARGS:---quick} 2>&1 | tee "$out/sparse_compare.log" | tail -60
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
# Parts run only when named (long, or for the record).
named() { for w in "${what[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
if [ -f "$bin/train.tar.xz" ] && { want train || want train_sanitize || want train_bench ||
                                   named train_step || named train_long ||
                                   named train_compare || named train_compare_long; }; then
  tar xJf "$bin/train.tar.xz" -C "$bin"
fi
train_bin=$bin/train
if want train; then
  # test_train_nccl: one rank on one GPU, two and four ranks where the machine has the GPUs.
  for t in test_train_cuda test_train_step_cuda test_train_nccl; do
    [ -x "$train_bin/$t" ] || { echo "($t not in $train_bin)"; continue; }
    echo "== trainer: $t"
    ldd "$train_bin/$t" | grep "not found"  # a missing shared library shows here
    "$train_bin/$t" --gtest_brief=1 2>&1 | tee "$out/$t.log" | tail -60
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi
if want train_sanitize && [ -x "$train_bin/test_train_cuda" ]; then
  # Every case of test_train_cuda is small (74 tokens, C 20 or 64, V 53, 100K AdamW elements);
  # of test_train_step_cuda, a bf16 step with every memory technique (offloaded checkpoints:
  # the copy streams and events), the fp16 Trainer with a skipped step and the sequence-parallel
  # cases (two ranks as threads on the GPU).
  for tool in memcheck racecheck; do
    sanitize "$tool" train/test_train_cuda '*'
    if [ -x "$train_bin/test_train_step_cuda" ]; then
      sanitize "$tool" train/test_train_step_cuda \
        'Train/TrainStepCuda.MemoryTechniquesAreBitwiseOnTheGpu/bf16:TrainTrainerCuda.Fp16*:*SequenceParallel*'
    fi
  done
  # The NCCL communicator (memcheck): NCCL's initialisation asks cudaFuncGetAttributes about
  # kernels of its own that have no image for this GPU and handles the error itself (16 such
  # calls with NCCL 2.28 on an H100); the sanitizer would report each one as an API error.
  if [ -x "$train_bin/test_train_nccl" ]; then
    sanitize memcheck train/test_train_nccl '*' --report-api-errors no
  fi
fi
# The 1.3B GPT of the trainer issue (d 2048, 24 layers, 16 heads, vocabulary 50,304), bf16, with
# sequence length $1 and $2 layers, into $3/gpt.json and ds.json; the token file $3/tokens.bin
# holds random tokens for 2 steps.
train_files() {
  local tokens=$1 layers=$2 dir=$3
  mkdir -p "$dir"
  echo "{\"vocab_size\": 50304, \"d_model\": 2048, \"n_layers\": $layers, \"n_heads\": 16,
    \"sequence_length\": $tokens, \"positions\": \"rotary\", \"seed\": 1}" > "$dir/gpt.json"
  echo '{"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
    "bf16": {"enabled": true}, "gradient_clipping": 1.0, "wall_clock_breakdown": true,
    "activation_checkpointing": {"cpu_checkpointing": true}}' > "$dir/ds.json"
  python3 - "$dir/tokens.bin" "$tokens" <<'PY'
import random, struct, sys
path, tokens = sys.argv[1], int(sys.argv[2])
count = 2 * tokens + 1
rng = random.Random(tokens)
with open(path, "wb") as f:
    header = b"SCIATOKN" + struct.pack("<IIQQQII", 1, 2, 50304, count, 1, 0xFFFFFFFF, 0)
    f.write(header + bytes(64 - len(header)))
    for start in range(0, count, 1 << 16):
        n = min(1 << 16, count - start)
        f.write(struct.pack(f"<{n}H", *[rng.randrange(50304) for _ in range(n)]))
PY
}
# One sciattn train run on the GPU: NAME TOKENS LAYERS STEPS TIMEOUT [flags...]; output in
# $out/train_NAME.log, the step log in $out/train_NAME.jsonl.
train_run() {
  local name=$1 tokens=$2 layers=$3 steps=$4 limit=$5
  shift 5
  local dir
  dir=$(mktemp -d)
  train_files "$tokens" "$layers" "$dir"
  echo "== sciattn train: $name ($tokens tokens, $layers layers, $steps step(s))"
  timeout "$limit" "$train_bin/sciattn" train --device cuda --config "$dir/ds.json" \
    --model "$dir/gpt.json" --data "$dir/tokens.bin" --steps "$steps" --no-shuffle \
    --mlp-tile-tokens 16384 --lm-head-tile-tokens 16384 --log "$out/train_$name.jsonl" "$@" \
    > "$out/train_$name.log" 2>&1
  local rc=$?
  grep -E "^sciattn train|^  |^step|peak|^cuda:|^cpu:|offloaded checkpoints|one layer|scratch|error" \
    "$out/train_$name.log" | cut -c1-200 | tail -40
  [ $rc -eq 0 ] || { echo "(exit $rc)"; status=1; }
  rm -rf "$dir"
}
if named train_step && [ -x "$train_bin/sciattn" ]; then
  echo "== fp16 stability: adaptive clipping at a learning rate raised 30%"
  timeout 300 scripts/train_fp16_stability.sh "$train_bin/sciattn" "$out" 300 || status=1
  dir=$(mktemp -d)
  train_files 32768 24 "$dir"
  echo "== the plan of the 1.3B GPT at 32,768 tokens on this machine"
  "$train_bin/sciattn" train --plan --device cuda --config "$dir/ds.json" --model "$dir/gpt.json" \
    --mlp-tile-tokens 16384 --lm-head-tile-tokens 16384 2>&1 | tee "$out/train_plan_32k.log" | tail -12
  rm -rf "$dir"
  train_run gpt13b_32k 32768 24 2 240 --memory
fi
if named train_long && [ -x "$train_bin/sciattn" ]; then
  dir=$(mktemp -d)
  train_files 1048576 24 "$dir"
  echo "== the plan of the 1.3B GPT at 1,048,576 tokens on this machine"
  "$train_bin/sciattn" train --plan --device cuda --config "$dir/ds.json" --model "$dir/gpt.json" \
    --mlp-tile-tokens 16384 --lm-head-tile-tokens 16384 2>&1 | tee "$out/train_plan_1m.log" | tail -32
  rm -rf "$dir"
  train_run gpt13b_256k 262144 24 1 300 --memory
  train_run layers2_1m 1048576 2 1 420 --memory
fi
if named train_compare && [ -x "$train_bin/sciattn" ]; then
  echo "== PyTorch GPT recipes against sciattn train"
  # shellcheck disable=SC2086  # a list of options
  PYTHONUNBUFFERED=1 python3 bench/compare/gpt_long_sequence.py --sciattn "$train_bin/sciattn" \
    --out "$out/compare" ${TRAIN_COMPARE_ARGS:---tokens 32768 --steps 2 --timeout 150} 2>&1 | \
    tee "$out/train_compare.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if named train_compare_long && [ -x "$train_bin/sciattn" ]; then
  echo "== PyTorch GPT recipes against sciattn train at 131,072 tokens"
  PYTHONUNBUFFERED=1 python3 bench/compare/gpt_long_sequence.py --sciattn "$train_bin/sciattn" \
    --out "$out/compare_128k" --tokens 131072 --recipes ckpt_tiles,ckpt_tiles_keep --steps 1 \
    --timeout 240 2>&1 | tee "$out/train_compare_128k.log" | tail -12
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want train_bench && [ -x "$train_bin/bench_train_cuda" ]; then
  echo "== Google Benchmark (trainer layers, 1.3B sizes)"
  "$train_bin/bench_train_cuda" --benchmark_filter="${TRAIN_BENCH_FILTER:-.}" \
    --benchmark_min_time="${BENCH_MIN_TIME:-0.2}" \
    --benchmark_out="$out/bench_train_cuda.json" --benchmark_out_format=json \
    > "$out/bench_train.log" 2>&1 || status=1
  grep -E "^BM_|ERROR|error" "$out/bench_train.log" | sed -E 's/\/manual_time//' | cut -c1-200
fi
# Runs a gtest program (PROGRAM, under $bin; the environment as set by the caller), appends its
# output to LOG under a "== PROGRAM" line and prints its own summary lines.
suite_into() {
  local log=$1 program=$2 one
  one=$(mktemp)
  "$bin/$program" --gtest_brief=1 > "$one" 2>&1 || status=1
  { echo "== $program"; cat "$one"; } >> "$log"
  grep -E "tests? from .* ran|PASSED|FAILED|SKIPPED" "$one" | tail -4
  rm -f "$one"
}
# The attention suites on the portable kernels (issue: GPUs other than Hopper); one log per mode.
attention_suites=(test_evoformer_cuda test_sparse_attention_cuda test_block_sparse_ops_cuda)
if named portable; then
  for mode in portable portable-99k; do
    echo "== SCIATTN_CUDA_KERNELS=$mode"
    for t in "${attention_suites[@]}"; do
      [ -x "$bin/$t" ] || { echo "($t not in $bin)"; continue; }
      echo "== $t"
      SCIATTN_CUDA_KERNELS=$mode suite_into "$out/$mode.log" "$t"
    done
  done
fi
if named portable || named portable_sanitize; then
  export SCIATTN_CUDA_KERNELS=portable
  for tool in memcheck racecheck; do
    sanitize "$tool" test_evoformer_cuda \
      'Cases/EvoformerCuda.*L17*:EvoformerCudaEdges.EveryBiasTypeInstantiation:*D33_*:*D48_*'
    sanitize "$tool" test_sparse_attention_cuda 'SparseAttentionCudaSmall.*:Small/*s8000[0-9]'
  done
  export SCIATTN_CUDA_KERNELS=portable-99k
  sanitize memcheck test_evoformer_cuda 'Cases/EvoformerCuda.*L17*:*D120_*:*D127_*'
  unset SCIATTN_CUDA_KERNELS
fi
if named portable_bench; then
  for mode in auto portable portable-99k; do
    echo "== Google Benchmark, SCIATTN_CUDA_KERNELS=$mode" | tee -a "$out/portable_bench.log"
    SCIATTN_CUDA_KERNELS=$mode "$bin/bench_evoformer_cuda" --benchmark_filter="${BENCH_FILTER:-.}" \
      --benchmark_min_time="${BENCH_MIN_TIME:-0.3}" >> "$out/portable_bench.log" 2>&1 || status=1
    SCIATTN_CUDA_KERNELS=$mode "$bin/bench_sparse_attention_cuda" \
      --benchmark_filter="${SPARSE_BENCH_FILTER:-L:(4096|16384)/block:[0-9]+/D:64/}" \
      --benchmark_min_time="${BENCH_MIN_TIME:-0.3}" >> "$out/portable_bench.log" 2>&1 || status=1
  done
  grep -E "^BM_|^==" "$out/portable_bench.log" | sed -E 's/\/manual_time//' | cut -c1-150
fi
if named sm80; then
  # The driver compiles the compute_80 PTX at the first launch of each kernel (cached).
  export CUDA_CACHE_MAXSIZE=4294967296
  for t in test_cuda_device "${attention_suites[@]}"; do
    [ -x "$bin/sm80/$t" ] || { echo "($t not in $bin/sm80)"; continue; }
    echo "== sm80/$t"
    suite_into "$out/sm80.log" "sm80/$t"
  done
fi
if want python; then
  echo "== Python package on CUDA tensors"
  if scripts/build_torch_ext.sh --cuda --python python3 > "$out/torch_build.log" 2>&1; then
    PYTHONPATH=bindings/torch/python SCIATTN_TEST_DEVICE=cuda python3 -m pytest tests/python -q \
      -p no:cacheprovider 2>&1 | tee "$out/pytest_cuda.log" | tail -15
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  else
    tail -30 "$out/torch_build.log"
    status=1
  fi
fi
exit $status
