// kernels/cpu/bf16_gemm: bf16 rows times activations rounded to bf16 (vdpbf16ps), against a
// float64 product of the same bf16 weights and the unrounded activations.
//
// Bound (u = 2^-24; bf16 keeps 8 significant bits, so rounding an activation moves it by at most
// 2^-8 of itself): with M = sum_j |w_j x_j|, the rounded activations move the exact product by at
// most 2^-8 M; each product of a bf16 weight and a bf16 activation is exact in f32, and an
// output's f32 chain adds 2 of them per pair (k + 1 adds at most) and sums nothing else, so its
// rounding error is at most (k + 1) u (1 + 2^-8) M. The factor 1.01 covers second-order terms;
// k 2^-126 covers flushed denormals. Then: bit equality across row ranges, token tiles, one token
// at a time (decode) and blocks of k, and NaN activations giving NaN.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "test_support.hpp"

using namespace qforge;

namespace {

struct Rows {
    uint64_t n, k;
    std::vector<uint16_t> bits;  // [n][k] bf16
    float w(uint64_t r, uint64_t j) const { return bf16_to_f32(bits[r * k + j]); }
};

Rows make_rows(uint64_t n, uint64_t k, uint32_t seed) {
    Rows m{n, k, std::vector<uint16_t>(n * k)};
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(-3.0f, 1.0f);
    for (uint64_t r = 0; r < n; ++r) {
        const float scale = std::pow(10.0f, mag(rng));
        for (uint64_t j = 0; j < k; ++j) m.bits[r * k + j] = f32_to_bf16(scale * dist(rng));
    }
    return m;
}

Bf16PackedRows pack(const Rows& m) {
    Bf16PackedRows p(m.n, m.k);
    p.pack(reinterpret_cast<const uint8_t*>(m.bits.data()), 2 * m.k, 0, 1);  // two calls, as
    p.pack(reinterpret_cast<const uint8_t*>(m.bits.data()), 2 * m.k, 1, p.tiles());  // threads
    return p;
}

}  // namespace

TEST_CASE("bf16_matmul is within the bf16-activation bound of a float64 product", "[bf16]") {
    if (!bf16_dot_available()) {
        WARN("this process has no AVX-512 BF16 at its level: the bf16 mode is not run here");
        Rows m = make_rows(3, 8, 1);
        const auto x = test::kernel_activations(1, 8, 2);
        Bf16Tokens t;
        t.prepare(x.data(), 1, 8);
        float out[3];
        REQUIRE_THROWS_AS(bf16_matmul(pack(m), 0, 3, t, 0, 1, out, 3), Error);
        return;
    }
    uint32_t seed = 10;
    for (uint64_t k : {uint64_t{1}, uint64_t{33}, uint64_t{576}, uint64_t{4100}})
        for (uint64_t tokens : {uint64_t{1}, uint64_t{3}, uint64_t{9}, uint64_t{17}}) {
            INFO("k " << k << " tokens " << tokens);
            const Rows m = make_rows(45, k, seed++);
            const auto x = test::kernel_activations(tokens, k, seed++);
            Bf16Tokens xt;
            xt.prepare(x.data(), tokens, k);
            const Bf16PackedRows p = pack(m);
            const uint64_t ldo = m.n + 2;
            std::vector<float> out(tokens * ldo, std::nanf(""));
            bf16_matmul(p, 0, m.n, xt, 0, tokens, out.data(), ldo);
            for (uint64_t t = 0; t < tokens; ++t) {
                REQUIRE(std::isnan(out[t * ldo + m.n]));  // past the rows: untouched
                REQUIRE(std::isnan(out[t * ldo + m.n + 1]));
                for (uint64_t r = 0; r < m.n; ++r) {
                    double exact = 0.0, mag = 0.0;
                    for (uint64_t j = 0; j < k; ++j) {
                        const double v = static_cast<double>(m.w(r, j)) * x[t * k + j];
                        exact += v;
                        mag += std::fabs(v);
                    }
                    const double bound =
                        1.01 * (0x1p-8 + static_cast<double>(k + 1) * 0x1p-24 * (1 + 0x1p-8)) *
                            mag +
                        static_cast<double>(k) * 0x1p-126;
                    REQUIRE(std::fabs(out[t * ldo + r] - exact) <= bound);
                }
            }
        }
}

TEST_CASE("bf16_matmul gives the same bits for any row range, token tile and block of k",
          "[bf16]") {
    if (!bf16_dot_available()) {
        WARN("this process has no AVX-512 BF16 at its level: the bf16 mode is not run here");
        return;
    }
    uint32_t seed = 50;
    for (uint64_t k : {uint64_t{33}, uint64_t{4100}}) {  // 4100: three blocks of 1024 pairs
        const uint64_t rows = 45, tokens = 11;
        const Rows m = make_rows(rows, k, seed++);
        auto x = test::kernel_activations(tokens, k, seed++);
        x[3 * k + k / 2] = std::nanf("");  // token 3: every output NaN
        Bf16Tokens xt;
        xt.prepare(x.data(), tokens, k);
        const Bf16PackedRows p = pack(m);
        std::vector<float> all(tokens * rows);
        bf16_matmul(p, 0, rows, xt, 0, tokens, all.data(), rows);
        for (uint64_t r = 0; r < rows; ++r) REQUIRE(std::isnan(all[3 * rows + r]));
        // One token at a time (decode), and rows from inside a tile with tokens from the middle.
        for (uint64_t t = 0; t < tokens; ++t) {
            std::vector<float> one(rows);
            bf16_matmul(p, 0, rows, xt, t, t + 1, one.data(), rows);
            REQUIRE(std::memcmp(one.data(), all.data() + t * rows, 4 * rows) == 0);
        }
        for (auto [r0, r1, t0, t1] :
             {std::array<uint64_t, 4>{5, 37, 2, 9}, {16, 45, 0, 11}, {33, 34, 10, 11}}) {
            INFO("rows " << r0 << ".." << r1 << " tokens " << t0 << ".." << t1);
            std::vector<float> part((t1 - t0) * (r1 - r0));
            bf16_matmul(p, r0, r1, xt, t0, t1, part.data(), r1 - r0);
            for (uint64_t t = t0; t < t1; ++t)
                REQUIRE(std::memcmp(part.data() + (t - t0) * (r1 - r0), all.data() + t * rows + r0,
                                    4 * (r1 - r0)) == 0);
        }
    }
}

TEST_CASE("Bf16Tokens rounds to nearest even and pairs the activations", "[bf16]") {
    // 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (bf16's spacing at 1): even -> 1; 1 + 3 * 2^-8 ties
    // to 1 + 2^-6 ... as f32_to_bf16, which core's half test checks against its definition.
    const std::vector<float> x = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f, std::nanf(""), 7.0f};
    Bf16Tokens t;
    t.prepare(x.data(), 1, x.size());
    REQUIRE(t.k() == 5);
    const uint32_t* p = t.pairs(0);
    REQUIRE((p[0] & 0xffffu) == 0x3f80u);  // 1.0
    REQUIRE((p[0] >> 16) == 0x3f82u);      // 1 + 2^-6
    REQUIRE((p[1] & 0xffffu) == f32_to_bf16(-2.5f));
    REQUIRE(std::isnan(bf16_to_f32(static_cast<uint16_t>(p[1] >> 16))));
    REQUIRE(p[2] == f32_to_bf16(7.0f));  // a last odd activation pairs with zero
}
