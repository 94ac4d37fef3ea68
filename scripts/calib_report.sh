#!/usr/bin/env bash
# What calibrated quantization keeps over RTN, measured side by side in one run (issue
# "Quantization II"). Prints markdown tables: perplexity, KL divergence and top-1 agreement against
# the float model in the same pass, and the wall time of each quantization.
#
# The float model's perplexity is the base perplexity of the same passes (ppl --kl-base).
#   1. stories260K (a real trained model): every method (and GPTQ with act-order and --mse) at q8,
#      q4_g32, q4s_g32 and q3_g32,
#      calibrated on the last 20% of ../shared/data/tinystories-val-sample and evaluated on the
#      first 80% (split at a blank line by scripts/split_text.py, so the parts never overlap);
#      llamacpp protocol, ctx 128.
#   2. SmolLM2-135M-Instruct (its "float" model is the dequantized Q4_1 GGUF; scripts/get_models.sh
#      makes it): rtn, gptq and awq at q4_g128 and q3_g128, calibrated on
#      ../shared/data/brown-corpus (nsamples 32), evaluated on the first $CHUNKS135 chunks of
#      ../shared/data/wikitext-2-raw/wiki.test.lf.raw (llamacpp protocol, ctx 512).
#
#   3. Gemma 3 270M (its "float" model is the dequantized Q4_K_M GGUF; scripts/get_models.sh gemma3
#      makes it in $QFORGE_MODELS_DIR): rtn, gptq and awq at q4_g128 and rtn at q8 ($ROWS270),
#      calibrated and evaluated as 2. but on the first $CHUNKS270 chunks (40: the figure the issue
#      asks for), then (unless BENCH=0) `qforge bench` of f32, q8 and q4_g128 (GPTQ) on $threads
#      threads.
#
#   usage: scripts/calib_report.sh [stories|135m|gemma3|all]   (default all; gemma3 is not in all)
#   env:   BUILD_DIR (default build), THREADS (default 2), CHUNKS (stories chunks, default 200),
#          CHUNKS135 (default 100), CHUNKS270 (default 40), NSAMPLES (stories calibration windows,
#          default 128), BENCH_ARGS (gemma3's bench, default "-p 128 -n 64 -r 3"), BENCH (0: no
#          bench, for a shared machine), ROWS270 (gemma3's QTYPE:METHOD rows, default
#          "q4_g128:rtn q4_g128:gptq q4_g128:awq q8:rtn"), QFORGE_MODELS_DIR (where get_models.sh
#          put the float models; default models), QFORGE_BIN (a qforge binary to run as it is,
#          instead of building BUILD_DIR's: a rebuild during a long run changes nothing)
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
chunks135=${CHUNKS135:-100}
chunks270=${CHUNKS270:-40}
nsamples=${NSAMPLES:-128}
# shellcheck source=scripts/report_common.sh
. scripts/report_common.sh
models=${QFORGE_MODELS_DIR:-models}
if [ ! -d "$data" ]; then
  echo "calib_report: $data is absent; nothing to measure" >&2
  exit 1
fi
mkdir -p models/calib
now() { date +%s.%N; }
secs() { python3 -c "print('%.1f' % ($2 - $1))"; }

# method name -> quantize arguments
method_args() {
  case $1 in
    rtn) echo "--method rtn" ;;
    gptq) echo "--method gptq" ;;
    gptq+act-order) echo "--method gptq --act-order" ;;
    gptq+act-order+mse) echo "--method gptq --act-order --mse" ;;
    awq) echo "--method awq" ;;
    awq+gptq) echo "--method awq+gptq" ;;
  esac
}

# row MODEL_BASE QTYPE METHOD OUT.qf CALIB NSAMPLES EVAL CTX CHUNKS [quantize args...]
row() {
  local base=$1 q=$2 m=$3 dst=$4 calib=$5 ns=$6 eval=$7 ctx=$8 nchunks=$9
  local t0 t1 calib_args=""
  [ "$m" != rtn ] && calib_args="--calib $calib --nsamples $ns"
  t0=$(now)
  # shellcheck disable=SC2046,SC2086
  $qforge quantize "$base" -o "$dst" --qtype "$q" $(method_args "$m") $calib_args -t "$threads" \
    --json >"$out/q.json" 2>"$out/q.log" || { cat "$out/q.log" >&2; return 1; }
  t1=$(now)
  $qforge ppl "$dst" -f "$eval" --protocol llamacpp --ctx "$ctx" --chunks "$nchunks" -t "$threads" \
    --kl-base "$base" --json -q >"$out/p.json"
  echo "| $q | $m | $(stat -c %s "$dst") | $(json "$out/p.json" '"%.4f +/- %.4f" % (j["ppl"], j["ppl_stderr"])') | $(json "$out/p.json" '"%.5f" % j["kld"]') | $(json "$out/p.json" '"%.2f%%" % (100 * j["top1_agreement"])') | $(secs "$t0" "$t1") |"
}

