#!/usr/bin/env bash
# The main job on a default input: build qforge, convert the stories260K Hugging Face checkpoint
# (../shared/data) to .qf, verify and inspect it, measure its perplexity on held-out TinyStories
# text (GPTQ protocol, the first 16 windows) and generate a short story.
#   usage: scripts/demo.sh [HF_DIR [TOKENIZER [TEXT]]]
set -euo pipefail
cd "$(dirname "$0")/.."

data=../shared/data
input=${1:-$data/stories260K/hf}
tokenizer=${2:-}
text=${3:-$data/tinystories-val-sample/tinystories_val_sample.txt}
if [ -z "${1:-}" ]; then
  tokenizer=$data/stories260K/tok512.bin
  if [ ! -d "$input" ]; then
    echo "demo: $input is absent; pass a Hugging Face model directory: scripts/demo.sh DIR" >&2
    exit 1
  fi
fi

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
qforge=./build/cli/qforge

mkdir -p models
name=$(basename "$(cd "$input" && pwd)")
[ "$name" = hf ] && name=stories260K
out=models/$name.qf
$qforge convert "$input" -o "$out" ${tokenizer:+--tokenizer "$tokenizer"}
$qforge verify "$out"
$qforge inspect "$out"
if [ -f "$text" ]; then
  $qforge ppl "$out" -f "$text" --protocol gptq --ctx 512 --chunks 16
fi
$qforge generate "$out" -p "Once upon a time" -n 64 --greedy
