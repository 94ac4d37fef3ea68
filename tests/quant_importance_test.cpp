// The importance-weighted grid search (quant/rtn_importance.hpp) against a float64 brute force
// written here from the header's list of candidates; the weighted choice never has a larger
// weighted error than the unweighted one or the min-max grid; zero importance keeps the min-max
// grid byte for byte; RTN rows, GPTQ with a diagonal H and thread counts agree.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.hpp"
#include "formats/qtype.hpp"
#include "quant/gptq.hpp"
#include "quant/rtn.hpp"
#include "quant/rtn_importance.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

namespace quant_importance_test {

using namespace qforge;

namespace {

struct Grid {
    uint16_t scale_bits;
    int32_t zero;
};

// The search's summation order (rtn_importance.hpp): term j into partial sum j mod 8, the eight
// added as ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)).
struct Sum8 {
    double s[8] = {};
    size_t n = 0;
    void operator+=(double v) { s[n++ % 8] += v; }
    operator double() const {
        return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
};

// The stored quantizer's code for w (formats/qtype.hpp: round to nearest even, clamped).
int32_t ref_code(QType t, float scale, int32_t zero, float w) {
    if (scale == 0.0f) return zero;
    const double r = static_cast<double>(std::nearbyint(w / scale)) + zero;
    const double lo = qtype_traits(t).bits == 8 ? -127 : 0;
    const double hi = qtype_traits(t).bits == 8 ? 127 : (1 << qtype_traits(t).bits) - 1;
    return static_cast<int32_t>(std::clamp(r, lo, hi));
}

double ref_error(QType t, Grid g, const std::vector<float>& w, const std::vector<double>& a) {
    const float s = f16_to_f32(g.scale_bits);
    Sum8 e;
    for (size_t j = 0; j < w.size(); ++j) {
        const double d = double(w[j]) - double(s * float(ref_code(t, s, g.zero, w[j]) - g.zero));
        e += a[j] * d * d;
    }
    return e;
}

// Every candidate of the header's list, in its order (nullopt entries are skipped ones).
std::vector<Grid> ref_candidates(QType t, const std::vector<float>& w, const std::vector<double>& a,
                                 bool weighted) {
    const QTypeTraits& tr = qtype_traits(t);
    const int maxq = tr.bits == 8 ? 127 : (1 << tr.bits) - 1;
    std::vector<Grid> out;
    const auto p0 = *qtype_group_params(t, w.data(), w.size());
    out.push_back({p0.scale_bits, p0.zero});
    auto half = [](double s, int32_t z, std::vector<Grid>& o) {
        const uint16_t h = f32_to_f16(float(s));
        if (std::isfinite(s) && (h & 0x7c00) != 0x7c00 && (h & 0x7fff) != 0) o.push_back({h, z});
    };
    auto zero_of = [&](double z) {
        return int32_t(std::clamp(std::nearbyint(z), 0.0, double(maxq)));
    };
    auto fit = [&](Grid trial, const std::vector<double>& wt, std::vector<Grid>& o) {
        const float ts = f16_to_f32(trial.scale_bits);
        std::vector<double> c(w.size());
        for (size_t j = 0; j < w.size(); ++j) c[j] = ref_code(t, ts, trial.zero, w[j]);
        int32_t z = tr.implicit_zero;
        if (!tr.symmetric) {
            // Normal equations of min sum wt (w - s c - o)^2.
            Sum8 s00, s01, s11, b0, b1;
            for (size_t j = 0; j < w.size(); ++j) {
                s00 += wt[j] * c[j] * c[j];
                s01 += wt[j] * c[j];
                s11 += wt[j];
                b0 += wt[j] * w[j] * c[j];
                b1 += wt[j] * w[j];
            }
            const double det = s00 * s11 - s01 * s01;
            if (!(det > 0)) return;
            const double s = (b0 * s11 - s01 * b1) / det, off = (s00 * b1 - s01 * b0) / det;
            if (!(s > 0)) return;
            z = zero_of(-off / s);
        }
        Sum8 num, den;
        for (size_t j = 0; j < w.size(); ++j) {
            num += wt[j] * w[j] * (c[j] - z);
            den += wt[j] * (c[j] - z) * (c[j] - z);
        }
        if (!(den > 0) || (!tr.symmetric && !(num / den > 0))) return;
        half(num / den, z, o);
    };
    float lo = 0, hi = 0, m = 0;
    for (float v : w) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        if (std::fabs(v) > std::fabs(m)) m = v;
    }
    const double span = tr.symmetric ? (tr.bits == 8 ? 127 : 8) : maxq;
    const std::vector<double> ones(w.size(), 1.0);
    for (int i = 0; i < kImportanceSteps; ++i) {
        const double d = span + (i - kImportanceSteps / 2) / 10.0;
        std::vector<Grid> trial;
        if (tr.symmetric) {
            half(tr.bits == 8 ? std::fabs(m) / d : m / -d, tr.implicit_zero, trial);
        } else {
            std::vector<Grid> s;
            half((double(hi) - lo) / d, 0, s);
            if (!s.empty())
                half(f16_to_f32(s[0].scale_bits), zero_of(-lo / f16_to_f32(s[0].scale_bits)),
                     trial);
        }
        if (trial.empty()) continue;
        out.push_back(trial[0]);
        fit(trial[0], weighted ? a : ones, out);
        if (weighted) fit(trial[0], ones, out);
    }
    return out;
}

Grid brute_force(QType t, const std::vector<float>& w, const std::vector<double>& a,
                 bool weighted) {
    const auto cands = ref_candidates(t, w, a, weighted);
    Grid best = cands[0];
    double best_e = ref_error(t, best, w, a);
    for (const Grid& g : cands) {
        const double e = ref_error(t, g, w, a);
        if (e < best_e) {
            best_e = e;
            best = g;
        }
    }
    return best;
}

constexpr QType kTypes[] = {QType::q4_g32, QType::q4s_g32, QType::q3_g32, QType::q8_g32,
                            QType::q4_g128};

// A group with a few outliers and importance spanning four decades, as real activations do.
void random_group(std::mt19937& rng, size_t n, std::vector<float>& w, std::vector<double>& a) {
    std::normal_distribution<float> g(0.0f, 0.02f);
    std::uniform_real_distribution<double> u(-2.0, 2.0);
    w.resize(n);
    a.resize(n);
    for (size_t j = 0; j < n; ++j) {
        w[j] = g(rng) * (j % 11 == 3 ? 6.0f : 1.0f) + (rng() % 3 == 0 ? 0.01f : 0.0f);
        a[j] = std::pow(10.0, u(rng));
    }
}

// Level types (q4nl_*): the level nearest w / scale (the lower on ties), its error, and the
// header's candidates: min-max, then m / -(127 + i) and m / (113 + i), i = -10 .. 10, each with
// its weighted (and, weighted, also unweighted) refit sum a w l / sum a l^2.
int32_t level_code(const int8_t* levels, float scale, float w) {
    const double x = scale == 0.0f ? 0.0 : static_cast<double>(w / scale);
    int32_t best = 0;
    for (int32_t c = 1; c < 16; ++c)
        if (std::fabs(x - levels[c]) < std::fabs(x - levels[best])) best = c;
    return best;
}

double level_error(const int8_t* levels, uint16_t scale_bits, const std::vector<float>& w,
                   const std::vector<double>& a) {
    const float s = f16_to_f32(scale_bits);
    Sum8 e;
    for (size_t j = 0; j < w.size(); ++j) {
        const double d = double(w[j]) - double(s * float(levels[level_code(levels, s, w[j])]));
        e += a[j] * d * d;
    }
    return e;
}

uint16_t level_brute_force(QType t, const std::vector<float>& w, const std::vector<double>& a,
                           bool weighted) {
    const int8_t* levels = qtype_traits(t).levels;
    std::vector<uint16_t> cands = {qtype_group_params(t, w.data(), w.size())->scale_bits};
    auto half = [](double s, std::vector<uint16_t>& o) {
        const uint16_t h = f32_to_f16(float(s));
        if (std::isfinite(s) && (h & 0x7c00) != 0x7c00 && (h & 0x7fff) != 0) o.push_back(h);
    };
    auto fit = [&](uint16_t trial, const std::vector<double>& wt) {
        Sum8 num, den;
        for (size_t j = 0; j < w.size(); ++j) {
            const double l = levels[level_code(levels, f16_to_f32(trial), w[j])];
            num += wt[j] * w[j] * l;
            den += wt[j] * l * l;
        }
        if (den > 0) half(num / den, cands);
    };
    float m = 0;
    for (float v : w)
        if (std::fabs(v) > std::fabs(m)) m = v;
    const std::vector<double> ones(w.size(), 1.0);
    for (int i = 0; i < kImportanceSteps; ++i)
        for (double d : {-(127.0 + i - kImportanceSteps / 2), 113.0 + i - kImportanceSteps / 2}) {
            std::vector<uint16_t> trial;
            half(m / d, trial);
            if (trial.empty()) continue;
            cands.push_back(trial[0]);
            fit(trial[0], weighted ? a : ones);
            if (weighted) fit(trial[0], ones);
        }
    uint16_t best = cands[0];
    for (uint16_t c : cands)
        if (level_error(levels, c, w, a) < level_error(levels, best, w, a)) best = c;
    return best;
}

}  // namespace

TEST_CASE(
    "importance grid, level types: the brute force's, never worse than unweighted or "
    "min-max",
    "[quant][importance]") {
    std::mt19937 rng(17);
    int better = 0, total = 0;
    for (const QTypeTraits& tr : kQTypes) {
        if (!tr.levels) continue;
        for (size_t n : {size_t{1}, size_t{5}, size_t{12}, size_t{32}}) {
            for (int trial = 0; trial < 40; ++trial) {
                std::vector<float> w;
                std::vector<double> a;
                random_group(rng, n, w, a);
                INFO(tr.name << " n " << n << " trial " << trial);
                const auto weighted = *importance_group_grid(tr.type, w.data(), a.data(), n);
                const auto plain = *importance_group_grid(tr.type, w.data(), nullptr, n);
                REQUIRE(weighted.zero == 0);
                REQUIRE(weighted.scale_bits == level_brute_force(tr.type, w, a, true));
                REQUIRE(plain.scale_bits ==
                        level_brute_force(tr.type, w, std::vector<double>(n, 1.0), false));
                const double ew = level_error(tr.levels, weighted.scale_bits, w, a);
                const double eu = level_error(tr.levels, plain.scale_bits, w, a);
                const auto mm = *qtype_group_params(tr.type, w.data(), n);
                REQUIRE(ew <= eu);
                REQUIRE(ew <= level_error(tr.levels, mm.scale_bits, w, a));
                REQUIRE(importance_grid_error(tr.type, weighted, w.data(), a.data(), n) == ew);
                better += ew < eu;
                ++total;
            }
        }
    }
    INFO(better << " of " << total);
    REQUIRE(better > total / 2);
}

TEST_CASE("importance grid: equals the brute force, never worse than unweighted or min-max",
          "[quant][importance]") {
    std::mt19937 rng(7);
    int better = 0, total = 0;
    for (QType t : kTypes) {
        for (size_t n : {size_t{1}, size_t{5}, size_t{12}, size_t{32}}) {
            for (int trial = 0; trial < 40; ++trial) {
                std::vector<float> w;
                std::vector<double> a;
                random_group(rng, n, w, a);
                INFO(qtype_traits(t).name << " n " << n << " trial " << trial);
                const auto weighted = *importance_group_grid(t, w.data(), a.data(), n);
                const auto plain = *importance_group_grid(t, w.data(), nullptr, n);
                const Grid ref = brute_force(t, w, a, true);
                const Grid ref_plain = brute_force(t, w, std::vector<double>(n, 1.0), false);
                REQUIRE(weighted.scale_bits == ref.scale_bits);
                REQUIRE(weighted.zero == ref.zero);
                REQUIRE(plain.scale_bits == ref_plain.scale_bits);
                REQUIRE(plain.zero == ref_plain.zero);
                const double ew = ref_error(t, {weighted.scale_bits, weighted.zero}, w, a);
                const double eu = ref_error(t, {plain.scale_bits, plain.zero}, w, a);
                const auto mm = *qtype_group_params(t, w.data(), n);
                REQUIRE(ew <= eu);
                REQUIRE(ew <= ref_error(t, {mm.scale_bits, mm.zero}, w, a));
                REQUIRE(importance_grid_error(t, weighted, w.data(), a.data(), n) == ew);
                better += ew < eu;
                ++total;
            }
        }
    }
    // The weights matter: on most groups of several weights the weighted choice is strictly
    // better on its own objective.
    INFO(better << " of " << total);
    REQUIRE(better > total / 2);
}

TEST_CASE("importance grid: zero importance keeps the min-max grid, rows pack as the reference",
          "[quant][importance]") {
    std::mt19937 rng(11);
    for (QType t : {QType::q4_g32, QType::q4s_g32, QType::q3_g32, QType::q8_g32, QType::q4_g128,
                    QType::q4nl_g32, QType::q4t_g32}) {
        INFO(qtype_traits(t).name);
        const uint64_t k = 172;  // a partial last group
        std::vector<float> w;
        std::vector<double> a;
        random_group(rng, k, w, a);
        const uint64_t bytes = *qtype_row_bytes(t, k);
        std::vector<uint8_t> ref(bytes), got(bytes);
        REQUIRE(quantize_row_ref(t, w.data(), k, ref.data()) == QuantStatus::ok);
        const std::vector<double> zero(k, 0.0);
        REQUIRE(quantize_row_importance(t, w.data(), zero.data(), k, got.data()) ==
                QuantStatus::ok);
        REQUIRE(got == ref);
        // With importance: each group's grid is importance_group_grid's, codes by rounding.
        REQUIRE(quantize_row_importance(t, w.data(), a.data(), k, got.data()) == QuantStatus::ok);
        std::vector<float> deq(k);
        dequantize_row_ref(t, got.data(), k, deq.data());
        const uint64_t group = qtype_traits(t).group;
        // Learned-table types: the levels fitted with the same importance, stored in the row.
        int8_t levels[16] = {};
        if (qtype_has_row_levels(t)) {
            fit_row_levels(w.data(), a.data(), k, group, levels);
            REQUIRE(std::memcmp(levels, row_levels(t, got.data(), k), 16) == 0);
        }
        for (uint64_t b = 0; b < k; b += group) {
            const uint64_t n = std::min(group, k - b);
            const auto p = *importance_group_grid(t, w.data() + b, a.data() + b, n, levels);
            for (uint64_t j = b; j < b + n; ++j)
                REQUIRE(deq[j] == qtype_dequantize_value(t, p, qtype_quantize_value(t, p, w[j])));
        }
    }
}

TEST_CASE("importance RTN: thread-independent, and GPTQ with a diagonal H is importance RTN",
          "[quant][importance][gptq]") {
    std::mt19937 rng(3);
    const uint64_t rows = 9, k = 96;
    std::vector<float> w;
    std::vector<double> a;
    random_group(rng, rows * k, w, a);
    a.resize(k);
    const std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(w.data()), w.size() * 4);
    for (QType t : {QType::q4_g32, QType::q4s_g32, QType::q8}) {
        INFO(qtype_traits(t).name);
        const uint64_t bytes = *qtype_row_bytes(t, k) * rows;
        std::vector<uint8_t> one(bytes), two(bytes), plain(bytes);
        ThreadPool pool(2);
        REQUIRE_FALSE(rtn_quantize(QType::f32, in, rows, k, t, one, nullptr, a.data()));
        REQUIRE_FALSE(rtn_quantize(QType::f32, in, rows, k, t, two, &pool, a.data()));
        REQUIRE_FALSE(rtn_quantize(QType::f32, in, rows, k, t, plain, &pool));
        REQUIRE(one == two);
        REQUIRE(one != plain);
        // H = diag(a): no column's error reaches another, so GPTQ rounds each weight on its
        // group's grid from the unchanged weights: importance RTN exactly.
        std::vector<double> h(k * k, 0.0);
        for (uint64_t c = 0; c < k; ++c) h[c * k + c] = a[c];
        GptqOptions o;
        o.qtype = t;
        o.importance = true;
        o.measure = false;
        REQUIRE(gptq_quantize(w.data(), rows, k, h, o, &pool).packed == one);
        o.mse = kGptqMseNorm;
        REQUIRE_THROWS_WITH(gptq_quantize(w.data(), rows, k, h, o),
                            Catch::Contains("importance-weighted grid search and mse"));
    }
}

}  // namespace quant_importance_test
