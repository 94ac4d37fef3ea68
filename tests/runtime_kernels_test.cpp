// The CPU backend's building blocks: the AVX2 dot product against the scalar one on odd lengths,
// exact widening of f16/bf16 rows, the thread pool's splits, RoPE frequencies and sampling.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "runtime/rope.hpp"
#include "runtime/sampling.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

namespace runtime_kernels_test {

using namespace qforge;

TEST_CASE("dot_row: AVX2 and scalar agree on odd lengths, widening is exact", "[runtime]") {
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (QType t : {QType::f32, QType::f16, QType::bf16}) {
        for (size_t n : {1u, 3u, 7u, 8u, 17u, 31u, 32u, 33u, 100u, 172u, 2048u}) {
            std::vector<float> w(n), x(n + 1);
            for (auto& v : w) v = dist(rng);
            for (auto& v : x) v = dist(rng);
            x[n] = std::nanf("");  // poison past the end: must never be read
            const auto row = test::float_bytes(t, w);
            double exact = 0.0, magnitude = 0.0;
            std::vector<float> widened(n);
            row_to_f32(t, row.data(), widened.data(), n);
            for (size_t i = 0; i < n; ++i) {
                exact += static_cast<double>(widened[i]) * x[i];
                magnitude += std::fabs(static_cast<double>(widened[i]) * x[i]);
                if (t == QType::f32) REQUIRE(widened[i] == w[i]);
            }
            const float fast = dot_row(t, row.data(), x.data(), n);
            const float scalar = dot_row_scalar(t, row.data(), x.data(), n);
            // float32 summation of n products in any order: at most n roundings (n - 1 adds and
            // the product) on a path from a term to the result, so the error is within
            // n u sum |w x| with u = 2^-24 (1.01: the second-order terms). float_dot's fixed
            // order has fewer; this bound holds for the scalar and the AVX2 path alike.
            const double bound = 1.01 * static_cast<double>(n) * 0x1p-24 * magnitude + 1e-30;
            INFO("qtype " << qtype_traits(t).name << " n " << n);
            REQUIRE(std::fabs(fast - exact) <= bound);
            REQUIRE(std::fabs(scalar - exact) <= bound);
            // Reading a widened row gives the same bits as reading the stored row.
            REQUIRE(dot_row(QType::f32, reinterpret_cast<const uint8_t*>(widened.data()), x.data(),
                            n) == fast);
        }
    }
}

TEST_CASE("dot_rows: each row's bits are dot_row's at every level, halves read side by side",
          "[runtime]") {
    // Row counts even, odd and 1 (the two runs' sizes differ by one, or there is no second run),
    // lengths with and without a 32-step tail, ranges from inside the matrix; each output against
    // dot_row (avx2 and above) or dot_row_scalar (scalar) on the same row.
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (Isa isa : cpu_isa_levels())
        for (QType t : {QType::f32, QType::f16, QType::bf16})
            for (size_t n : {7u, 32u, 100u, 2048u}) {
                const uint64_t rows = 9;
                std::vector<float> w(rows * n), x(n);
                for (auto& v : w) v = dist(rng);
                for (auto& v : x) v = dist(rng);
                const auto bytes = test::float_bytes(t, w);
                const uint64_t stride = bytes.size() / rows;
                for (auto [r0, r1] :
                     {std::pair<uint64_t, uint64_t>{0, 9}, {1, 9}, {2, 3}, {3, 7}}) {
                    std::vector<float> y(r1 - r0 + 1, std::nanf(""));
                    dot_rows(isa, t, bytes.data(), stride, r0, r1, x.data(), n, y.data());
                    INFO("level " << isa_name(isa) << " qtype " << qtype_traits(t).name << " n "
                                  << n << " rows " << r0 << ".." << r1);
                    for (uint64_t r = r0; r < r1; ++r) {
                        const uint8_t* row = bytes.data() + r * stride;
                        const float e = isa == Isa::scalar ? dot_row_scalar(t, row, x.data(), n)
                                                           : dot_row(t, row, x.data(), n);
                        REQUIRE(std::memcmp(&y[r - r0], &e, 4) == 0);
                    }
                    REQUIRE(std::isnan(y[r1 - r0]));  // nothing past the range written
                }
            }
}

TEST_CASE("thread pool: split_range covers every index once, run reaches every thread",
          "[runtime]") {
    for (size_t n : {0u, 1u, 5u, 64u, 1001u})
        for (size_t parts : {1u, 2u, 3u, 7u}) {
            size_t next = 0;
            for (size_t i = 0; i < parts; ++i) {
                auto [b, e] = split_range(n, parts, i);
                REQUIRE(b == next);
                REQUIRE(e - b <= n / parts + 1);
                next = e;
            }
            REQUIRE(next == n);
        }
    for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        REQUIRE(pool.size() == threads);
        for (int round = 0; round < 100; ++round) {
            std::vector<int> hits(1000, 0);
            pool.parallel_for(hits.size(), [&](size_t b, size_t e) {
                for (size_t i = b; i < e; ++i) ++hits[i];
            });
            for (int h : hits) REQUIRE(h == 1);
            std::atomic<int> calls{0};
            pool.run([&](int) { ++calls; });
            REQUIRE(calls == threads);
        }
    }
}

