#include "runtime/sampling.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <string>
#include <utility>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "core/error.hpp"

namespace qforge {

int32_t argmax(std::span<const float> logits) {
    // The plain scan's answer (the first index whose logit no later one exceeds) in two
    // vectorized passes: the maximum, then the first index holding it (+0 and -0 compare equal,
    // as in the scan). A NaN never replaces a lane's maximum, as it never becomes the scan's best;
    // a NaN at index 0 is the scan's answer whatever follows. Serving greedy rows of 49152
    // logits: several times faster than the scan's dependent compare per element.
    const size_t n = logits.size();
    if (n == 0 || std::isnan(logits[0])) return 0;
    float best = logits[0];
    size_t i = 0;
#if defined(__SSE2__)
    // maxps(x, m) is exactly x > m ? x : m, lane by lane (GCC does not make the float
    // conditional one by itself); four vectors of independent lanes.
    __m128 m[4];
    for (__m128& v : m) v = _mm_set1_ps(best);
    for (; i + 16 <= n; i += 16)
        for (int v = 0; v < 4; ++v) m[v] = _mm_max_ps(_mm_loadu_ps(&logits[i + 4 * v]), m[v]);
    alignas(16) float lane[16];
    for (int v = 0; v < 4; ++v) _mm_store_ps(lane + 4 * v, m[v]);
    for (float x : lane) best = x > best ? x : best;
#endif
    for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
    size_t j = 0;
#if defined(__SSE2__)
    const __m128 b = _mm_set1_ps(best);
    for (; j + 16 <= n; j += 16) {
        int hit = 0;
        for (int v = 0; v < 4; ++v)
            hit |= _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(&logits[j + 4 * v]), b)) << (4 * v);
        if (hit) return static_cast<int32_t>(j + static_cast<size_t>(__builtin_ctz(hit)));
    }
#endif
    for (; j < n; ++j)
        if (logits[j] == best) return static_cast<int32_t>(j);
    return 0;  // not reached: best is one of the logits
}

std::pair<int32_t, float> parse_logit_bias(std::string_view text) {
    const auto fail = [&](const std::string& why) -> std::pair<int32_t, float> {
        throw Error("--logit-bias '" + std::string(text) + "': " + why);
    };
    const size_t eq = text.find('=');
    if (eq == std::string_view::npos) return fail("expected ID=BIAS, e.g. 13=-100");
    const std::string id(text.substr(0, eq)), bias(text.substr(eq + 1));
    if (id.empty() || id.size() > 10 || id.find_first_not_of("0123456789") != std::string::npos ||
        std::stoull(id) > static_cast<uint64_t>(INT32_MAX))
        return fail("the token id must be a non-negative integer");
    float b = 0.0f;
    const auto [end, ec] = std::from_chars(bias.data(), bias.data() + bias.size(), b);
    if (bias.empty() || ec != std::errc() || end != bias.data() + bias.size() ||
        !(b >= -100.0f && b <= 100.0f))
        return fail("the bias must be a number in [-100, 100]");
    return {static_cast<int32_t>(std::stoull(id)), b};
}

