#!/usr/bin/env bash
# What RTN quantization keeps and what it buys, measured side by side in one run:
#   1. quality: stories260K (a real trained model) quantized to every qtype; perplexity over
#      ../shared/data/tinystories-val-sample (llamacpp protocol, ctx 128, 200 chunks) with KL
#      divergence and top-1 agreement against the f32 model in the same pass; and the cost of
#      int8 activations (the default) against float activations (--float-activations).
#   2. speed: the TinyLlama-1.1B shape (random f16 weights, scripts/bench_runtime.sh makes it)
#      in f16, q8, q4_g32, q4_g128: decode and prefill tokens/s and decode's fraction of the read
#      bandwidth, measured by `qforge bench` in the same process.
# Prints markdown tables.
#
#   usage: scripts/quant_report.sh [quality|speed|all]   (default all)
#   env:   BUILD_DIR (default build), THREADS (default 2), CHUNKS (default 200),
#          BENCH_ARGS (default "-p 128 -n 64 -r 5")
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
bench_args=${BENCH_ARGS:-"-p 128 -n 64 -r 5"}
qtypes="q8 q8_g32 q8_g128 q4_g32 q4_g64 q4_g128 q4s_g32 q4s_g64 q4s_g128 q3_g32 q3_g128"

# shellcheck source=scripts/report_common.sh
. scripts/report_common.sh
mkdir -p models/quant

if [ "$what" = quality ] || [ "$what" = all ]; then
  if [ ! -d "$data/stories260K/hf" ]; then
    echo "quant_report: $data/stories260K is absent; skipping the quality table" >&2
  else
    base=models/quant/stories260K-f32.qf
    $qforge convert "$data/stories260K/hf" -o "$base" --tokenizer "$data/stories260K/tok512.bin" -q >/dev/null
    text=$data/tinystories-val-sample/tinystories_val_sample.txt
    ppl() {  # model, extra args -> json file
      $qforge ppl "$1" -f "$text" --protocol llamacpp --ctx 128 --chunks "$chunks" -t "$threads" \
        --kl-base "$base" --json -q "${@:3}" >"$2"
    }
    echo "### stories260K, llamacpp protocol, ctx 128, $chunks chunks, $(basename "$text")"
    echo
    echo "| qtype | file bytes | PPL | KLD vs f32 | top-1 agreement | KLD, float activations |"
    echo "|---|---|---|---|---|---|"
    ppl "$base" "$out/f32.json"
    echo "| f32 | $(stat -c %s "$base") | $(json "$out/f32.json" '"%.4f +/- %.4f" % (j["ppl"], j["ppl_stderr"])') | 0 | 100% | |"
    for q in $qtypes; do
      m=models/quant/stories260K-$q.qf
      $qforge quantize "$base" -o "$m" --method rtn --qtype "$q" -q >/dev/null
      ppl "$m" "$out/$q.json"
      ppl "$m" "$out/$q-f.json" --float-activations
      echo "| $q | $(stat -c %s "$m") | $(json "$out/$q.json" '"%.4f +/- %.4f" % (j["ppl"], j["ppl_stderr"])') | $(json "$out/$q.json" '"%.5f" % j["kld"]') | $(json "$out/$q.json" '"%.2f%%" % (100 * j["top1_agreement"])') | $(json "$out/$q-f.json" '"%.5f" % j["kld"]') |"
    done
    echo
  fi
fi

if [ "$what" = speed ] || [ "$what" = all ]; then
  tl=models/synthetic-tinyllama.qf
  if [ ! -f "$tl" ]; then
    echo "quant_report: $tl is missing; run scripts/bench_runtime.sh once to make it" >&2
    exit 1
  fi
  echo "### TinyLlama-1.1B shape (random weights), $threads threads, qforge bench $bench_args"
  echo
  echo "| qtype | weight bytes / token | prefill tok/s | decode tok/s | decode GB/s | read bandwidth GB/s | fraction | decode speed-up vs f16 | byte ratio |"
  echo "|---|---|---|---|---|---|---|---|---|"
  f16_rate=""
  f16_bytes=""
  for q in f16 q8 q4_g32 q4_g128; do
    m=$tl
    if [ "$q" != f16 ]; then
      m=models/quant/synthetic-tinyllama-$q.qf
      [ -f "$m" ] && [ "$m" -nt "$tl" ] || $qforge quantize "$tl" -o "$m" --method rtn --qtype "$q" -q -t "$threads" >/dev/null
    fi
    # shellcheck disable=SC2086
    $qforge bench "$m" $bench_args -t "$threads" --json -q >"$out/bench-$q.json"
    rate=$(json "$out/bench-$q.json" 'j["decode_tok_s"]')
    bytes=$(json "$out/bench-$q.json" 'j["weight_bytes_per_token"]')
    [ -z "$f16_rate" ] && f16_rate=$rate && f16_bytes=$bytes
    echo "| $q | $bytes | $(json "$out/bench-$q.json" '"%.1f" % j["prefill_tok_s"]') | $(json "$out/bench-$q.json" '"%.2f" % j["decode_tok_s"]') | $(json "$out/bench-$q.json" '"%.2f" % j["effective_gb_per_s"]') | $(json "$out/bench-$q.json" '"%.1f" % j["read_bandwidth_gb_s"]') | $(json "$out/bench-$q.json" '"%.0f%%" % (100 * j["bandwidth_fraction"])') | $(python3 -c "print('%.2fx' % ($rate / $f16_rate))") | $(python3 -c "print('%.2fx' % ($f16_bytes / $bytes))") |"
  done
  echo
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
fi
