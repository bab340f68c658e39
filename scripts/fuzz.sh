#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang 14 with AddressSanitizer and UBSan) and
# runs them side by side for a bounded time, each from its seed corpus in
# tests/fuzz/corpus/<target>/. Fails on any crash, leak, timeout or sanitizer report; the input
# that caused it is kept under build/fuzz/artifacts/ (replay it with
# `build/fuzz/tests/fuzz/<target> <file>`).
#
#   scripts/fuzz.sh            # 60 seconds (all targets at once)
#   scripts/fuzz.sh 60         # what scripts/test.sh (CI) runs
#   scripts/fuzz.sh 300        # longer runs while changing a parser
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
# clang 14 with libFuzzer and the sanitizer runtimes, and its OpenMP (the library's loops), from
# Debian; only those missing.
missing=()
for p in clang-14 libclang-rt-14-dev libomp-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
cmake --preset fuzz >/dev/null
# The build preset names only the three targets: the library and the commands they link, nothing
# else (no tests, benchmarks or program).
cmake --build --preset fuzz -j "$(nproc)"
mkdir -p build/fuzz/artifacts
# The targets run at the same time (each fuzzer is one process on one core), each for `seconds` of
# wall time; then each one's statistics, and the report of any that failed.
targets=(fuzz_deepspeed_config fuzz_sparsity_layout fuzz_cli_args)
pids=()
echo "fuzz: ${targets[*]} at once for ${seconds} s"
for target in "${targets[@]}"; do
  # New inputs go to a scratch corpus; the seeds in the repository are only read.
  scratch=build/fuzz/corpus/$target
  mkdir -p "$scratch"
  build/fuzz/tests/fuzz/$target -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix=build/fuzz/artifacts/$target- \
    "$scratch" "tests/fuzz/corpus/$target" >"build/fuzz/$target.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!targets[@]}"; do
  target=${targets[$i]}
  log=build/fuzz/$target.log
  status=0
  wait "${pids[$i]}" || status=$?
  echo "fuzz: $target"
  grep -E "stat::number_of_executed_units|INFO: seed corpus|Done [0-9]+ runs" "$log" || true
  if [ "$status" -ne 0 ]; then
    # The report: the sanitizer's or the expectation's message and the stack.
    grep -E -A40 "^==[0-9]+==ERROR|fuzz expectation failed|^SUMMARY|deadly signal|timeout" "$log" |
      head -80 || true
    echo "fuzz: $target failed (exit $status); log $log, inputs in build/fuzz/artifacts/"
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
echo "fuzz: every target ran ${seconds} s without a finding"