TEST_CASE("RoPE inverse frequencies: plain and llama3-scaled as transformers computes them",
          "[runtime]") {
    ModelConfig c;
    c.head_dim = 64;
    c.rope_theta = 500000.0;
    auto plain = rope_inv_freq(c);
    REQUIRE(plain.size() == 32);
    REQUIRE(plain[0] == 1.0);
    REQUIRE(plain[1] == Approx(std::pow(500000.0, -2.0 / 64)).epsilon(1e-15));

    // Llama 3.1: factor 8, low 1, high 4, original 8192. Wavelengths above 8192 are divided by
    // 8; below 2048 kept; between, (1 - s) f / 8 + s f with s = (8192 / wavelen - 1) / 3.
    c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
    auto scaled = rope_inv_freq(c);
    for (size_t i = 0; i < plain.size(); ++i) {
        const double wavelen = 2 * std::numbers::pi / plain[i];
        double expect = plain[i];
        if (wavelen > 8192) {
            expect = plain[i] / 8;
        } else if (wavelen >= 2048) {
            const double s = (8192 / wavelen - 1) / 3;
            expect = (1 - s) * plain[i] / 8 + s * plain[i];
        }
        INFO("i " << i << " wavelength " << wavelen);
        REQUIRE(scaled[i] == Approx(expect).epsilon(1e-15));
    }
    REQUIRE(scaled[0] == plain[0]);        // short wavelength: kept
    REQUIRE(scaled[31] == plain[31] / 8);  // long wavelength: divided
}

TEST_CASE("sampling: argmax is the plain scan's index on ties, zeros, infinities and NaN",
          "[runtime]") {
    // The reference: the first index whose logit no later one exceeds, one compare at a time.
    auto scan = [](const std::vector<float>& v) {
        size_t best = 0;
        for (size_t i = 1; i < v.size(); ++i)
            if (v[i] > v[best]) best = i;
        return static_cast<int32_t>(best);
    };
    const float nan = std::numeric_limits<float>::quiet_NaN(),
                inf = std::numeric_limits<float>::infinity();
    const float specials[] = {0.0f, -0.0f, inf, -inf, nan, 1.0f, -1.0f};
    std::mt19937 rng(7);
    for (size_t n : {1, 2, 15, 16, 17, 33, 49152 + 5}) {
        for (int trial = 0; trial < 40; ++trial) {
            std::vector<float> v(n);
            // Few distinct values (ties everywhere), then a few specials at random places.
            for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % 5)) - 2.0f;
            for (int s = 0; s < trial % 6; ++s) v[rng() % n] = specials[rng() % 7];
            if (trial % 9 == 0) v[0] = nan;
            if (trial % 13 == 0) std::fill(v.begin(), v.end(), nan);
            INFO("n " << n << " trial " << trial);
            REQUIRE(argmax(v) == scan(v));
        }
    }
}

