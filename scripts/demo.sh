#!/usr/bin/env bash
# The main job on a default input: build qforge, convert the stories260K Hugging Face checkpoint
# (../shared/data) to .qf, verify it and print what is inside.
#   usage: scripts/demo.sh [HF_DIR [TOKENIZER]]
set -euo pipefail
cd "$(dirname "$0")/.."

data=../shared/data/stories260K
input=${1:-$data/hf}
tokenizer=${2:-}
if [ -z "${1:-}" ]; then
  tokenizer=$data/tok512.bin
  if [ ! -d "$input" ]; then
    echo "demo: $input is absent; pass a Hugging Face model directory: scripts/demo.sh DIR" >&2
    exit 1
  fi
fi

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"

mkdir -p models
out=models/$(basename "$(cd "$input" && pwd)" | sed 's/^hf$/stories260K/').qf
./build/cli/qforge convert "$input" -o "$out" ${tokenizer:+--tokenizer "$tokenizer"}
./build/cli/qforge verify "$out"
./build/cli/qforge inspect "$out"
