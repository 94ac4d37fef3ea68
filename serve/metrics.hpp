// `qforge serve`'s /metrics: the Prometheus text exposition format (version 0.0.4) of what a
// monitoring system scrapes from a serving runtime (vLLM's and llama.cpp's servers have the
// same): the scheduler's gauges and step counters, requests by status code, prompt and generated
// tokens, and histograms of the time to first token and of the whole request.
//
// Thread-safe: HTTP handler threads record, any thread renders.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "serve/scheduler.hpp"

namespace qforge::serve {

class ServeMetrics {
  public:
    // Upper bounds (seconds) of the histograms' buckets; +Inf follows.
    static constexpr std::array<double, 10> kTtftBuckets = {0.01, 0.025, 0.05, 0.1, 0.25,
                                                            0.5,  1.0,   2.5,  5.0, 10.0};
    static constexpr std::array<double, 10> kRequestBuckets = {0.1, 0.25, 0.5,  1.0,  2.5,
                                                               5.0, 10.0, 30.0, 60.0, 120.0};

    // A response of a /v1/ route, by its HTTP status (499: the client went away).
    void response(int status);
    // A generation that ended (finished, failed or cancelled): its prompt and generated tokens,
    // the seconds to its first token (when it has one) and in all.
    void generation(uint64_t prompt_tokens, uint64_t generated, double first_token_s,
                    double total_s);

    // Every metric, the scheduler's from `s`.
    std::string render(const SchedulerStats& s) const;

  private:
    template <size_t N>
    struct Histogram {
        std::array<uint64_t, N + 1> counts{};  // per bucket, the last +Inf (not cumulative)
        double sum = 0.0;
        void add(const std::array<double, N>& bounds, double v);
    };

    mutable std::mutex mutex_;
    std::map<int, uint64_t> responses_;
    uint64_t prompt_tokens_ = 0, generated_ = 0;
    Histogram<kTtftBuckets.size()> ttft_;
    Histogram<kRequestBuckets.size()> request_;
};

}  // namespace qforge::serve
