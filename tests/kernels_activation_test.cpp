// kernels/cpu/activation: silu_mul and exp_shifted at every instruction-set level this CPU has,
// against float64, over the whole range the runtime meets (and past its flush and overflow
// edges); the scalar level against the runtime's former expressions bit for bit; and the
// property the runtime relies on: an element's value does not depend on n or on where it lies.
//
// Tolerances (u = 2^-24), from the avx2 exp's own analysis (activation.cpp): the reduced argument
// carries one rounding (below u |r|, |r| <= ln2 / 2), the polynomial's approximation error is
// below 2u, the last fused step and the add of 1 one rounding each, the scaling by 2^k none: exp
// within 4u of the exact value relative, or FLT_MIN absolute where it flushes to 0. SiLU adds the
// rounding of 1 + e (e's error enters scaled by e / (1 + e) <= 1), the division and the product
// with up: 8u relative, plus |up| 2^-110 absolute where exp(-g) overflows (the exact SiLU is
// below |g| e^-88 there). std::exp (scalar) is within 1 ulp, inside the same bounds.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/isa.hpp"

namespace kernels_activation_test {

using namespace qforge;

namespace {

constexpr double kU = 1.0 / (1 << 24);

// Arguments from -range to range: a dense even sweep, then random values, then special points.
std::vector<float> arguments(float range, uint32_t seed) {
    std::vector<float> v;
    for (int i = -4000; i <= 4000; ++i) v.push_back(range * static_cast<float>(i) / 4000.0f);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-range, range);
    for (int i = 0; i < 3001; ++i) v.push_back(dist(rng));  // odd: a partial last vector
    for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f * 0.6931472f, -0.5f * 0.6931472f})
        v.push_back(x);
    return v;
}

}  // namespace

TEST_CASE("activation: silu_mul at every level against float64", "[kernels][activation]") {
    const std::vector<float> g = arguments(100.0f, 1);
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<float> up(g.size());
    for (float& u : up) u = dist(rng);
    for (Isa isa : cpu_isa_levels()) {
        INFO("level " << isa_name(isa));
        std::vector<float> out(g.size(), std::numeric_limits<float>::quiet_NaN());
        silu_mul(isa, g.data(), up.data(), out.data(), g.size());
        for (size_t i = 0; i < g.size(); ++i) {
            INFO("gate " << g[i] << " up " << up[i]);
            const double x = g[i];
            const double exact = x / (1.0 + std::exp(-x)) * up[i];
            REQUIRE(std::fabs(out[i] - exact) <=
                    8.0 * kU * std::fabs(exact) + std::fabs(up[i]) * 0x1p-110);
        }
        // In place (out == gate), as the runtime calls it.
        std::vector<float> same = g;
        silu_mul(isa, same.data(), up.data(), same.data(), g.size());
        CHECK(std::memcmp(same.data(), out.data(), 4 * g.size()) == 0);
    }
}

TEST_CASE("activation: exp_shifted at every level against float64", "[kernels][activation]") {
    for (float shift : {0.0f, 3.5f, -7.25f}) {
        std::vector<float> s = arguments(120.0f, 3);
        for (Isa isa : cpu_isa_levels()) {
            INFO("level " << isa_name(isa) << " shift " << shift);
            std::vector<float> v = s;
            exp_shifted(isa, v.data(), v.size(), shift);
            for (size_t i = 0; i < s.size(); ++i) {
                INFO("s " << s[i]);
                const double arg =
                    static_cast<double>(s[i] - shift);  // the kernel's float argument
                const double exact = std::exp(arg);
                if (arg > 88.3762626647949) {  // overflow edge: +inf (scalar: std::exp's value)
                    CHECK((std::isinf(v[i]) || std::fabs(v[i] - exact) <= 4.0 * kU * exact));
                    continue;
                }
                REQUIRE(std::fabs(v[i] - exact) <=
                        4.0 * kU * exact + std::numeric_limits<float>::min());
            }
        }
    }
}

TEST_CASE("activation: special values", "[kernels][activation]") {
    const float inf = std::numeric_limits<float>::infinity(),
                nan = std::numeric_limits<float>::quiet_NaN();
    for (Isa isa : cpu_isa_levels()) {
        INFO("level " << isa_name(isa));
        std::vector<float> s = {nan, -inf, 0.0f, -200.0f, 200.0f};
        exp_shifted(isa, s.data(), s.size(), 0.0f);
        CHECK(std::isnan(s[0]));
        CHECK(s[1] == 0.0f);
        CHECK(s[2] == 1.0f);
        CHECK(s[3] == 0.0f);
        CHECK(s[4] == inf);
        const std::vector<float> g = {nan, inf, 200.0f, -200.0f}, up = {1.0f, 1.0f, 2.0f, 3.0f};
        std::vector<float> out(g.size());
        silu_mul(isa, g.data(), up.data(), out.data(), g.size());
        CHECK(std::isnan(out[0]));
        CHECK(out[1] == inf);
        CHECK(out[2] == 400.0f);
        CHECK(out[3] == 0.0f);
    }
}