TEST_CASE("sampling: greedy is argmax, a seed fixes the sequence, top-k and top-p cut",
          "[runtime]") {
    const std::vector<float> logits = {0.5f, 3.0f, 2.9f, -1.0f, 3.0f};
    REQUIRE(argmax(logits) == 1);  // lowest index on ties
    Sampler greedy({0.0f, 40, 0.95f, 1});
    REQUIRE(greedy.sample(logits) == 1);

    auto draw = [&](SamplingParams p) {
        Sampler s(p);
        std::vector<int32_t> out;
        for (int i = 0; i < 200; ++i) out.push_back(s.sample(logits));
        return out;
    };
    REQUIRE(draw({1.0f, 0, 1.0f, 5}) == draw({1.0f, 0, 1.0f, 5}));
    REQUIRE(draw({1.0f, 0, 1.0f, 5}) != draw({1.0f, 0, 1.0f, 6}));
    for (int32_t id : draw({1.0f, 2, 1.0f, 3})) REQUIRE((id == 1 || id == 4));  // top-2
    // top-p 0.5: tokens 1 and 4 (logit 3.0) hold 0.33 each, so the prefix reaching 0.5 is both.
    for (int32_t id : draw({1.0f, 0, 0.5f, 3})) REQUIRE((id == 1 || id == 4));
    // Frequencies follow the softmax at temperature 1 without cuts.
    Sampler s({1.0f, 0, 1.0f, 11});
    std::vector<int> counts(logits.size(), 0);
    const int n = 20000;
    for (int i = 0; i < n; ++i) ++counts[static_cast<size_t>(s.sample(logits))];
    double z = 0;
    for (float l : logits) z += std::exp(l);
    for (size_t i = 0; i < logits.size(); ++i) {
        const double p = std::exp(logits[i]) / z;
        // A frequency of n draws has standard deviation sqrt(p (1 - p) / n): 5 of them is
        // exceeded by an exact sampler with probability below 6e-7 per token (the seed is fixed,
        // so the outcome is deterministic anyway). The float32 softmax and the uniform draw's
        // 24-bit resolution shift p by far less than 1e-6; the 1e-3 floor covers it and keeps a
        // token of p near 0 from demanding an exact count.
        REQUIRE(std::fabs(counts[i] / double(n) - p) < 5 * std::sqrt(p * (1 - p) / n) + 1e-3);
    }
}

TEST_CASE("sampling: min-p keeps the tokens at least min_p times as likely as the first",
          "[runtime]") {
    const std::vector<float> logits = {0.5f, 3.0f, 2.75f, -1.0f, 3.0f, 1.5f, 2.0f, 2.9f, 0.0f};
    // Min-p: sampled as a plain sampler on the logits whose tokens below min_p times the most
    // likely one's probability at the temperature (in double) are made -inf.
    for (float min_p : {0.05f, 0.3f, 0.9f, 1.0f})
        for (float temperature : {0.7f, 1.0f, 1.5f}) {
            INFO("min_p " << min_p << " temperature " << temperature);
            SamplingParams sp{temperature, 0, 1.0f, 21};
            sp.min_p = min_p;
            Sampler with(sp), plain({temperature, 0, 1.0f, 21});
            const double top = *std::max_element(logits.begin(), logits.end());
            std::vector<float> ref = logits;
            size_t kept = 0;
            for (float& l : ref) {
                if (std::exp((double{l} - top) / temperature) < min_p)
                    l = -std::numeric_limits<float>::infinity();
                else
                    ++kept;
            }
            std::set<int32_t> seen;
            for (int step = 0; step < 200; ++step) {
                const int32_t w = plain.sample(ref), g = with.sample(logits);
                REQUIRE(g == w);
                seen.insert(g);
            }
            CHECK(seen.size() <= kept);
            if (min_p == 1.0f)  // the most likely alone (two ids share the top logit)
                for (int32_t id : seen) CHECK(logits[static_cast<size_t>(id)] == top);
        }
}

