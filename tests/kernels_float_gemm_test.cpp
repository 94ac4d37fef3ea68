// kernels/cpu/float_gemm: the prefill GEMM of float rows (f32, f16, bf16) at every level this CPU
// has. Each output must be, bit for bit, the dot_row of its row and token at that level (scalar:
// dot_row_scalar; avx2 and avx512: dot_row's AVX2 kernel, which decode uses), for every shape of
// rows, tokens and k (k ending inside an 8-block, inside a 32-step, on and past a block of k),
// any row and token sub-range, strided and unaligned inputs; outputs poisoned first. Independently
// of dot_row, every output is within a derived bound of a float64 product.
//
// Bound (u = 2^-24): a float sum whose terms each pass through at most n roundings is within
// n u sum |terms| (first order; 1.01 covers the rest). Here a product enters one lane (rounded
// once, or fused into its add), one add per 32-step and per last 8-block (k / 32 + 3), then
// (a0 + a1) + (a2 + a3) (2), the lane tree (3) and the last < 8 products one by one (7):
// n <= k / 32 + 16 with M = sum_j |w_j x_j|.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "kernels/cpu/float_gemm.hpp"
#include "kernels/cpu/isa.hpp"

namespace kernels_float_gemm_test {

using namespace qforge;

namespace {

constexpr double kU = 0x1p-24;
constexpr QType kFloatTypes[] = {QType::f32, QType::f16, QType::bf16};

// n rows of k weights stored as t, `pad` bytes after each row (so stride > the row's bytes), and
// the same values as float (exact: every value is representable in t).
struct Rows {
    QType t;
    uint64_t n, k, stride;
    std::vector<uint8_t> bytes;
    std::vector<float> w;
    const uint8_t* data() const { return bytes.data(); }
};

Rows make_rows(QType t, uint64_t n, uint64_t k, uint64_t pad, uint32_t seed) {
    const uint64_t width = t == QType::f32 ? 4 : 2;
    Rows m{t, n, k, width * k + pad, {}, {}};
    m.bytes.assign(n * m.stride + 8, 0xa5);
    m.w.assign(n * k, 0.0f);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (uint64_t r = 0; r < n; ++r)
        for (uint64_t j = 0; j < k; ++j) {
            float v = (j * 7 + r) % 13 == 0 ? 0.0f : dist(rng) * (r % 3 == 0 ? 30.0f : 0.05f);
            uint8_t* at = m.bytes.data() + r * m.stride + width * j;
            if (t == QType::f32) {
                std::memcpy(at, &v, 4);
            } else {
                const uint16_t h = t == QType::f16 ? f32_to_f16(v) : f32_to_bf16(v);
                v = t == QType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
                std::memcpy(at, &h, 2);
            }
            m.w[r * k + j] = v;
        }
    return m;
}

// m tokens of k activations, ldx floats apart, with outliers as in real activations.
std::vector<float> make_tokens(uint64_t m, uint64_t k, uint64_t ldx, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(m * ldx, std::nanf(""));  // the gaps between tokens must not be read
    for (uint64_t t = 0; t < m; ++t)
        for (uint64_t j = 0; j < k; ++j) x[t * ldx + j] = dist(rng) * ((t * k + j) % 89 ? 1 : 40);
    return x;
}

// The level's dot_row; at avx2 and above both copies, prefetching the row ahead (the choice on
// Zen 5) and not, which must agree bit for bit.
float level_dot(Isa isa, QType t, const uint8_t* w, const float* x, uint64_t k) {
    if (isa == Isa::scalar) return dot_row_scalar(t, w, x, k);
    const float plain = detail::dot_row_avx2(t, w, x, k, false);
    const float ahead = detail::dot_row_avx2(t, w, x, k, true);
    REQUIRE(std::memcmp(&plain, &ahead, 4) == 0);
    return plain;
}

// float_matmul_isa over rows [r0, r1) and tokens [t0, t1) with ldo = rows + 2: the two extra
// columns must stay poisoned.
std::vector<float> run(Isa isa, const Rows& m, const uint8_t* w, const std::vector<float>& x,
                       uint64_t ldx, uint64_t r0, uint64_t r1, uint64_t t0, uint64_t t1) {
    const uint64_t ldo = r1 - r0 + 2;
    std::vector<float> out((t1 - t0) * ldo, std::nanf(""));
    float_matmul_isa(isa, m.t, w, m.stride, r0, r1, x.data(), ldx, m.k, t0, t1, out.data(), ldo);
    for (uint64_t tok = t0; tok < t1; ++tok) {
        REQUIRE(std::isnan(out[(tok - t0) * ldo + (r1 - r0)]));
        REQUIRE(std::isnan(out[(tok - t0) * ldo + (r1 - r0) + 1]));
    }
    return out;
}

// 1, 5: only the last products; 8, 13, 40, 100: 8-blocks (and 32-steps); 519, 520, 1100: past
// one 512-float block of k, ending inside an 8-block, on one, and past the second block; 2107:
// a second block of the row-lane GEMMs' 2048 floats that ends in three 8-blocks and 3 products.
constexpr uint64_t kLengths[] = {1, 5, 8, 13, 32, 40, 100, 519, 520, 1100, 2056, 2107, 4133};
constexpr uint64_t kShapes[][2] = {{1, 1}, {3, 7}, {17, 13}, {5, 2}, {50, 9}};  // rows, tokens

}  // namespace

TEST_CASE(
    "float_matmul at every level: each output is its level's dot_row, bit for bit, and "
    "within a derived bound of a float64 product",
    "[float_gemm]") {
    uint32_t seed = 1;
    for (QType t : kFloatTypes)
        for (uint64_t k : kLengths)
            for (const auto& shape : kShapes) {
                const uint64_t n = shape[0], m = shape[1], ldx = k + 3;
                const Rows rows = make_rows(t, n, k, t == QType::f32 ? 4 : 2, seed++);
                const std::vector<float> x = make_tokens(m, k, ldx, seed++);
                for (Isa isa : cpu_isa_levels()) {
                    INFO(qtype_traits(t).name << " k " << k << " rows " << n << " tokens " << m
                                              << " level " << isa_name(isa));
                    const std::vector<float> out = run(isa, rows, rows.data(), x, ldx, 0, n, 0, m);
                    for (uint64_t tok = 0; tok < m; ++tok)
                        for (uint64_t r = 0; r < n; ++r) {
                            const float got = out[tok * (n + 2) + r];
                            const float dot = level_dot(isa, t, rows.data() + r * rows.stride,
                                                        x.data() + tok * ldx, k);
                            REQUIRE(std::memcmp(&got, &dot, 4) == 0);
                            double exact = 0.0, magnitude = 0.0;
                            for (uint64_t j = 0; j < k; ++j) {
                                const double p =
                                    static_cast<double>(rows.w[r * k + j]) * x[tok * ldx + j];
                                exact += p;
                                magnitude += std::fabs(p);
                            }
                            const double n_round = static_cast<double>(k / 32) + 16;
                            REQUIRE(std::fabs(got - exact) <= 1.01 * n_round * kU * magnitude);
                        }
                }
            }
}

TEST_CASE(
    "float_matmul: any row and token sub-range, unaligned rows and tokens read in place "
    "give the same bits",
    "[float_gemm]") {
    const uint64_t n = 37, m = 15, k = 1100, ldx = k;  // 37 rows: three panels, ragged tiles
    for (QType t : kFloatTypes) {
        const Rows rows = make_rows(t, n, k, 0, 7);
        const std::vector<float> x = make_tokens(m, k, ldx, 8);
        // The same rows one byte off float alignment.
        std::vector<uint8_t> shifted(rows.bytes.size() + 1);
        std::memcpy(shifted.data() + 1, rows.data(), rows.bytes.size());
        // The same tokens 64-byte aligned, 1104 floats apart: read in place, not packed.
        const uint64_t aligned_ld = 1104;
        std::vector<float> aligned_x(m * aligned_ld + 16, std::nanf(""));
        const auto at = reinterpret_cast<uintptr_t>(aligned_x.data());
        const uint64_t skip = (64 - at % 64) % 64 / 4;
        for (uint64_t tok = 0; tok < m; ++tok)
            std::memcpy(&aligned_x[skip + tok * aligned_ld], &x[tok * ldx], 4 * k);
        for (Isa isa : cpu_isa_levels()) {
            INFO(qtype_traits(t).name << " level " << isa_name(isa));
            const std::vector<float> whole = run(isa, rows, rows.data(), x, ldx, 0, n, 0, m);
            const std::vector<float> moved = run(isa, rows, shifted.data() + 1, x, ldx, 0, n, 0, m);
            REQUIRE(std::memcmp(moved.data(), whole.data(), 4 * whole.size()) == 0);
            std::vector<float> in_place(whole.size(), std::nanf(""));
            float_matmul_isa(isa, t, rows.data(), rows.stride, 0, n, aligned_x.data() + skip,
                             aligned_ld, k, 0, m, in_place.data(), n + 2);
            REQUIRE(std::memcmp(in_place.data(), whole.data(), 4 * whole.size()) == 0);
            for (auto [t0, t1] : {std::pair<uint64_t, uint64_t>{0, 1}, {3, 4}, {2, 9}, {5, 15}})
                for (auto [r0, r1] :
                     {std::pair<uint64_t, uint64_t>{0, 1}, {1, 2}, {3, 20}, {16, 37}, {35, 37}}) {
                    const std::vector<float> part =
                        run(isa, rows, rows.data(), x, ldx, r0, r1, t0, t1);
                    for (uint64_t tok = t0; tok < t1; ++tok)
                        REQUIRE(std::memcmp(&part[(tok - t0) * (r1 - r0 + 2)],
                                            &whole[tok * (n + 2) + r0], 4 * (r1 - r0)) == 0);
                }
        }
    }
}

TEST_CASE("float_matmul: non-finite activations as dot_row, and typed errors", "[float_gemm]") {
    const uint64_t n = 6, m = 3, k = 77;
    const Rows rows = make_rows(QType::f16, n, k, 0, 3);
    std::vector<float> x = make_tokens(m, k, k, 4);
    x[k + 40] = std::numeric_limits<float>::infinity();  // token 1
    x[2 * k + 76] = std::nanf("");                       // token 2, in the last products
    for (Isa isa : cpu_isa_levels()) {
        const std::vector<float> out = run(isa, rows, rows.data(), x, k, 0, n, 0, m);
        for (uint64_t r = 0; r < n; ++r) {
            REQUIRE(std::isfinite(out[r]));
            REQUIRE_FALSE(std::isfinite(out[(n + 2) + r]));
            REQUIRE(std::isnan(out[2 * (n + 2) + r]));
        }
    }
    float out = 0.0f;
    REQUIRE_THROWS_AS(
        float_matmul(QType::q8, rows.data(), rows.stride, 0, 1, x.data(), k, k, 0, 1, &out, 1),
        Error);
    if (cpu_isa() < Isa::avx512)
        REQUIRE_THROWS_AS(float_matmul_isa(Isa::avx512, QType::f16, rows.data(), rows.stride, 0, 1,
                                           x.data(), k, k, 0, 1, &out, 1),
                          Error);
}

TEST_CASE("float_matmul_prepared: tokens prepared once give each call's bits", "[float_gemm]") {
    const uint64_t n = 53, m = 11, k = 2085, ldx = k + 5;  // two blocks of k, a tail, ragged tiles
    for (QType t : kFloatTypes) {
        const Rows rows = make_rows(t, n, k, 0, 11);
        const std::vector<float> x = make_tokens(m, k, ldx, 12);
        for (Isa isa : cpu_isa_levels()) {
            INFO(qtype_traits(t).name << " level " << isa_name(isa));
            FloatTokens tokens;
            tokens.prepare(isa, x.data(), ldx, k, m);
            const std::vector<float> whole = run(isa, rows, rows.data(), x, ldx, 0, n, 0, m);
            for (auto [r0, r1] : {std::pair<uint64_t, uint64_t>{0, 53}, {5, 37}, {48, 53}})
                for (auto [t0, t1] : {std::pair<uint64_t, uint64_t>{0, 11}, {3, 10}, {10, 11}}) {
                    std::vector<float> out((t1 - t0) * (r1 - r0), std::nanf(""));
                    float_matmul_prepared(t, rows.data(), rows.stride, r0, r1, tokens, t0, t1,
                                          out.data(), r1 - r0);
                    for (uint64_t tok = t0; tok < t1; ++tok)
                        REQUIRE(std::memcmp(&out[(tok - t0) * (r1 - r0)],
                                            &whole[tok * (n + 2) + r0], 4 * (r1 - r0)) == 0);
                }
            float out = 0.0f;
            REQUIRE_THROWS_AS(
                float_matmul_prepared(t, rows.data(), rows.stride, 0, 1, tokens, 0, m + 1, &out, 1),
                Error);
        }
    }
}

}  // namespace kernels_float_gemm_test
