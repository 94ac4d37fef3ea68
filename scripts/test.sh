#!/usr/bin/env bash
# Installs dependencies, checks the formatting (scripts/check_format.sh), builds and runs every
# test: a release build (CUDA code compiled for one architecture when nvcc is present, to keep
# CI short), part of its tests again on emulated CPUs without AVX-512 and without AVX, and an
# AddressSanitizer+UBSan build of the CPU code, then a 5 s libFuzzer smoke of
# every reader (scripts/fuzz.sh). Tests that need ../shared or a GPU print "SKIPPED: <reason>"
# when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
stage() { echo "== [$((SECONDS - start)) s] $*"; }  # each stage's start, for the CI's time budget
bash scripts/setup.sh

stage "format check (clang-format, .clang-format)"
bash scripts/check_format.sh

jobs=$(nproc)
arch=${QFORGE_TEST_CUDA_ARCH:-90}

stage "release build (CUDA architecture $arch when available)"
# The tests' sources as two unity units (QFORGE_UNITY_TESTS: their compile 402 s -> 116 s here);
# the product's own sources one by one, as every user builds them, so a missing #include cannot
# hide in a unit.
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Release -DQFORGE_CUDA=AUTO \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DQFORGE_WERROR=ON -DQFORGE_UNITY_TESTS=ON >/dev/null
cmake --build build-test -j"$jobs"
ctest --test-dir build-test --output-on-failure -j"$jobs"

# The products, kernels, dispatch and stories260K end-to-end tests again on emulated CPUs without
# AVX-512 and without AVX (about 2 minutes; the whole suite takes 11 and 12 under QEMU; on a host
# with neither AVX-512 nor AVX-VNNI the first is the native run's level and is skipped).
stage "emulated CPUs: AVX2 without AVX-512, and no AVX (scripts/test_emulated_cpus.sh)"
bash scripts/test_emulated_cpus.sh build-test \
  "[isa],[qdot],[kernels],[float_gemm],[attention],[activation],[group_codes],[stories],[llama2c],[bench]"

stage "AddressSanitizer + UndefinedBehaviorSanitizer build (CPU code), with the libFuzzer harnesses"
# Every library with both sanitizers; the tests' own sources with ASan alone (tests/CMakeLists.txt:
# UBSan made them compile 1.7x as long).
# At -O0: with the sanitizers' instrumentation, -O1 compiles twice as slowly (cli/cmd_ppl.cpp
# 32 s against 16 s; kernels/cpu/qdot_avx2.cpp 81 s against 10 s), more than its faster tests
# would give back. Without -g (assertions stay on): debug info costs about 10% of each compile
# (cmd_ppl.cpp 13.2 s against 11.9 s) and the links; sanitizer reports still name the functions
# of each frame, and a failure is rerun locally with -g for lines.
# A unity build (CMAKE_UNITY_BUILD: 8 files to a unit, the tests in two; the kernels stay file by
# file, kernels/CMakeLists.txt): the release build above compiled every product source alone.
# With clang and libFuzzer (scripts/fuzz.sh --probe) the same build has the fuzz harnesses
# (QFORGE_FUZZ; the readers' libraries instrumented for them), so the fuzz smoke below reuses its
# libraries instead of compiling them again: clang also compiles with the sanitizers about 1.5x
# faster than GCC 12 (formats/json_io.cpp 15.5 s against 26.9 s). Without clang: GCC, no smoke.
fuzz=()
if fuzz_reason=$(bash scripts/fuzz.sh --probe); then
  fuzz=(-DCMAKE_CXX_COMPILER=clang++ -DQFORGE_FUZZ=ON)
fi
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DQFORGE_CUDA=OFF \
  -DQFORGE_SANITIZE=ON -DQFORGE_WERROR=ON -DCMAKE_UNITY_BUILD=ON "${fuzz[@]}" >/dev/null
cmake --build build-asan -j"$jobs"
# The seven longest numerics and scaling checks (two 16-window perplexity reproductions, GPTQ,
# AWQ and importance-RTN quality on stories260K, stories260K's perplexity through a GGUF round
# trip, the linear-time merge build from a 512 KiB piece: about 5 minutes of the sanitizer run)
# run in the release build only, to keep CI within its 30 minutes on 2 cores; their code paths
# run under the sanitizers in the other ppl, GPTQ, AWQ, RTN, resume, GGUF export and tokenizer
# tests.
#
# Likewise the four CLI catalogues that spawn the qforge binary hundreds of times (every command
# on every malformed .qf; convert's and quantize's refusals of outputs that are inputs, devices or
# FIFOs; every usage error): an ASan process takes about 0.19 s to start, so they took 128 s of
# test time (about 64 s of the run at 2 jobs). The library code behind them (qf validation,
# output-path checks, option parsing) runs under the sanitizers in qf_validate_test's,
# output_safety_test's and the other CLI tests' cases. The quality_sweep.sh test is a script
# check (CSV rows against direct quantize/ppl runs): the code it drives runs under the sanitizers
# in the quantize and ppl tests.
asan_skip='^(ppl gptq --ctx 512: stories260K FP(32|16) reproduces|gptq on stories260K beats RTN|qforge quantize --method awq on stories260K: no worse|GGUF export: stories260K q4s_g32 round-trips with the same perplexity|rtn --calib: importance-weighted RTN beats RTN|llama2.c merges are built in linear time|validate: every command refuses a .qf that disagrees with its config|quantize \(RTN and GPTQ\) refuses an output or --resume that is an input|convert refuses an output that is an input, a device, a FIFO|every usage error: exit 2, one line naming the option|quality_sweep.sh: rows equal quantize and ppl)'
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j"$jobs" -E "$asan_skip"

# 5 s per harness: a smoke that every harness builds, replays its corpus and runs; the long runs
# (15 minutes each, scripts/fuzz.sh 900) are done by hand, as the CI's 30 minutes have no room.
stage "libFuzzer smoke: every reader's harness for 5 s (scripts/fuzz.sh)"
if [ ${#fuzz[@]} -gt 0 ]; then
  FUZZ_BUILD=build-asan FUZZ_CONFIGURED=1 FUZZ_JOBS=$jobs bash scripts/fuzz.sh 5
else
  echo "SKIPPED: fuzz smoke: $fuzz_reason"
fi
stage "done"
