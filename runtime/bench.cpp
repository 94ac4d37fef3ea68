#include "runtime/bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "core/error.hpp"
#include "runtime/logits_check.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Ids in [0, vocab). The modulo's bias (under vocab / 2^64) is irrelevant to speed; mt19937_64's
// output is specified bit for bit, so a seed gives the same ids everywhere.
std::vector<int32_t> random_tokens(uint64_t n, uint64_t vocab, std::mt19937_64& rng) {
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
    return ids;
}

// The slice's quarters read side by side, 32 floats of each per step, into one 8-float
// accumulator each: four streams, as bench/bandwidth.cpp reads them (a thread reading one stream
// gets less of the memory on some CPUs than the products, which read several: kernels/README.md,
// "Decode: two streams").
using v8f = float __attribute__((vector_size(32)));

float sum_floats(const float* p, size_t n) {
    constexpr size_t kStreams = 4, kStep = 32;
    const size_t q = n / kStreams / kStep * kStep;  // floats per stream, whole steps
    v8f a[kStreams] = {};
    for (size_t i = 0; i < q; i += kStep)
        for (size_t s = 0; s < kStreams; ++s)
            for (size_t u = 0; u < kStep; u += 8) {
                v8f x;
                std::memcpy(&x, p + s * q + i + u, sizeof x);
                a[s] += x;
            }
    const v8f t = (a[0] + a[1]) + (a[2] + a[3]);
    float sum = 0.0f;
    for (int k = 0; k < 8; ++k) sum += t[k];
    for (size_t i = kStreams * q; i < n; ++i) sum += p[i];
    return sum;
}

}  // namespace

double measure_read_bandwidth(ThreadPool& pool, uint64_t bytes, int repetitions) {
    const size_t n = static_cast<size_t>(bytes / sizeof(float));
    const auto parts = static_cast<size_t>(pool.size());
    std::unique_ptr<float[]> data(new float[n]);  // pages first touched by their reader below
    std::vector<double> sums(parts, 0.0);
    pool.run([&](int t) {
        auto [b, e] = split_range(n, parts, static_cast<size_t>(t));
        std::fill(data.get() + b, data.get() + e, 1.0f);
    });
    double best = 0.0;
    for (int r = 0; r < repetitions; ++r) {
        const auto t0 = Clock::now();
        pool.run([&](int t) {
            auto [b, e] = split_range(n, parts, static_cast<size_t>(t));
            sums[static_cast<size_t>(t)] += sum_floats(data.get() + b, e - b);
        });
        best = std::max(best, static_cast<double>(n * sizeof(float)) / seconds_since(t0) / 1e9);
    }
    volatile double sink = 0.0;  // the sums must be used, or the loads could be dropped
    for (double v : sums) sink = sink + v;
    return best;
}

RateStats rate_stats(std::vector<double> runs) {
    RateStats s;
    s.runs = runs;
    if (runs.empty()) return s;
    std::sort(runs.begin(), runs.end());
    const size_t n = runs.size();
    s.median = n % 2 ? runs[n / 2] : (runs[n / 2 - 1] + runs[n / 2]) / 2.0;
    s.min = runs.front();
    s.max = runs.back();
    return s;
}

uint64_t bench_total_tokens(const BenchOptions& o) {
    return static_cast<uint64_t>(std::max(o.repetitions, 0)) * (o.prefill_tokens + o.decode_tokens);
}

