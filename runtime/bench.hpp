// Speed of a backend on one model: prefill (one batch into a fresh cache) and batch-1 decode
// (one token per forward pass), in tokens per second, with the weight bytes a decoded token reads
// so decode speed can be quoted as a fraction of memory read bandwidth (PERFORMANCE.md: decode
// tokens/s <= bandwidth / weight bytes per token).
//
// Token ids are drawn from a seeded std::mt19937_64 over the vocabulary: no tokenizer is needed,
// and the same seed runs the same tokens. Nothing here is asserted by tests beyond sanity: speed
// depends on the machine and its load, so every figure is a median over repetitions with its
// min and max beside it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "runtime/backend.hpp"

namespace qforge {

struct BenchOptions {
    uint64_t prefill_tokens = 128;  // one batch per repetition
    uint64_t decode_tokens = 64;    // forward passes of one token per repetition
    // Sequences decoded together (continuous batching's steady state, serve/): each step is one
    // Backend::forward_batch of one token from each of decode_batch sequences, each with its own
    // cache; decode tokens/s counts every sequence's tokens. 1: plain forward() steps.
    uint64_t decode_batch = 1;
    // Positions in each decode cache before the timed steps (distinct random tokens per
    // sequence); 0: kBenchDecodeContext. A served request's prompt plus what it has generated
    // is this context: attention reads it at every step.
    uint64_t decode_context = 0;
    int repetitions = 5;
    uint64_t seed = 42;
    // Read bandwidth (GB/s, 1 GB = 1e9 bytes) to quote decode against, as measured by
    // bench/bandwidth.cpp with the same thread count; nullopt leaves the fraction out unless
    // measure_bandwidth is set.
    std::optional<double> bandwidth_gb_per_s;
    // When bandwidth_gb_per_s is not given: measures the read bandwidth (GB/s), called in each
    // repetition between the timed prefill and the decode's untimed context positions, so each
    // repetition's decode is quoted against the bandwidth of its own moment (a shared host's
    // figure moved 16 -> 46 GB/s within two minutes) and no timed pass follows it directly.
    std::function<double()> measure_bandwidth;
};

// Positions in the cache before the timed decode steps. Decode at position 0 would attend to
// nothing; a few positions make it a real decode step while keeping attention negligible beside
// the weight reads, as in llama.cpp's tg benchmark that the PERFORMANCE.md figures come from.
inline constexpr uint64_t kBenchDecodeContext = 8;

// Tokens per second over repetitions: the median (the mean of the middle two for an even count)
// and the extremes.
struct RateStats {
    double median = 0.0, min = 0.0, max = 0.0;
    std::vector<double> runs;  // in the order they ran
};
RateStats rate_stats(std::vector<double> runs);

struct BenchResult {
    RateStats prefill, decode;            // tokens per second
    uint64_t weight_bytes_per_token = 0;  // Model::decode_weight_bytes()
    double effective_gb_per_s = 0.0;      // decode median * weight bytes per token / 1e9
    // effective / BenchOptions::bandwidth_gb_per_s; measured: the median over repetitions of
    // each one's effective GB/s over the bandwidth measured right after it.
    std::optional<double> bandwidth_fraction;
    RateStats bandwidth;  // BenchOptions::measure_bandwidth's GB/s per repetition (empty: given)
};

// Called after each timed pass with the tokens run so far (of bench_total_tokens(options)).
using BenchProgress = std::function<void(uint64_t tokens_done)>;
uint64_t bench_total_tokens(const BenchOptions& options);

// An untimed warm-up (one prefill of the measured length and one decode step: the mapped weights
// faulted in and the buffers allocated, as llama-bench warms up), then `repetitions` times:
// a prefill of prefill_tokens into a fresh cache, and kBenchDecodeContext untimed positions
// (decode_context) followed by decode_tokens timed single-token passes in another fresh cache
// (decode_batch > 1: that many caches, one forward_batch per step). Throws
// qforge::Error when the counts are zero or the passes do not fit the model's context.
BenchResult run_bench(Backend& backend, const BenchOptions& options,
                      const BenchProgress& progress = {});

// Read bandwidth in GB/s with the pool's threads: each thread sums its own slice of a `bytes`
// float buffer (first touched by that thread), best of `repetitions` timed passes, as
// bench/bandwidth.cpp measures it. Run beside a bench so its fraction compares like with like.
double measure_read_bandwidth(ThreadPool& pool, uint64_t bytes = uint64_t{512} << 20,
                              int repetitions = 3);

}  // namespace qforge
