#include "runtime/perplexity.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "runtime/logits_check.hpp"

namespace qforge {

namespace {

// log(sum(exp(logits))) in float64, shifted by the maximum.
double log_sum_exp(std::span<const float> logits, double* max_out = nullptr) {
    double m = logits[0];
    for (float v : logits) m = std::max(m, static_cast<double>(v));
    double s = 0.0;
    for (float v : logits) s += std::exp(static_cast<double>(v) - m);
    if (max_out) *max_out = m;
    return m + std::log(s);
}

size_t argmax_index(std::span<const float> v) {
    size_t best = 0;
    for (size_t i = 1; i < v.size(); ++i)
        if (v[i] > v[best]) best = i;
    return best;
}

}  // namespace

std::optional<PplProtocol> ppl_protocol_from_name(std::string_view name) {
    if (name == "llamacpp") return PplProtocol::llamacpp;
    if (name == "gptq") return PplProtocol::gptq;
    return std::nullopt;
}

std::string_view ppl_protocol_name(PplProtocol p) {
    return p == PplProtocol::llamacpp ? "llamacpp" : "gptq";
}

namespace {

// The --ctx values that score some token of a text of n tokens, for messages. llamacpp scores
// positions ctx/2+1 .. ctx-1 (ctx >= 3) and needs 2 chunks; gptq scores 1 .. ctx-1 of a chunk.
std::string ctx_hint(PplProtocol protocol, uint64_t n_tokens) {
    const bool llamacpp = protocol == PplProtocol::llamacpp;
    const uint64_t lo = llamacpp ? 3 : 2, hi = llamacpp ? n_tokens / 2 : n_tokens;
    if (hi >= lo)
        return "--ctx " + std::to_string(lo) + " to " + std::to_string(hi) +
               " would score tokens of this text";
    std::string s = "the text is too short for the " + std::string(ppl_protocol_name(protocol)) +
                    " protocol at any --ctx (it needs " + std::to_string(2 * lo) + " tokens)";
    if (llamacpp && n_tokens >= 2)
        s += "; --protocol gptq with --ctx 2 to " + std::to_string(n_tokens) + " would score some";
    return s;
}

}  // namespace

PplPlan plan_perplexity(PplProtocol protocol, uint64_t n_tokens, uint64_t ctx, uint64_t max_chunks,
                        bool add_bos, std::optional<int32_t> bos_id) {
    if (ctx < 2) throw Error("--ctx must be at least 2, found " + std::to_string(ctx));
    const std::string what = "the " + std::string(ppl_protocol_name(protocol)) +
                             " protocol with --ctx " + std::to_string(ctx);
    const std::string text = "the text has " + std::to_string(n_tokens) + " tokens";
    if (protocol == PplProtocol::llamacpp && ctx / 2 + 1 >= ctx)
        throw Error(what +
                    " scores no token (it scores positions ctx/2+1 .. ctx-1 of each chunk); " +
                    text + ": " + ctx_hint(protocol, n_tokens));
    const uint64_t needed = protocol == PplProtocol::llamacpp ? 2 * ctx : ctx;
    if (n_tokens < needed)
        throw Error(text + "; " + what + " needs at least " + std::to_string(needed) + ": " +
                    ctx_hint(protocol, n_tokens));
    PplPlan plan;
    plan.protocol = protocol;
    plan.ctx = ctx;
    plan.n_chunks = n_tokens / ctx;
    if (max_chunks > 0) plan.n_chunks = std::min(plan.n_chunks, max_chunks);
    if (protocol == PplProtocol::llamacpp) {
        plan.first_scored = ctx / 2 + 1;
        if (add_bos && bos_id) plan.bos_replacement = *bos_id;
    } else {
        plan.first_scored = 1;
    }
    return plan;
}

double NllStats::ppl() const { return count ? std::exp(sum / static_cast<double>(count)) : 0.0; }

double NllStats::ppl_stderr() const {
    if (count < 2) return 0.0;
    const double n = static_cast<double>(count), mean = sum / n;
    const double var = std::max(0.0, sum2 / n - mean * mean);
    return ppl() * std::sqrt(var / (n - 1.0));
}

double KlStats::mean_kl() const { return count ? sum_kl / static_cast<double>(count) : 0.0; }

double KlStats::kl_stderr() const {
    if (count < 2) return 0.0;
    const double n = static_cast<double>(count), mean = sum_kl / n;
    return std::sqrt(std::max(0.0, sum_kl2 / n - mean * mean) / (n - 1.0));
}

double KlStats::top1_agreement() const {
    return count ? static_cast<double>(same_top) / static_cast<double>(count) : 0.0;
}

double KlStats::rms_dp() const {
    return count ? std::sqrt(sum_dp2 / static_cast<double>(count)) : 0.0;
}

double token_nll(std::span<const float> logits, int32_t target) {
    return log_sum_exp(logits) - static_cast<double>(logits[static_cast<size_t>(target)]);
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, uint32_t top) {
    const double lse = log_sum_exp(logits);
    auto logprob = [&](size_t i) {
        return static_cast<float>(static_cast<double>(logits[i]) - lse);
    };
    TokenLogprobs r;
    r.logprob = logprob(static_cast<size_t>(token));
    if (top == 0) return r;
    // The best `top` ids in one pass: a candidate enters only past the worst one kept.
    auto before = [&](size_t a, size_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::vector<size_t> best;
    const size_t k = std::min<size_t>(top, logits.size());
    best.reserve(k + 1);
    for (size_t i = 0; i < logits.size(); ++i) {
        if (best.size() == k && !before(i, best.back())) continue;
        best.insert(std::upper_bound(best.begin(), best.end(), i, before), i);
        if (best.size() > k) best.pop_back();
    }
    for (size_t i : best) r.top.emplace_back(static_cast<int32_t>(i), logprob(i));
    return r;
}

void add_kl(std::span<const float> base_logits, std::span<const float> logits, int32_t target,
            KlStats& s) {
    const double lse_base = log_sum_exp(base_logits), lse = log_sum_exp(logits);
    double kl = 0.0;
    for (size_t v = 0; v < logits.size(); ++v) {
        const double lp_base = base_logits[v] - lse_base, lp = logits[v] - lse;
        kl += std::exp(lp_base) * (lp_base - lp);
    }
    s.sum_kl += kl;
    s.sum_kl2 += kl * kl;
    s.same_top += argmax_index(base_logits) == argmax_index(logits);
    const auto t = static_cast<size_t>(target);
    const double dp = std::exp(logits[t] - lse) - std::exp(base_logits[t] - lse_base);
    s.sum_dp2 += dp * dp;
    ++s.count;
}

PplResult run_perplexity(Backend& model, Backend* base, std::span<const int32_t> tokens,
                         const PplPlan& plan, const PplProgress& progress) {
    const uint64_t vocab = model.model().config().vocab_size;
    if (base && base->model().config().vocab_size != vocab)
        throw Error(base->model().path(), {},
                    "--kl-base has a vocabulary of " +
                        std::to_string(base->model().config().vocab_size) + " tokens, the model " +
                        std::to_string(vocab));
    if (plan.n_chunks * plan.ctx > tokens.size())
        throw Error("perplexity plan is longer than the text");
    const auto start_time = std::chrono::steady_clock::now();

    auto cache = model.new_cache(plan.ctx);
    auto base_cache = base ? base->new_cache(plan.ctx) : nullptr;
    const uint64_t logits_from = plan.first_scored - 1;
    const uint64_t rows = plan.ctx - logits_from;
    std::vector<float> logits(rows * vocab), base_logits(base ? rows * vocab : 0);
    std::vector<int32_t> input(plan.ctx);

    PplResult result;
    if (base) {
        result.kl = KlStats{};
        result.base_nll = NllStats{};
    }
    for (uint64_t chunk = 0; chunk < plan.n_chunks; ++chunk) {
        const int32_t* text = tokens.data() + chunk * plan.ctx;
        std::copy(text, text + plan.ctx, input.begin());
        if (plan.bos_replacement) input[0] = *plan.bos_replacement;

        cache->clear();
        model.forward(input, *cache, logits_from, logits);
        if (base) {
            base_cache->clear();
            base->forward(input, *base_cache, logits_from, base_logits);
        }
        // Row r holds the logits at position logits_from + r, which score the token after it.
        for (uint64_t pos = plan.first_scored; pos < plan.ctx; ++pos) {
            const uint64_t r = pos - 1 - logits_from;
            const std::span<const float> row(logits.data() + r * vocab, vocab);
            const auto where = [&] {
                return "position " + std::to_string(pos - 1) + " of chunk " +
                       std::to_string(chunk) + " (text token " +
                       std::to_string(chunk * plan.ctx + pos - 1) + ", scoring the next)";
            };
            if (!all_finite(row)) throw_non_finite_logits(row, model.model().path(), where());
            result.nll.add(token_nll(row, text[pos]));
            if (base) {
                const std::span<const float> base_row(base_logits.data() + r * vocab, vocab);
                if (!all_finite(base_row))
                    throw_non_finite_logits(base_row, base->model().path(), where());
                add_kl(base_row, row, text[pos], *result.kl);
                result.base_nll->add(token_nll(base_row, text[pos]));
            }
        }
        result.n_chunks = chunk + 1;
        result.tokens_evaluated += plan.ctx;
        if (progress) progress(chunk + 1, result.nll);
    }
    // Whatever the plan, a result scored on no token is no result (PPL would print as 0).
    if (result.nll.count == 0)
        throw Error(model.model().path(), {},
                    "perplexity scored no token (" + std::to_string(plan.n_chunks) + " chunks of " +
                        std::to_string(plan.ctx) + ", " + std::to_string(plan.scored_per_chunk()) +
                        " scored per chunk)");
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
    return result;
}

}  // namespace qforge