BenchResult run_bench(Backend& backend, const BenchOptions& o, const BenchProgress& progress) {
    const Model& model = backend.model();
    const ModelConfig& c = model.config();
    if (o.prefill_tokens == 0 || o.decode_tokens == 0 || o.repetitions < 1)
        throw Error(model.path(), {},
                    "bench needs at least one prefill token, one decode token and one repetition");
    const uint64_t max_pos = c.max_position_embeddings;
    if (o.prefill_tokens > max_pos)
        throw Error(model.path(), {},
                    "a prefill of " + std::to_string(o.prefill_tokens) +
                        " tokens exceeds the model's context of " + std::to_string(max_pos));
    const uint64_t context = o.decode_context ? o.decode_context : kBenchDecodeContext;
    const uint64_t batch = o.decode_batch;
    if (batch == 0 || batch > (uint64_t{1} << 16))
        throw Error("bench: the decode batch must be 1 to 65536 sequences, not " +
                    std::to_string(batch));
    const uint64_t decode_positions = context + o.decode_tokens;
    if (context > max_pos || decode_positions > max_pos)
        throw Error(
            model.path(), {},
            std::to_string(o.decode_tokens) + " decode tokens after " + std::to_string(context) +
                " context positions exceed the model's context of " + std::to_string(max_pos));
    if (o.bandwidth_gb_per_s && !(*o.bandwidth_gb_per_s > 0.0))
        throw Error("bench: the read bandwidth must be a positive number of GB/s");

    std::mt19937_64 rng(o.seed);
    const std::vector<int32_t> prefill_ids = random_tokens(o.prefill_tokens, c.vocab_size, rng);
    // Sequence s decodes decode_ids[s] (its context, then its timed tokens) in decode_caches[s].
    std::vector<std::vector<int32_t>> decode_ids(batch);
    std::vector<std::unique_ptr<KvCache>> decode_caches(batch);
    for (uint64_t s = 0; s < batch; ++s) {
        decode_ids[s] = random_tokens(decode_positions, c.vocab_size, rng);
        decode_caches[s] = backend.new_cache(decode_positions);
    }
    std::vector<float> logits(c.vocab_size * batch);
    const std::span<float> one_row(logits.data(), c.vocab_size);
    auto prefill_cache = backend.new_cache(o.prefill_tokens);
    // One decode step at position i of every sequence.
    std::vector<BatchSequence> step(batch);
    auto decode_step = [&](uint64_t i) {
        if (batch == 1)
            return backend.forward({&decode_ids[0][i], 1}, *decode_caches[0], 0, one_row);
        for (uint64_t s = 0; s < batch; ++s)
            step[s] = {{&decode_ids[s][i], 1}, decode_caches[s].get(), true};
        backend.forward_batch(step, logits);
    };

    // Warm-up, untimed, as llama-bench does: one prefill of the measured length (every weight
    // read once, and the buffers a prefill of that size uses allocated and touched), then one
    // decode step, so the timed passes pay no page faults or first allocations. With one
    // repetition, a cold first prefill measured 0.6x the steady rate (SmolLM2, 128 tokens).
    backend.forward(prefill_ids, *prefill_cache, o.prefill_tokens - 1, one_row);
    decode_step(0);
    // Speed of a model that computes NaN is no result: check the logits outside the timers.
    if (!all_finite(logits))
        throw_non_finite_logits(logits, model.path(), "position 0 of the warm-up pass");

    const bool probe = !o.bandwidth_gb_per_s && o.measure_bandwidth;
    std::vector<double> prefill_rates, decode_rates, bandwidths, fractions;
    const double bytes_per_step = static_cast<double>(model.decode_weight_bytes());
    uint64_t done = 0;
    for (int r = 0; r < o.repetitions; ++r) {
        prefill_cache->clear();
        auto t0 = Clock::now();
        backend.forward(prefill_ids, *prefill_cache, o.prefill_tokens - 1, one_row);
        prefill_rates.push_back(static_cast<double>(o.prefill_tokens) / seconds_since(t0));
        if (!all_finite(one_row))
            throw_non_finite_logits(
                one_row, model.path(),
                "position " + std::to_string(o.prefill_tokens - 1) + " of the prefill");
        done += o.prefill_tokens;
        if (progress) progress(done);

        // The bandwidth of this repetition's moment, before the decode's untimed context pass
        // (which brings the weights back into the caches the measurement's buffer evicted).
        if (probe) bandwidths.push_back(o.measure_bandwidth());
        for (uint64_t s = 0; s < batch; ++s) {
            decode_caches[s]->clear();
            backend.forward({decode_ids[s].data(), context}, *decode_caches[s], context - 1,
                            one_row);
        }
        t0 = Clock::now();
        for (uint64_t i = context; i < decode_positions; ++i) decode_step(i);
        decode_rates.push_back(static_cast<double>(o.decode_tokens * batch) / seconds_since(t0));
        if (probe)  // weights are read once per step for the whole batch
            fractions.push_back(decode_rates.back() / static_cast<double>(batch) * bytes_per_step /
                                1e9 / bandwidths.back());
        if (!all_finite(logits))
            throw_non_finite_logits(logits, model.path(), "the last decode step");
        done += o.decode_tokens;
        if (progress) progress(done);
    }

    BenchResult result;
    result.prefill = rate_stats(std::move(prefill_rates));
    result.decode = rate_stats(std::move(decode_rates));
    result.weight_bytes_per_token = model.decode_weight_bytes();
    // Weights are read once per step for the whole batch.
    result.effective_gb_per_s = result.decode.median / static_cast<double>(batch) *
                                static_cast<double>(result.weight_bytes_per_token) / 1e9;
    if (o.bandwidth_gb_per_s)
        result.bandwidth_fraction = result.effective_gb_per_s / *o.bandwidth_gb_per_s;
    if (probe) {
        result.bandwidth = rate_stats(std::move(bandwidths));
        result.bandwidth_fraction = rate_stats(std::move(fractions)).median;
    }
    return result;
}

}  // namespace qforge
