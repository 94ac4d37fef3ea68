#include "runtime/sampling.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace qforge {

int32_t argmax(std::span<const float> logits) {
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
        if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
}

Sampler::Sampler(SamplingParams params) : params_(params), rng_(params.seed) {
    if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
        throw Error("temperature must be a finite number >= 0");
    if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) throw Error("top-p must be in (0, 1]");
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample(std::span<const float> logits) {
    if (params_.temperature == 0.0f || logits.size() == 1) return argmax(logits);
    candidates_.resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i)
        candidates_[i] = {logits[i], static_cast<int32_t>(i)};
    // Highest logit first, lower id first on ties: a total order, so the result is unique.
    auto by_logit = [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    size_t keep = candidates_.size();
    if (params_.top_k > 0 && params_.top_k < keep) {
        keep = params_.top_k;
        std::partial_sort(candidates_.begin(),
                          candidates_.begin() + static_cast<std::ptrdiff_t>(keep),
                          candidates_.end(), by_logit);
    } else {
        std::sort(candidates_.begin(), candidates_.end(), by_logit);
    }
    candidates_.resize(keep);

    // Softmax over the kept tokens at the temperature, in double.
    const double max_logit = candidates_[0].first, inv_t = 1.0 / params_.temperature;
    std::vector<double> p(keep);
    double sum = 0.0;
    for (size_t i = 0; i < keep; ++i)
        sum += (p[i] = std::exp((candidates_[i].first - max_logit) * inv_t));
    // Top-p: the smallest prefix whose probability reaches top_p.
    if (params_.top_p < 1.0f) {
        double cumulative = 0.0;
        size_t cut = keep;
        for (size_t i = 0; i < keep; ++i) {
            cumulative += p[i] / sum;
            if (cumulative >= params_.top_p) {
                cut = i + 1;
                break;
            }
        }
        keep = cut;
        sum = 0.0;
        for (size_t i = 0; i < keep; ++i) sum += p[i];
    }
    const double r = uniform() * sum;
    double cumulative = 0.0;
    for (size_t i = 0; i < keep; ++i) {
        cumulative += p[i];
        if (r < cumulative) return candidates_[i].second;
    }
    return candidates_[keep - 1].second;
}

}  // namespace qforge