TEST_CASE("sampling: logit bias and the presence and frequency penalties follow the API",
          "[runtime]") {
    // Logits, biases and penalties in quarters: every adjusted logit is exact in float and
    // double, so the reference below (double, written from the API's description: the bias
    // added, then the penalties on the tokens chosen so far) decides every choice.
    const std::vector<float> logits = {0.5f, 3.0f, 2.75f, -1.0f, 3.0f, 1.5f, 2.0f};
    using Biases = std::vector<std::pair<int32_t, float>>;
    const Biases biases[] = {{}, {{2, 0.5f}, {1, -100.0f}, {99, 3.0f}}};  // 99: past the end
    auto adjusted = [&](const std::vector<int>& counts, double presence, double frequency,
                        const Biases& bias) {
        std::vector<double> b(logits.size(), 0.0);
        for (auto [id, v] : bias)
            if (static_cast<size_t>(id) < b.size()) b[static_cast<size_t>(id)] += v;
        std::vector<float> out(logits.size());
        for (size_t j = 0; j < logits.size(); ++j)
            out[j] = static_cast<float>(logits[j] + b[j] - counts[j] * frequency -
                                        (counts[j] > 0 ? presence : 0.0));
        return out;
    };
    const std::pair<float, float> penalties[] = {{0.5f, 0.25f}, {0.0f, 0.75f},  {1.25f, 0.0f},
                                                 {2.0f, 2.0f},  {-0.5f, 0.25f}, {0.0f, -0.25f},
                                                 {0.0f, 0.0f}};
    for (auto [presence, frequency] : penalties) {
        for (const Biases& bias : biases) {
            for (float temperature : {0.0f, 1.0f}) {
                INFO("presence " << presence << " frequency " << frequency << " biases "
                                 << bias.size() << " temperature " << temperature);
                // Adjusted, and plain on the logits the reference adjusted: the same generator
                // (seed), so the same tokens.
                Sampler with({temperature, 0, 1.0f, 9, presence, frequency, bias});
                Sampler plain({temperature, 0, 1.0f, 9});
                std::vector<int> counts(logits.size(), 0);
                std::vector<int32_t> got, want;
                for (int step = 0; step < 60; ++step) {
                    const std::vector<float> ref = adjusted(counts, presence, frequency, bias);
                    const int32_t w =
                        temperature == 0.0f
                            ? static_cast<int32_t>(std::max_element(ref.begin(), ref.end()) -
                                                   ref.begin())  // first maximum
                            : plain.sample(ref);
                    want.push_back(w);
                    got.push_back(with.sample(logits));
                    ++counts[static_cast<size_t>(w)];
                }
                REQUIRE(got == want);
                // Greedy: the tokens spread out under positive penalties; a negative frequency
                // penalty without presence repeats the first choice forever; -100 bans token 1.
                if (temperature == 0.0f) {
                    std::set<int32_t> distinct(got.begin(), got.end());
                    if (presence >= 0.0f && frequency > 0.0f) CHECK(distinct.size() >= 5);
                    if (frequency < 0.0f) CHECK(distinct.size() == 1);
                    if (!bias.empty()) CHECK(distinct.count(1) == 0);
                }
            }
        }
    }
    // The API's ranges, [-2, 2] and [-100, 100]; NaN and negative ids refused.
    for (float bad : {2.25f, -2.25f, std::numeric_limits<float>::quiet_NaN()}) {
        REQUIRE_THROWS_AS(Sampler({0.0f, 0, 1.0f, 1, bad, 0.0f}), Error);
        REQUIRE_THROWS_AS(Sampler({0.0f, 0, 1.0f, 1, 0.0f, bad}), Error);
        REQUIRE_THROWS_AS(Sampler({1.0f, 0, 1.0f, 1, 0.0f, 0.0f, {}, bad / 2.0f}), Error);
    }
    for (auto b : {std::pair{0, 100.5f}, std::pair{0, -101.0f}, std::pair{-1, 1.0f},
                   std::pair{0, std::numeric_limits<float>::quiet_NaN()}})
        REQUIRE_THROWS_AS(Sampler({0.0f, 0, 1.0f, 1, 0.0f, 0.0f, {b}}), Error);
    // `--logit-bias ID=BIAS`.
    CHECK(parse_logit_bias("13=-100") == std::pair{13, -100.0f});
    CHECK(parse_logit_bias("0=2.5") == std::pair{0, 2.5f});
    for (const char* bad :
         {"13", "=1", "a=1", "-1=1", "1=", "1=x", "1=100.5", "1=nan", "1=1x", "99999999999=1"})
        CHECK_THROWS_WITH(parse_logit_bias(bad), Catch::Contains("--logit-bias"));
}