header() {
  echo "| qtype | method | file bytes | PPL | KLD vs float | top-1 agreement | quantize wall s |"
  echo "|---|---|---|---|---|---|---|"
}

# The float model's line, from the base perplexity of the last row's pass (the same tokens):
# BASE LABEL
float_row() {
  echo "| $2 | float | $(stat -c %s "$1") | $(json "$out/p.json" '"%.4f +/- %.4f" % (j["base_ppl"], j["base_ppl_stderr"])') | 0 | 100% | |"
}

if [ "$what" = stories ] || [ "$what" = all ]; then
  base=models/calib/stories260K-f32.qf
  $qforge convert "$data/stories260K/hf" -o "$base" --tokenizer "$data/stories260K/tok512.bin" -q \
    >/dev/null
  text=$data/tinystories-val-sample/tinystories_val_sample.txt
  split=$(python3 scripts/split_text.py "$text" 0.8 --out-a "$out/eval.txt" --out-b "$out/calib.txt")
  echo "### stories260K: llamacpp protocol, ctx 128, $chunks chunks of the first 80% of $(basename "$text") ($split); calibrated on the last 20%, $nsamples windows of 512 tokens (the model's context); $threads threads"
  echo
  for q in q8 q4_g32 q4s_g32 q3_g32; do
    for m in rtn gptq gptq+act-order gptq+act-order+mse awq awq+gptq; do
      row "$base" "$q" "$m" "models/calib/stories260K-$q-$m.qf" "$out/calib.txt" "$nsamples" \
        "$out/eval.txt" 128 "$chunks" >>"$out/rows.md"
    done
  done
  header
  float_row "$base" f32
  cat "$out/rows.md"
  echo
fi

# A real model on wikitext-2 (llamacpp protocol, ctx 512), calibrated on the brown corpus:
# wikitext_rows BASE.qf LABEL FLOAT_LABEL PREFIX CHUNKS GET_MODELS_ARG QTYPE:METHOD...
wikitext_rows() {
  local base=$1 label=$2 float_label=$3 prefix=$4 nchunks=$5 get=$6 qm
  shift 6
  if [ ! -f "$base" ]; then
    echo "calib_report: $base is missing; run scripts/get_models.sh $get once to make it" >&2
    exit 1
  fi
  local text=$data/wikitext-2-raw/wiki.test.lf.raw calib=$data/brown-corpus/brown.txt
  echo "### $label (float = $float_label): llamacpp protocol, ctx 512, $nchunks chunks of $(basename "$text"); calibrated on $(basename "$calib"), 32 windows of 512 tokens; $threads threads"
  echo
  rm -f "$out/rows.md"
  for qm in "$@"; do
    row "$base" "${qm%%:*}" "${qm#*:}" "models/calib/$prefix-${qm%%:*}-${qm#*:}.qf" "$calib" 32 \
      "$text" 512 "$nchunks" >>"$out/rows.md"
  done
  header
  float_row "$base" "$float_label"
  cat "$out/rows.md"
  echo
}

if [ "$what" = 135m ] || [ "$what" = all ]; then
  wikitext_rows "$models/SmolLM2-135M-Instruct.qf" SmolLM2-135M-Instruct "the dequantized Q4_1 GGUF" \
    SmolLM2-135M "$chunks135" smollm2 q4_g128:rtn q4_g128:gptq q4_g128:awq q3_g128:rtn \
    q3_g128:gptq q3_g128:awq
fi
if [ "$what" = gemma3 ]; then
  base=$models/gemma-3-270m.qf
  # shellcheck disable=SC2086
  wikitext_rows "$base" "Gemma 3 270M" "the dequantized Q4_K_M GGUF" gemma-3-270m "$chunks270" \
    gemma3 ${ROWS270:-q4_g128:rtn q4_g128:gptq q4_g128:awq q8:rtn}
fi
if [ "$what" = gemma3 ] && [ "${BENCH:-1}" != 0 ]; then
  echo "| model | file bytes | prefill tok/s | decode tok/s | weight bytes / token |"
  echo "|---|---|---|---|---|"
  for m in "$base" models/calib/gemma-3-270m-q8-rtn.qf models/calib/gemma-3-270m-q4_g128-gptq.qf; do
    # shellcheck disable=SC2086
    $qforge bench "$m" ${BENCH_ARGS:-"-p 128 -n 64 -r 3"} -t "$threads" --json -q >"$out/b.json"
    echo "| $(basename "$m") | $(stat -c %s "$m") | $(json "$out/b.json" '"%.1f" % j["prefill_tok_s"]') | $(json "$out/b.json" '"%.1f" % j["decode_tok_s"]') | $(json "$out/b.json" 'j["weight_bytes_per_token"]') |"
  done
  echo
fi
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