Sampler::Sampler(SamplingParams params, std::span<const int32_t> context)
    : params_(std::move(params)), rng_(params_.seed) {
    if (!(params_.temperature >= 0.0f) || !std::isfinite(params_.temperature))
        throw Error("temperature must be a finite number >= 0");
    if (!(params_.top_p > 0.0f && params_.top_p <= 1.0f)) throw Error("top-p must be in (0, 1]");
    if (!(params_.min_p >= 0.0f && params_.min_p <= 1.0f)) throw Error("min-p must be in [0, 1]");
    if (!(params_.presence_penalty >= -2.0f && params_.presence_penalty <= 2.0f))
        throw Error("the presence penalty must be in [-2, 2]");
    if (!(params_.frequency_penalty >= -2.0f && params_.frequency_penalty <= 2.0f))
        throw Error("the frequency penalty must be in [-2, 2]");
    if (!(params_.repetition_penalty >= kMinRepetitionPenalty &&
          params_.repetition_penalty <= kMaxRepetitionPenalty))
        throw Error("the repetition penalty must be in [0.01, 100]");
    for (const auto& [id, bias] : params_.logit_bias)
        if (id < 0 || !(bias >= -100.0f && bias <= 100.0f))
            throw Error("logit bias " + std::to_string(bias) + " for token " + std::to_string(id) +
                        ": the id must be >= 0 and the bias in [-100, 100]");
    if (params_.grammar) matcher_.emplace(params_.grammar);
    if (repeats()) {
        const uint64_t n = context.size(), last = params_.repetition_last_n;
        context_.assign(
            context.begin() + static_cast<std::ptrdiff_t>(last && n > last ? n - last : 0),
            context.end());
    }
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

std::span<const float> Sampler::adjusted(std::span<const float> logits) {
    if (chosen_.empty() && params_.logit_bias.empty() && context_.empty()) return logits;
    adjusted_.assign(logits.begin(), logits.end());
    for (const auto& [id, bias] : params_.logit_bias)
        if (static_cast<size_t>(id) < adjusted_.size()) adjusted_[static_cast<size_t>(id)] += bias;
    if (!context_.empty()) {
        const float p = params_.repetition_penalty;
        const uint64_t n = context_.size(), last = params_.repetition_last_n;
        if (penalised_.size() < adjusted_.size()) penalised_.resize(adjusted_.size(), 0);
        ++choice_;
        for (uint64_t i = last && n > last ? n - last : 0; i < n; ++i) {
            const auto id = static_cast<size_t>(context_[i]);  // a negative id: past the end
            if (id >= adjusted_.size() || penalised_[id] == choice_) continue;
            penalised_[id] = choice_;
            float& v = adjusted_[id];
            v = v > 0.0f ? v / p : v * p;
        }
    }
    for (int32_t id : chosen_) {
        if (static_cast<size_t>(id) >= adjusted_.size()) continue;
        float& v = adjusted_[static_cast<size_t>(id)];
        v -= static_cast<float>(counts_[static_cast<size_t>(id)]) * params_.frequency_penalty;
        v -= params_.presence_penalty;
    }
    return adjusted_;
}

int32_t Sampler::sample(std::span<const float> logits) {
    const int32_t id = matcher_ ? choose_allowed(adjusted(logits)) : choose(adjusted(logits));
    if (repeats()) {
        context_.push_back(id);
        // The window's tokens stay at the end; the ones before it go once they are as many.
        const uint64_t last = params_.repetition_last_n;
        if (last && context_.size() >= 2 * last)
            context_.erase(context_.begin(), context_.end() - static_cast<std::ptrdiff_t>(last));
    }
    if (params_.presence_penalty == 0.0f && params_.frequency_penalty == 0.0f) return id;
    const auto i = static_cast<size_t>(id);
    if (i >= counts_.size()) counts_.resize(i + 1, 0);
    if (counts_[i]++ == 0) chosen_.push_back(id);
    return id;
}

int32_t Sampler::choose_allowed(std::span<const float> logits) {
    // Greedy: the most likely token is the masked logits' first maximum too when it is allowed
    // (no earlier id holds its value), which it mostly is; the mask only when it is not.
    if (params_.temperature == 0.0f || logits.size() == 1) {
        const int32_t best = argmax(logits);
        if (matcher_->allows(best)) {
            matcher_->accept(best);
            return best;
        }
    }
    masked_.assign(logits.begin(), logits.end());
    if (matcher_->mask(masked_) == 0)
        throw Error(
            "constrained generation: no token of the vocabulary continues the document here");
    const int32_t id = choose(masked_);
    matcher_->accept(id);
    return id;
}

int32_t Sampler::choose(std::span<const float> logits) {
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
    // Min-p: the tokens at least min_p times as likely as the first (p[0] = 1), a prefix.
    if (params_.min_p > 0.0f) {
        size_t cut = 1;
        while (cut < keep && p[cut] >= static_cast<double>(params_.min_p)) ++cut;
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
