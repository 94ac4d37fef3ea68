// kernels/cpu/bf16_gemm: bf16 rows times activations rounded to bf16 (vdpbf16ps), against a
// float64 product of the same bf16 weights and the unrounded activations.
//
// Bound (u = 2^-24; bf16 keeps 8 significant bits, so rounding an activation moves it by at most
// 2^-8 of itself): with M = sum_j |w_j x_j|, the rounded activations move the exact product by at
// most 2^-8 M; each product of a bf16 weight and a bf16 activation is exact in f32, and an
// output's f32 chain adds 2 of them per pair (k + 1 adds at most) and sums nothing else, so its
// rounding error is at most (k + 1) u (1 + 2^-8) M. The factor 1.01 covers second-order terms;
// k 2^-126 covers flushed denormals. Then: bit equality across row ranges, token tiles, one token
// at a time (decode) and blocks of k, and NaN activations giving NaN. Each for every kernel this
// process runs (vdpbf16ps, and AMX tiles where the CPU has them).
#include <array>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "test_support.hpp"

namespace kernels_bf16_gemm_test {

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

const char* kernel_name(Bf16Kernel k) { return k == Bf16Kernel::amx ? "amx" : "avx512"; }

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
    for (Bf16Kernel kernel : bf16_kernels())
        for (uint64_t k : {uint64_t{1}, uint64_t{33}, uint64_t{576}, uint64_t{4100}})
            for (uint64_t tokens : {uint64_t{1}, uint64_t{3}, uint64_t{17}, uint64_t{33}}) {
                INFO(kernel_name(kernel) << " k " << k << " tokens " << tokens);
                const Rows m = make_rows(45, k, seed++);
                const auto x = test::kernel_activations(tokens, k, seed++);
                Bf16Tokens xt;
                xt.prepare(x.data(), tokens, k);
                const Bf16PackedRows p = pack(m);
                const uint64_t ldo = m.n + 2;
                std::vector<float> out(tokens * ldo, std::nanf(""));
                bf16_matmul(p, 0, m.n, xt, 0, tokens, out.data(), ldo, kernel);
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
    for (Bf16Kernel kernel : bf16_kernels())
        for (uint64_t k : {uint64_t{33}, uint64_t{4100}}) {  // 4100: three blocks of 1024 pairs
            INFO(kernel_name(kernel) << " k " << k);
            const uint64_t rows = 45, tokens = 37;  // 37: two AMX groups of 32 tokens
            const Rows m = make_rows(rows, k, seed++);
            auto x = test::kernel_activations(tokens, k, seed++);
            x[3 * k + k / 2] = std::nanf("");  // token 3: every output NaN
            Bf16Tokens xt;
            xt.prepare(x.data(), tokens, k);
            const Bf16PackedRows p = pack(m);
            std::vector<float> all(tokens * rows);
            bf16_matmul(p, 0, rows, xt, 0, tokens, all.data(), rows, kernel);
            for (uint64_t r = 0; r < rows; ++r) REQUIRE(std::isnan(all[3 * rows + r]));
            // One token at a time (decode), and rows from inside a tile with tokens from the
            // middle.
            for (uint64_t t = 0; t < tokens; ++t) {
                std::vector<float> one(rows);
                bf16_matmul(p, 0, rows, xt, t, t + 1, one.data(), rows, kernel);
                REQUIRE(std::memcmp(one.data(), all.data() + t * rows, 4 * rows) == 0);
            }
            for (auto [r0, r1, t0, t1] : {std::array<uint64_t, 4>{5, 37, 2, 9},
                                          {16, 45, 0, 11},
                                          {33, 34, 10, 11},
                                          {1, 44, 30, 37}}) {
                INFO("rows " << r0 << ".." << r1 << " tokens " << t0 << ".." << t1);
                std::vector<float> part((t1 - t0) * (r1 - r0));
                bf16_matmul(p, r0, r1, xt, t0, t1, part.data(), r1 - r0, kernel);
                for (uint64_t t = t0; t < t1; ++t)
                    REQUIRE(std::memcmp(part.data() + (t - t0) * (r1 - r0),
                                        all.data() + t * rows + r0, 4 * (r1 - r0)) == 0);
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

TEST_CASE("f32_to_bf16_array gives f32_to_bf16's bits at every level", "[bf16]") {
    std::vector<float> x = {0.0f,          -0.0f,           1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f,
                            0x1p-130f,     -0x1p-149f,      INFINITY,       -INFINITY,
                            std::nanf(""), -std::nanf("7"), 3.3895314e38f,  -1.0e-39f};
    std::mt19937 rng(3);
    std::uniform_int_distribution<uint32_t> bits;
    for (int i = 0; i < 300; ++i) x.push_back(std::bit_cast<float>(bits(rng)));
    for (Isa isa : cpu_isa_levels())
        for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{15}, uint64_t{17}, x.size()}) {
            INFO(isa_name(isa) << " n " << n);
            std::vector<uint16_t> out(n + 1, 0xabcd);
            f32_to_bf16_array(x.data(), n, out.data(), isa);
            for (uint64_t i = 0; i < n; ++i) REQUIRE(out[i] == f32_to_bf16(x[i]));
            REQUIRE(out[n] == 0xabcd);  // nothing past n
        }
}

TEST_CASE("pack_f32 and pack_columns give pack()'s tiles of the rounded rows", "[bf16]") {
    for (uint64_t rows : {uint64_t{1}, uint64_t{16}, uint64_t{45}})
        for (uint64_t k : {uint64_t{1}, uint64_t{2}, uint64_t{33}, uint64_t{256}}) {
            INFO("rows " << rows << " k " << k);
            // x: [k][ld] with ld > rows; its columns are the rows; w = x^T as f32 and as bf16.
            const uint64_t ld = rows + 3;
            const auto x = test::kernel_activations(k, ld, static_cast<uint32_t>(rows * 1000 + k));
            std::vector<float> w(rows * k);
            std::vector<uint16_t> wb(rows * k);
            for (uint64_t r = 0; r < rows; ++r)
                for (uint64_t j = 0; j < k; ++j) {
                    w[r * k + j] = x[j * ld + r];
                    wb[r * k + j] = f32_to_bf16(w[r * k + j]);
                }
            Bf16PackedRows ref(rows, k), from_f32(rows, k);
            ref.pack(reinterpret_cast<const uint8_t*>(wb.data()), 2 * k, 0, ref.tiles());
            from_f32.pack_f32(w.data(), k, 0, from_f32.tiles());
            const uint64_t bytes = ref.tiles() * ref.tile_bytes();
            REQUIRE(std::memcmp(ref.tile(0), from_f32.tile(0), bytes) == 0);
            for (Isa isa : cpu_isa_levels()) {
                INFO(isa_name(isa));
                Bf16PackedRows cols(rows, k, true);
                cols.pack_columns(x.data(), ld, 0, 1, isa);  // two calls, as threads would
                cols.pack_columns(x.data(), ld, 1, cols.tiles(), isa);
                REQUIRE(std::memcmp(ref.tile(0), cols.tile(0), bytes) == 0);
                // The row-major copy: row r's pairs in order, zero up to the row stride.
                for (uint64_t r = 0; r < rows; ++r)
                    for (uint64_t p = 0; p < cols.row_stride(); ++p) {
                        uint32_t want = 0;
                        if (p < cols.pairs())
                            std::memcpy(&want, ref.tile(r / 16) + p * 64 + 4 * (r % 16), 4);
                        REQUIRE(cols.row_major()[r * cols.row_stride() + p] == want);
                    }
            }
        }
}

TEST_CASE("bf16_gram is bf16_matmul with the rows as the tokens", "[bf16]") {
    if (!bf16_dot_available()) {
        WARN("this process has no AVX-512 BF16 at its level: the bf16 mode is not run here");
        return;
    }
    // x: 37 calibration rows of 50 inputs (an odd number of rows: the last pair half zero);
    // the Gram matrix of its columns is x^T x.
    const uint64_t n = 37, k = 50;
    const auto x = test::kernel_activations(n, k, 77);
    Bf16PackedRows cols(k, n), with_rows(k, n, true);  // AMX: rows copied out, or read in place
    cols.pack_columns(x.data(), k, 0, cols.tiles());
    with_rows.pack_columns(x.data(), k, 0, with_rows.tiles());
    std::vector<float> xt(k * n);
    for (uint64_t i = 0; i < n; ++i)
        for (uint64_t j = 0; j < k; ++j) xt[j * n + i] = x[i * k + j];
    Bf16Tokens tokens;
    tokens.prepare(xt.data(), k, n);
    for (Bf16Kernel kernel : bf16_kernels()) {
        INFO(kernel_name(kernel));
        std::vector<float> gram(k * k), ref(k * k);
        bf16_gram(cols, 0, k, 0, k, gram.data(), k, kernel);
        bf16_matmul(cols, 0, k, tokens, 0, k, ref.data(), k, kernel);
        REQUIRE(std::memcmp(gram.data(), ref.data(), 4 * k * k) == 0);
        // A block from inside: the same bits; and within the bound of the float64 x^T x.
        std::vector<float> part(7 * 20);
        bf16_gram(cols, 20, 40, 3, 10, part.data(), 20, kernel);
        for (uint64_t t = 3; t < 10; ++t)
            for (uint64_t r = 20; r < 40; ++r) {
                REQUIRE(std::memcmp(&part[(t - 3) * 20 + (r - 20)], &gram[t * k + r], 4) == 0);
                double exact = 0.0, mag = 0.0;
                for (uint64_t i = 0; i < n; ++i) {
                    exact += static_cast<double>(x[i * k + r]) * x[i * k + t];
                    mag += std::fabs(static_cast<double>(x[i * k + r]) * x[i * k + t]);
                }
                // Both factors rounded: (1 + 2^-8)^2 - 1 <= 2^-7 + 2^-16; the f32 chain as above.
                const double bound =
                    1.01 * (0x1p-7 + 0x1p-16 + static_cast<double>(n + 1) * 0x1p-24 * 1.01) * mag +
                    static_cast<double>(n) * 0x1p-126;
                REQUIRE(std::fabs(part[(t - 3) * 20 + (r - 20)] - exact) <= bound);
            }
    }
}

}  // namespace kernels_bf16_gemm_test
