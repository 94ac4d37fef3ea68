#!/usr/bin/env bash
# Installs the Debian packages qforge builds with, if any is missing. Idempotent: a second run
# installs nothing and takes a fraction of a second. The CUDA Toolkit is not a Debian package
# here; when /usr/local/cuda (nvcc, cuBLAS) is present the build uses it, otherwise it builds
# the CPU code only.
set -euo pipefail

packages=(cmake g++ make pkg-config nlohmann-json3-dev libcli11-dev libzstd-dev libxxhash-dev catch2
          libonig-dev   # Oniguruma: the regex engine of the HF pre-tokenizers (tokenizer/regex.cpp)
          libicu-dev    # ICU: NFC normalization (Qwen2 tokenizers)
          libopenblas-dev liblapacke-dev  # BLAS/LAPACK: GPTQ's Cholesky and updates (quant/)
          libbenchmark-dev  # Google Benchmark: the kernel benchmarks (bench/kernels_bench.cpp)
          clang libclang-rt-dev  # clang and its libFuzzer runtime (libclang_rt.fuzzer): scripts/fuzz.sh
          libcpp-httplib-dev  # cpp-httplib: the HTTP server of qforge serve (serve/)
          qemu-user  # emulated CPUs without AVX-512 / AVX for the tests (scripts/test_emulated_cpus.sh)
          clang-format)  # the format check (scripts/check_format.sh)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: dependencies present; CUDA toolkit found" >&2
else
  echo "setup: dependencies present; no CUDA toolkit (CPU-only build)" >&2
fi