TEST_CASE("activation: scalar is the runtime's former expression", "[kernels][activation]") {
    const std::vector<float> g = arguments(30.0f, 4);
    std::vector<float> up(g.size(), 1.25f), out(g.size());
    silu_mul(Isa::scalar, g.data(), up.data(), out.data(), g.size());
    std::vector<float> s = g;
    exp_shifted(Isa::scalar, s.data(), s.size(), 1.5f);
    for (size_t i = 0; i < g.size(); ++i) {
        const float former = g[i] / (1.0f + std::exp(-g[i])) * up[i];
        REQUIRE(std::memcmp(&out[i], &former, 4) == 0);
        const float e = std::exp(g[i] - 1.5f);
        REQUIRE(std::memcmp(&s[i], &e, 4) == 0);
    }
}

// Each element alone (n = 1), and the array cut at every offset of a vector: the same bits.
TEST_CASE("activation: an element's value does not depend on n or its place",
          "[kernels][activation]") {
    const std::vector<float> g = arguments(20.0f, 5);
    std::vector<float> up(g.size(), 0.75f);
    for (Isa isa : cpu_isa_levels()) {
        INFO("level " << isa_name(isa));
        std::vector<float> whole(g.size()), ex = g;
        silu_mul(isa, g.data(), up.data(), whole.data(), g.size());
        exp_shifted(isa, ex.data(), ex.size(), 0.5f);
        for (uint64_t cut = 1; cut < 9; ++cut) {
            std::vector<float> parts(g.size()), ep = g;
            for (uint64_t i = 0; i < g.size(); i += cut) {
                const uint64_t m = std::min<uint64_t>(cut, g.size() - i);
                silu_mul(isa, g.data() + i, up.data() + i, parts.data() + i, m);
                exp_shifted(isa, ep.data() + i, m, 0.5f);
            }
            REQUIRE(std::memcmp(parts.data(), whole.data(), 4 * g.size()) == 0);
            REQUIRE(std::memcmp(ep.data(), ex.data(), 4 * g.size()) == 0);
        }
    }
}

// softmax: exp_shifted's exponentials of s - max, summed in the documented order (i mod 8 partial
// sums, then ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))), each times 1 / sum: the same bits
// as that composition written here, at every level, for lengths that end inside a vector; and
// within float64's softmax by (10 + n) u: each exp 4u, their sum 4u + (n - 1) u, 1 / sum and the
// product one rounding each.
TEST_CASE("activation: softmax at every level, its order and against float64",
          "[kernels][activation]") {
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0f, 4.0f);
    for (uint64_t n : {1u, 7u, 8u, 9u, 31u, 300u}) {
        std::vector<float> s(n);
        for (float& v : s) v = d(rng);
        for (Isa isa : cpu_isa_levels()) {
            INFO("level " << isa_name(isa) << " n " << n);
            std::vector<float> got = s, e = s;
            softmax(isa, got.data(), n);
            exp_shifted(isa, e.data(), n, *std::max_element(s.begin(), s.end()));
            float p[8] = {};
            for (uint64_t i = 0; i < n; ++i) p[i % 8] += e[i];
            const float inv =
                1.0f / (((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])));
            double mx = s[0], total = 0.0;
            for (float v : s) mx = std::max(mx, static_cast<double>(v));
            for (float v : s) total += std::exp(v - mx);
            for (uint64_t i = 0; i < n; ++i) {
                const float want = e[i] * inv;
                REQUIRE(std::memcmp(&got[i], &want, 4) == 0);
                const double exact = std::exp(s[i] - mx) / total;
                REQUIRE(std::fabs(got[i] - exact) <=
                        (10.0 + static_cast<double>(n)) * kU * exact + 1e-30);
            }
        }
    }
}

TEST_CASE("activation: rms_norm_row against float64", "[kernels][activation]") {
    // scale = fl(1 / sqrt(ss / d + eps)): ss is a sum of exact squares in double (relative error
    // below (d / 8 + 3) 2^-53 from the partial sums, their tree and the double steps), so the
    // float scale is within u = 2^-24 relative of the exact value plus that; x * scale and w * that
    // add one rounding each: 3u relative and the double part, times 1.01 for the products of
    // roundings; the accumulating form one more rounding of the computed sum (u of |y|, and
    // again 1.01).
    std::mt19937 rng(77);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    for (uint64_t d : {1u, 7u, 8u, 9u, 64u, 576u, 2049u})
        for (double eps : {1e-5, 1e-6})
            for (bool accumulate : {false, true}) {
                std::vector<float> x(d), w(d), y(d), start(d);
                for (auto& v : x) v = dist(rng);
                for (auto& v : w) v = dist(rng);
                for (auto& v : start) v = dist(rng);
                y = start;
                rms_norm_row(x.data(), w.data(), d, eps, y.data(), accumulate);
                long double ss = 0;
                for (float v : x) ss += static_cast<long double>(v) * v;
                const long double scale = 1.0L / std::sqrt(ss / d + eps);
                for (uint64_t i = 0; i < d; ++i) {
                    const long double norm = static_cast<long double>(w[i]) * x[i] * scale;
                    const long double want = accumulate ? start[i] + norm : norm;
                    const double dbl = (static_cast<double>(d) / 8 + 3) * std::ldexp(1.0, -53);
                    const double bound =
                        1.01 * ((3 * kU + dbl) * std::fabs(static_cast<double>(norm)) +
                                (accumulate ? kU * std::fabs(static_cast<double>(want)) : 0.0)) +
                        1e-37;
                    INFO("d " << d << " eps " << eps << " accumulate " << accumulate << " i " << i);
                    REQUIRE(std::fabs(static_cast<double>(y[i] - want)) <= bound);
                }
            }
}

}  // namespace kernels_activation_test