TEST_CASE("sampling: the repetition penalty divides or multiplies the context's logits once",
          "[runtime]") {
    // The reference, in double, from transformers' RepetitionPenaltyLogitsProcessor (and vLLM's,
    // llama.cpp's): every distinct id among the context's last `window` tokens (the prompt, then
    // the chosen ones; 0: all) has its logit l made l / p if l > 0, else l * p; the bias before,
    // the API's penalties after. Logits and biases in quarters and p a power of two: every
    // adjusted logit is exact in float and double, so the reference decides every choice, sampled
    // (through a plain sampler on its logits, the same generator) as well as greedy.
    const std::vector<float> logits = {0.5f, 3.0f, 2.75f, -1.0f, 3.0f, 1.5f, 2.0f, -0.25f, 0.0f};
    const std::vector<int32_t> prompt = {4, 4, 7, 1, 99, 2};  // 99: past the end, ignored
    auto adjusted = [&](const std::vector<int32_t>& context, uint64_t window, double p,
                        const std::vector<int>& counts, double presence, int32_t biased) {
        std::vector<double> l(logits.begin(), logits.end());
        l[static_cast<size_t>(biased)] += 0.5;
        std::set<int32_t> seen;
        const size_t from = window && context.size() > window ? context.size() - window : 0;
        for (size_t i = from; i < context.size(); ++i) seen.insert(context[i]);
        for (int32_t id : seen)
            if (static_cast<size_t>(id) < l.size()) {
                double& v = l[static_cast<size_t>(id)];
                v = v > 0.0 ? v / p : v * p;
            }
        std::vector<float> out(l.size());
        for (size_t j = 0; j < l.size(); ++j)
            out[j] = static_cast<float>(l[j] - (counts[j] > 0 ? presence : 0.0));
        return out;
    };
    for (float p : {2.0f, 0.5f, 4.0f})
        for (uint64_t window : {0, 1, 3, 5, 8})
            for (float presence : {0.0f, 0.75f})
                for (float temperature : {0.0f, 1.0f}) {
                    INFO("p " << p << " window " << window << " presence " << presence
                              << " temperature " << temperature);
                    SamplingParams sp{temperature, 0, 1.0f, 13, presence, 0.0f, {{6, 0.5f}}};
                    sp.repetition_penalty = p;
                    sp.repetition_last_n = window;
                    Sampler with(sp, prompt), plain({temperature, 0, 1.0f, 13});
                    std::vector<int32_t> context = prompt, got, want;
                    std::vector<int> counts(logits.size(), 0);
                    for (int step = 0; step < 40; ++step) {
                        const std::vector<float> ref =
                            adjusted(context, window, p, counts, presence, 6);
                        const int32_t w =
                            temperature == 0.0f
                                ? static_cast<int32_t>(std::max_element(ref.begin(), ref.end()) -
                                                       ref.begin())
                                : plain.sample(ref);
                        want.push_back(w);
                        got.push_back(with.sample(logits));
                        context.push_back(w);
                        ++counts[static_cast<size_t>(w)];
                    }
                    REQUIRE(got == want);
                    // Greedy over the whole context: the first choice is one of the prompt's
                    // tokens (1 and 4 hold the top logit) only when p < 1 favours them.
                    if (temperature == 0.0f && window == 0) {
                        const bool in_prompt =
                            std::find(prompt.begin(), prompt.end(), got[0]) != prompt.end();
                        CHECK(in_prompt == (p < 1.0f));
                    }
                }
    // Realistic penalties are not powers of two: greedy against the double reference on
    // continuous logits (no two adjusted logits within float rounding of each other: checked).
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (float p : {1.1f, 1.3f, 0.8f}) {
        std::vector<float> wide(50);
        for (float& v : wide) v = normal(rng);
        std::vector<int32_t> context;
        for (int i = 0; i < 20; ++i) context.push_back(static_cast<int32_t>(rng() % 50));
        SamplingParams sp{0.0f, 0, 1.0f, 1};
        sp.repetition_penalty = p;
        sp.repetition_last_n = 12;
        Sampler s(sp, context);
        for (int step = 0; step < 60; ++step) {
            std::vector<double> ref(wide.begin(), wide.end());
            std::set<int32_t> seen(context.end() - 12, context.end());
            for (int32_t id : seen) {
                double& v = ref[static_cast<size_t>(id)];
                v = v > 0.0 ? v / double{p} : v * double{p};
            }
            std::vector<double> sorted = ref;
            std::sort(sorted.rbegin(), sorted.rend());
            REQUIRE(sorted[0] - sorted[1] > 1e-5 * std::fabs(sorted[0]));
            const auto w =
                static_cast<int32_t>(std::max_element(ref.begin(), ref.end()) - ref.begin());
            REQUIRE(s.sample(wide) == w);
            context.push_back(w);
            for (float& v : wide) v += 0.1f * normal(rng);  // the next step's logits
        }
    }
    // No penalty by default or at 1; a penalty must be in [0.01, 100].
    // (Near 0 a positive logit divided by it would overflow: [0.01, 100].)
    for (float bad : {0.0f, -1.0f, 0.005f, 100.5f, 1e-38f, std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
        SamplingParams sp{0.0f, 0, 1.0f, 1};
        sp.repetition_penalty = bad;
        REQUIRE_THROWS_AS(Sampler(sp, prompt), Error);
    }
    Sampler none({0.0f, 0, 1.0f, 1}, prompt);
    CHECK(none.sample(logits) == 1);
}

}  // namespace runtime_kernels_test
