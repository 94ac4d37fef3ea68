// kernels/cpu/qdot: the products of every instruction-set level this CPU has (qmatmul_isa: scalar,
// avx2, avx512; kernels/cpu/isa.hpp) against a float64 product of the reference-dequantized
// weights, for every quantized type, both activation modes, m = 1, 3, 17 tokens, odd row counts
// and k that ends inside a chunk or a group; outputs poisoned first; above AVX2 the scalar bits
// (int8 mode) or the AVX2 bits (f32 mode).
// Then: the int8 activations' own error against float activations, bit equality across row and
// token tilings at every level, and dequantize_rows against dequantize_row_ref.
//
// Tolerances (u = 2^-24, float's unit roundoff). A float sum of terms t_i computed with at most n
// roundings on any path from a term to the result is within n * u * sum |t_i| (to first order;
// the factor 1.01 covers the second-order terms). Per path:
//   f32 mode, magnitude M = sum_j |w_j x_j|:
//     scalar:  sequential sum of k products, each rounded once: n = k + 1.
//     AVX2:    per lane a block sum of 4 products (4 roundings), scaled into the lane's
//              accumulator (1 rounding per block), then 3 levels of lane adds: n <= blocks + 8.
//   int8 mode, activations a_j = d_b q_j exactly, M = sum_b |scale_g| d_b (sum_i |c_i| |q_i| +
//   |zero_g| sum_i |q_i|) (every integer partial sum, and the zero correction, is bounded by it):
//     scalar:  per block an exact integer sum times fl(scale * d) (2 roundings), summed in
//              sequence: n = blocks + 2. Super-block types (w = scale * c - min) also subtract
//              fl(min * fl(d * sum q)) per block (2 more roundings and one more add per block):
//              n = 2 blocks + 4; M adds sum_b |min_g| d_b sum_i |q_i|.
//              (Their AVX2 path subtracts the mins as the zero correction: n <= blocks + 8.)
//     AVX2:    exact integer lanes times fl(scale * d); per lane one add per pair of blocks and
//              one zero correction per 8 blocks, then 3 levels of lane adds: n <= blocks + 8.
//   avx512 is not given a bound of its own: in int8 mode it must equal scalar bit for bit, in
//   f32 mode avx2 (tested below).
// The int8 activations themselves: q = round(x / d) with d = fl(amax / 127), so |x - d q| <=
// d (1/2 + 128 u) <= d (1/2 + 2^-16) per element, and the product moves by at most
// sum_b d_b (1/2 + 2^-16) sum_{i in b} |w_i|.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "formats/qtype.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/qdot.hpp"
#include "kernels/cpu/qdot_avx2.hpp"
#include "kernels/cpu/qpack.hpp"
#include "test_support.hpp"

namespace kernels_qdot_test {

using namespace qforge;
using qforge::test::quantized_types;

namespace {

constexpr double kU = 0x1p-24;
constexpr uint64_t kBlock = 32;

// n rows of k weights, quantized: each 32 weights get their own magnitude and offset, so groups
// have varied scales and (asymmetric types) zero points; one group in seven is all zero.
struct Matrix {
    QType t;
    uint64_t n, k, stride;
    std::vector<uint8_t> bytes;
    std::vector<float> w;  // dequantized, [n][k]
    const uint8_t* row(uint64_t r) const { return bytes.data() + r * stride; }
};

Matrix make_matrix(QType t, uint64_t n, uint64_t k, uint32_t seed) {
    Matrix m{t, n, k, *qtype_row_bytes(t, k), {}, {}};
    m.bytes.assign(n * m.stride, 0);
    m.w.assign(n * k, 0.0f);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(-3.0f, 1.0f);
    std::vector<float> src(k);
    for (uint64_t r = 0; r < n; ++r) {
        for (uint64_t j = 0; j < k; j += kBlock) {
            const float scale = std::pow(10.0f, mag(rng));
            const float offset = dist(rng) * scale;
            const bool zero = (r * 131 + j / kBlock) % 7 == 3;
            for (uint64_t i = j; i < std::min(k, j + kBlock); ++i)
                src[i] = zero ? 0.0f : offset + scale * dist(rng);
        }
        REQUIRE(quantize_row_ref(t, src.data(), k, m.bytes.data() + r * m.stride) ==
                QuantStatus::ok);
        dequantize_row_ref(t, m.row(r), k, m.w.data() + r * k);
    }
    return m;
}

// Exact (float64) product and magnitude M (see the header comment) of row r with token t.
struct Reference {
    double value, magnitude;
};

Reference reference(const Matrix& m, uint64_t r, const QActivations& a, uint64_t t) {
    const uint64_t k = m.k;
    const float* w = m.w.data() + r * k;
    Reference ref{0.0, 0.0};
    if (a.mode() == QActivations::Mode::f32) {
        for (uint64_t j = 0; j < k; ++j) {
            ref.value += static_cast<double>(w[j]) * a.floats(t)[j];
            ref.magnitude += std::fabs(static_cast<double>(w[j]) * a.floats(t)[j]);
        }
        return ref;
    }
    const uint64_t group = qtype_traits(m.t).group ? qtype_traits(m.t).group : k;
    for (uint64_t b = 0; b < a.blocks(); ++b) {
        const double d = a.scales(t)[b];
        const uint64_t g = b * kBlock / group;
        const double s = std::fabs(static_cast<double>(row_group_scale(m.t, m.row(r), k, g)));
        const double z = std::abs(row_group_zero(m.t, m.row(r), k, g));
        const double mn = std::fabs(static_cast<double>(row_group_min(m.t, m.row(r), k, g)));
        double cq = 0.0, q = 0.0;
        for (uint64_t j = b * kBlock; j < (b + 1) * kBlock; ++j) {
            const int8_t qj = a.codes(t)[j];
            if (j < k) ref.value += static_cast<double>(w[j]) * d * qj;
            cq += std::abs(
                qtype_code_level(m.t, row_code(m.t, m.row(r), j), row_levels(m.t, m.row(r), k)) *
                qj);
            q += std::abs(qj);
        }
        ref.magnitude += s * d * (cq + z * q) + mn * d * q;
    }
    return ref;
}

// Roundings on the longest path from a term to a result (header comment).
double roundings(QActivations::Mode mode, bool scalar, uint64_t k, QType t) {
    const double blocks = static_cast<double>((k + kBlock - 1) / kBlock);
    if (mode == QActivations::Mode::f32) return scalar ? static_cast<double>(k) + 1 : blocks + 8;
    if (scalar && qtype_has_super_blocks(t)) return 2 * blocks + 4;
    return scalar ? blocks + 2 : blocks + 8;
}

// 100, 172: partial chunk; 320: partial g128; 200 (7 blocks) and 288 (9): a last odd block, which
// is the third or the first block of a 3-bit chunk; 64: half a 3-bit chunk.
constexpr uint64_t kLengths[] = {64, 100, 172, 200, 288, 320, 576, 4096};

// Every level this process may run (cpu_isa() and below), scalar first.
const char* mode_name(QActivations::Mode mode) {
    return mode == QActivations::Mode::f32 ? "f32" : "int8";
}

// out[t][r] for all rows and tokens with ldo = n + 2; the two extra columns must stay poisoned.
std::vector<float> run(Isa isa, const Matrix& m, const QActivations& a) {
    const uint64_t ldo = m.n + 2;
    std::vector<float> out(a.tokens() * ldo, std::nanf(""));
    qmatmul_isa(isa, m.t, m.bytes.data(), m.stride, 0, m.n, a, 0, a.tokens(), out.data(), ldo);
    for (uint64_t t = 0; t < a.tokens(); ++t) {
        REQUIRE(std::isnan(out[t * ldo + m.n]));
        REQUIRE(std::isnan(out[t * ldo + m.n + 1]));
    }
    return out;
}

}  // namespace

TEST_CASE("qmatmul at every level agrees with a float64 product within derived bounds", "[qdot]") {
    uint32_t seed = 100;
    for (QType t : quantized_types())
        for (uint64_t k : kLengths) {
            const uint64_t n = k >= 4096 ? 5 : 9;
            const Matrix m = make_matrix(t, n, k, seed++);
            for (uint64_t tokens : {1u, 3u, 17u}) {
                const auto x = test::kernel_activations(tokens, k, seed++);
                for (auto mode : {QActivations::Mode::int8, QActivations::Mode::f32}) {
                    QActivations a;
                    a.prepare(mode, x.data(), tokens, k);
                    std::vector<float> exact, avx2;
                    for (Isa isa : cpu_isa_levels()) {
                        const auto out = run(isa, m, a);
                        const bool scalar = isa == Isa::scalar;
                        for (uint64_t tok = 0; tok < tokens; ++tok)
                            for (uint64_t r = 0; r < n; ++r) {
                                INFO("qtype " << qtype_traits(t).name << " k " << k << " tokens "
                                              << tokens << " mode " << mode_name(mode) << " isa "
                                              << isa_name(isa) << " row " << r << " token " << tok);
                                const Reference ref = reference(m, r, a, tok);
                                REQUIRE(std::fabs(out[tok * (n + 2) + r] - ref.value) <=
                                        1.01 * roundings(mode, scalar, k, t) * kU * ref.magnitude);
                            }
                        // Above AVX2: int8 mode gives the scalar reference's bits (one row per
                        // lane, kernels/cpu/qdot_avx512.cpp), f32 mode AVX2's (its kernel).
                        if (isa == Isa::scalar) exact = out;
                        if (isa == Isa::avx2) avx2 = out;
                        if (isa > Isa::avx2) {
                            INFO("qtype " << qtype_traits(t).name << " k " << k << " mode "
                                          << mode_name(mode) << " isa " << isa_name(isa));
                            const auto& same = mode == QActivations::Mode::int8 ? exact : avx2;
                            REQUIRE(std::memcmp(out.data(), same.data(), 4 * out.size()) == 0);
                        }
                    }
                }
            }
        }
}

TEST_CASE("qmatmul at avx512 gives scalar's bits over several row groups and every token tile",
          "[qdot]") {
    // The AVX-512 kernel computes 16 rows per vector, 32 at a time, tokens in tiles of 4, 2 and
    // 1, stored zeros raw for up to 4 tokens and biased above (kernels/cpu/qdot_avx512.cpp): 45
    // rows (two pairs of groups, the last partial) against 1, 2, 4, 5 and 9 tokens cover each
    // path. A damaged file's zero point above 128 must not change the bits either.
    if (cpu_isa() < Isa::avx512) {
        WARN("this CPU has no AVX-512 VNNI: the avx512 level is not run here");
        return;
    }
    uint32_t seed = 900;
    for (QType t : quantized_types())
        for (uint64_t k : {uint64_t{100}, uint64_t{576}}) {
            Matrix m = make_matrix(t, 45, k, seed++);
            for (bool damaged : {false, true}) {
                const QRowLayout l = *qtype_row_layout(t, k);
                if (damaged) {
                    if (qtype_traits(t).symmetric || qtype_traits(t).super_block) break;
                    m.bytes[3 * m.stride + l.zeros_offset] = 200;                  // row 3, group 0
                    m.bytes[40 * m.stride + l.zeros_offset + l.groups - 1] = 255;  // row 40, last
                }
                for (uint64_t tokens : {1u, 2u, 4u, 5u, 7u, 9u}) {
                    INFO("qtype " << qtype_traits(t).name << " k " << k << " tokens " << tokens
                                  << (damaged ? " damaged zeros" : ""));
                    const auto x = test::kernel_activations(tokens, k, seed++);
                    QActivations a;
                    a.prepare(QActivations::Mode::int8, x.data(), tokens, k);
                    const auto exact = run(Isa::scalar, m, a);
                    const auto fast = run(Isa::avx512, m, a);
                    REQUIRE(std::memcmp(fast.data(), exact.data(), 4 * fast.size()) == 0);
                }
            }
        }
}

TEST_CASE("qmatmul: the avx2 level's AVX-VNNI row gives the AVX2 row's bits", "[qdot]") {
    // vpdpbusd adds each dword's four byte products exactly; maddubs and madd give the same
    // integers where no int16 pair saturates (kernels/cpu/qdot_x86.hpp): every type, both modes,
    // k of 3 blocks (a pair and an odd block), 4 (two pairs, the last partial), 10 (a superblock
    // and a pair) and 17 (two superblocks and an odd block), token tiles of 1 to 4 and a ragged
    // one (9 tokens), against the two rows called directly.
    if (!cpu_has_avx_vnni() || cpu_isa() < Isa::avx2) {
        WARN("this CPU has no AVX-VNNI (or runs below avx2): the VNNI row is not run here");
        return;
    }
    uint32_t seed = 1300;
    for (QType t : quantized_types())
        for (uint64_t k : {uint64_t{96}, uint64_t{100}, uint64_t{300}, uint64_t{520}}) {
            const Matrix m = make_matrix(t, 7, k, seed++);
            for (uint64_t tokens : {1u, 4u, 9u}) {
                const auto x = test::kernel_activations(tokens, k, seed++);
                for (auto mode : {QActivations::Mode::int8, QActivations::Mode::f32}) {
                    INFO("qtype " << qtype_traits(t).name << " k " << k << " tokens " << tokens
                                  << " mode " << mode_name(mode));
                    QActivations a;
                    a.prepare(mode, x.data(), tokens, k);
                    std::vector<float> out[2];
                    const detail::QKernelRow* rows[2] = {&detail::avx2_kernels(),
                                                         &detail::avx_vnni_kernels()};
                    for (int i = 0; i < 2; ++i) {
                        out[i].assign(tokens * m.n, std::nanf(""));
                        (*rows[i])[static_cast<size_t>(t)].qmatmul(
                            t, m.bytes.data(), m.stride, 0, m.n, a, 0, tokens, out[i].data(), m.n);
                    }
                    REQUIRE(std::memcmp(out[0].data(), out[1].data(), 4 * out[0].size()) == 0);
                }
            }
        }
}

TEST_CASE(
    "qmatmul_packed gives scalar's bits at every level, packed type, row range and token "
    "tile",
    "[qdot]") {
    // Rows repacked 16 to a tile (kernels/cpu/qpack.hpp): 45 rows (a last tile of 13), k ending
    // inside a block, a chunk and a weight group (100, 300), two whole superblocks (512) and 2056
    // (a 1-block last chunk); ranges from a tile boundary and from inside a tile (the kernel then
    // computes the tile and stores the rows asked for); 1 to 17 tokens (the one-token path, raw
    // zeros, biased zeros, tiles of 4, 2, 1; codes split in registers, and the level types'
    // through the chunk buffer above 16 tokens); damaged zeros above 128 as in the row layout;
    // 8-bit codes of -128 in three rows. Every level the CPU has with packed kernels (avx2, avx512)
    // against the scalar reference.
    bool any = false;
    for (Isa isa : {Isa::avx2, Isa::avx512})
        for (QType t : quantized_types()) {
            if (!qmatmul_packed_serves(isa, t)) continue;
            any = true;
            uint32_t seed = 1700 + static_cast<uint32_t>(t);
            for (uint64_t k : {uint64_t{100}, uint64_t{300}, uint64_t{512}, uint64_t{2056}}) {
                Matrix m = make_matrix(t, 45, k, seed++);
                if (qtype_traits(t).bits == 8)  // code -128, which GGUF Q8_0 imports carry
                    for (uint64_t r : {uint64_t{2}, uint64_t{9}, uint64_t{44}})
                        for (uint64_t j = r % 5; j < k; j += 7) m.bytes[r * m.stride + j] = 0x80;
                for (bool damaged : {false, true}) {
                    if (damaged) {
                        if (qtype_traits(t).symmetric || qtype_traits(t).super_block) break;
                        const QRowLayout l = *qtype_row_layout(t, k);
                        m.bytes[3 * m.stride + l.zeros_offset] = 200;
                        m.bytes[40 * m.stride + l.zeros_offset + l.groups - 1] = 255;
                    }
                    QPackedRows packed(t, m.n, k);
                    packed.pack(m.bytes.data(), m.stride, 0, 1);  // in two calls, as threads would
                    packed.pack(m.bytes.data(), m.stride, 1, packed.tiles());
                    for (uint64_t tokens : {1u, 2u, 4u, 5u, 7u, 9u, 16u, 17u, 40u}) {
                        const auto x = test::kernel_activations(tokens, k, seed++);
                        QActivations a;
                        a.prepare(QActivations::Mode::int8, x.data(), tokens, k);
                        const auto exact = run(Isa::scalar, m, a);
                        const uint64_t ldo = m.n + 2;
                        for (auto [r0, r1] :
                             {std::pair<uint64_t, uint64_t>{0, 45}, {16, 45}, {5, 37}, {33, 34}}) {
                            INFO("level " << isa_name(isa) << " qtype " << qtype_traits(t).name
                                          << " k " << k << " tokens " << tokens << " rows " << r0
                                          << ".." << r1 << (damaged ? " damaged zeros" : ""));
                            // Through qmatmul_packed_isa (which may send one token at avx512
                            // to the avx2 kernel, and 16 or more to AMX tiles) and, at avx512,
                            // the level's own kernels: VNNI, and AMX where this process uses it
                            // (for 16 tokens and more, whose tile operands the activations hold).
                            for (int direct : {0, 1, 2}) {
                                if (direct && isa != Isa::avx512) break;
                                if (direct == 2 && !a.has_tiles()) break;  // AMX: 16+
                                INFO((direct == 1   ? "the avx512 kernel itself"
                                      : direct == 2 ? "the AMX kernel itself"
                                                    : "qmatmul_packed_isa"));
                                std::vector<float> out(tokens * ldo, std::nanf(""));
                                if (direct)
                                    (direct == 1
                                         ? detail::avx512_packed_kernels()
                                         : detail::amx_packed_kernels())[static_cast<size_t>(t)](
                                        packed, r0, r1, a, 0, tokens, out.data() + r0, ldo);
                                else
                                    qmatmul_packed_isa(isa, packed, r0, r1, a, 0, tokens,
                                                       out.data() + r0, ldo);
                                for (uint64_t tok = 0; tok < tokens; ++tok)
                                    for (uint64_t r = 0; r < ldo; ++r) {
                                        const float v = out[tok * ldo + r];
                                        if (r < r0 || r >= r1) {
                                            REQUIRE(std::isnan(v));  // untouched
                                            continue;
                                        }
                                        const float e = exact[tok * ldo + r];
                                        REQUIRE(std::memcmp(&v, &e, 4) == 0);
                                    }
                            }
                        }
                    }
                }
            }
        }
    if (!any) {
        WARN("this CPU runs below avx2: the packed kernels are not run here");
        return;
    }
    // Types without a packed layout are refused, not computed wrongly; so are the types with one
    // that the avx2 level leaves to its row kernels (a level table, q4nl).
    REQUIRE_FALSE(qmatmul_packed_serves(Isa::avx2, QType::q4nl_g32));
    REQUIRE_FALSE(qmatmul_packed_serves(Isa::avx2, QType::q3_g32));
    if (cpu_isa() == Isa::avx512) {
        QPackedRows nl(QType::q4nl_g32, 16, 64);
        const auto x = test::kernel_activations(1, 64, 5);
        QActivations a;
        a.prepare(QActivations::Mode::int8, x.data(), 1, 64);
        std::vector<float> out(16);
        REQUIRE_THROWS_AS(qmatmul_packed_isa(Isa::avx2, nl, 0, 16, a, 0, 1, out.data(), 16), Error);
    }
    REQUIRE_FALSE(qpack_layout(QType::q3_g32, 64).has_value());
    REQUIRE_FALSE(qpack_layout(QType::f16, 64).has_value());
    REQUIRE_THROWS_AS(QPackedRows(QType::q4t_g32, 16, 64), Error);
}

TEST_CASE("qmatmul_packed: the avx2 level's AVX-VNNI row gives the AVX2 row's bits", "[qdot]") {
    // The packed kernels compiled twice (qpack_avx2_kernels.hpp): vpdpbusd against maddubs and
    // madd on the same bytes (on such a CPU the test above runs the VNNI copy, so this is the
    // maddubs copy's check there). Every type either serves, 45 rows, k ending inside a block and
    // a chunk (300) and 2056 (a 1-block last chunk), 1 to 9 tokens, a range from inside a tile.
    if (!cpu_has_avx_vnni() || cpu_isa() < Isa::avx2) {
        WARN("this CPU has no AVX-VNNI (or runs below avx2): the VNNI packed row is not run here");
        return;
    }
    uint32_t seed = 2300;
    for (QType t : quantized_types()) {
        const detail::QPackedKernel kernels[2] = {
            detail::avx2_packed_kernels()[static_cast<size_t>(t)],
            detail::avx_vnni_packed_kernels()[static_cast<size_t>(t)]};
        REQUIRE((kernels[0] == nullptr) == (kernels[1] == nullptr));
        if (!kernels[0]) continue;
        for (uint64_t k : {uint64_t{300}, uint64_t{2056}}) {
            const Matrix m = make_matrix(t, 45, k, seed++);
            QPackedRows packed(t, m.n, k);
            packed.pack(m.bytes.data(), m.stride, 0, packed.tiles());
            for (uint64_t tokens : {1u, 2u, 3u, 4u, 5u, 7u, 9u}) {
                const auto x = test::kernel_activations(tokens, k, seed++);
                QActivations a;
                a.prepare(QActivations::Mode::int8, x.data(), tokens, k);
                for (auto [r0, r1] : {std::pair<uint64_t, uint64_t>{0, 45}, {5, 37}}) {
                    INFO("qtype " << qtype_traits(t).name << " k " << k << " tokens " << tokens
                                  << " rows " << r0 << ".." << r1);
                    std::vector<float> out[2];
                    for (int i = 0; i < 2; ++i) {
                        out[i].assign(tokens * m.n, std::nanf(""));
                        kernels[i](packed, r0, r1, a, 0, tokens, out[i].data() + r0, m.n);
                    }
                    REQUIRE(std::memcmp(out[0].data(), out[1].data(), 4 * out[0].size()) == 0);
                }
            }
        }
    }
}

TEST_CASE("qmatmul: int8 activations move the product by at most d/2 per weight", "[qdot]") {
    uint32_t seed = 300;
    for (QType t : quantized_types())
        for (uint64_t k : {uint64_t{172}, uint64_t{4096}}) {
            const uint64_t tokens = 3, n = 7;
            const Matrix m = make_matrix(t, n, k, seed++);
            const auto x = test::kernel_activations(tokens, k, seed++);
            QActivations a8, a32;
            a8.prepare(QActivations::Mode::int8, x.data(), tokens, k);
            a32.prepare(QActivations::Mode::f32, x.data(), tokens, k);
            const auto out = run(cpu_isa(), m, a8);
            for (uint64_t tok = 0; tok < tokens; ++tok)
                for (uint64_t r = 0; r < n; ++r) {
                    INFO("qtype " << qtype_traits(t).name << " k " << k << " row " << r);
                    const Reference exact = reference(m, r, a32, tok);
                    const Reference int8 = reference(m, r, a8, tok);
                    double bound = 0.0;
                    for (uint64_t j = 0; j < k; ++j)
                        bound += a8.scales(tok)[j / kBlock] * (0.5 + 0x1p-16) *
                                 std::fabs(m.w[r * k + j]);
                    REQUIRE(std::fabs(int8.value - exact.value) <= bound);
                    const double f = out[tok * (n + 2) + r];
                    REQUIRE(std::fabs(f - exact.value) <=
                            bound + 1.01 *
                                        roundings(QActivations::Mode::int8,
                                                  cpu_isa() == Isa::scalar, k, t) *
                                        kU * int8.magnitude);
                }
        }
}

TEST_CASE("qmatmul: every row and token tiling gives the same bits", "[qdot]") {
    uint32_t seed = 500;
    for (QType t : quantized_types())
        for (uint64_t k : {uint64_t{100}, uint64_t{576}, uint64_t{1000}}) {
            const uint64_t n = 13, tokens = 17;
            const Matrix m = make_matrix(t, n, k, seed++);
            const auto x = test::kernel_activations(tokens, k, seed++);
            for (auto mode : {QActivations::Mode::int8, QActivations::Mode::f32})
                for (Isa isa : cpu_isa_levels()) {
                    INFO("qtype " << qtype_traits(t).name << " k " << k << " mode "
                                  << mode_name(mode) << " isa " << isa_name(isa));
                    QActivations a;
                    a.prepare(mode, x.data(), tokens, k);
                    const auto whole = run(isa, m, a);  // prefill: the level's token tiles
                    const uint64_t ldo = n + 2;
                    // Decode: one token at a time, rows split as 2 and 3 threads would split them.
                    for (uint64_t parts : {1u, 2u, 3u}) {
                        std::vector<float> out(tokens * ldo, std::nanf(""));
                        for (uint64_t tok = 0; tok < tokens; ++tok)
                            for (uint64_t p = 0; p < parts; ++p) {
                                const uint64_t r0 = n * p / parts, r1 = n * (p + 1) / parts;
                                qmatmul_isa(isa, t, m.bytes.data(), m.stride, r0, r1, a, tok,
                                            tok + 1, out.data() + tok * ldo + r0, ldo);
                            }
                        for (uint64_t tok = 0; tok < tokens; ++tok)
                            REQUIRE(std::memcmp(&out[tok * ldo], &whole[tok * ldo], 4 * n) == 0);
                    }
                    // Token ranges that start mid-tile and leave 1, 2 or 3 tokens over; odd rows.
                    for (auto [t0, t1] :
                         {std::pair<uint64_t, uint64_t>{2, 9}, {5, 7}, {1, 16}, {16, 17}})
                        for (auto [r0, r1] :
                             {std::pair<uint64_t, uint64_t>{0, 13}, {3, 10}, {12, 13}}) {
                            const uint64_t l = r1 - r0 + 3;  // an ldo wider than the rows
                            std::vector<float> out((t1 - t0) * l, std::nanf(""));
                            qmatmul_isa(isa, t, m.bytes.data(), m.stride, r0, r1, a, t0, t1,
                                        out.data(), l);
                            for (uint64_t tok = t0; tok < t1; ++tok)
                                REQUIRE(std::memcmp(&out[(tok - t0) * l], &whole[tok * ldo + r0],
                                                    4 * (r1 - r0)) == 0);
                        }
                }
        }
}

TEST_CASE("qmatmul: a non-finite activation makes its products NaN, never a finite number",
          "[qdot]") {
    for (QType t : quantized_types()) {
        const uint64_t k = 200, n = 3, tokens = 2;
        const Matrix m = make_matrix(t, n, k, 900);
        auto x = test::kernel_activations(tokens, k, 901);
        x[k + 150] = std::numeric_limits<float>::infinity();  // token 1 only
        for (auto mode : {QActivations::Mode::int8, QActivations::Mode::f32}) {
            QActivations a;
            a.prepare(mode, x.data(), tokens, k);
            for (Isa isa : cpu_isa_levels()) {
                const auto out = run(isa, m, a);
                for (uint64_t r = 0; r < n; ++r) {
                    INFO("qtype " << qtype_traits(t).name << " isa " << isa_name(isa) << " row "
                                  << r);
                    REQUIRE(std::isfinite(out[r]));
                    REQUIRE_FALSE(std::isfinite(out[(n + 2) + r]));
                }
            }
        }
    }
}

TEST_CASE("qmatmul_packed: a non-finite activation among 16+ tokens is NaN in its token only",
          "[qdot]") {
    // 17 and 33 tokens: the AMX kernel where this process uses it (a whole tile and a partial
    // one), the VNNI kernel otherwise; token 16 (the partial tile's first) has an infinity in
    // block 2, token 3 a NaN in its last, partial block. Every other output stays finite and
    // equals the scalar reference's bits.
    for (QType t : quantized_types()) {
        if (!qmatmul_packed_serves(cpu_isa(), t)) continue;
        const uint64_t k = 300, n = 40;
        const Matrix m = make_matrix(t, n, k, 950);
        QPackedRows packed(t, n, k);
        packed.pack(m.bytes.data(), m.stride, 0, packed.tiles());
        for (uint64_t tokens : {uint64_t{17}, uint64_t{33}}) {
            auto x = test::kernel_activations(tokens, k, 951);
            x[16 * k + 70] = std::numeric_limits<float>::infinity();
            x[3 * k + k - 1] = std::nanf("");
            QActivations a;
            a.prepare(QActivations::Mode::int8, x.data(), tokens, k);
            const auto exact = run(Isa::scalar, m, a);
            std::vector<float> out(tokens * (n + 2), 0.0f);
            qmatmul_packed(packed, 0, n, a, 0, tokens, out.data(), n + 2);
            for (uint64_t tok = 0; tok < tokens; ++tok)
                for (uint64_t r = 0; r < n; ++r) {
                    INFO("qtype " << qtype_traits(t).name << " tokens " << tokens << " token "
                                  << tok << " row " << r << (a.has_tiles() ? " (AMX)" : ""));
                    const float v = out[tok * (n + 2) + r];
                    if (tok == 16 || tok == 3) {
                        REQUIRE_FALSE(std::isfinite(v));
                        continue;
                    }
                    REQUIRE(std::isfinite(v));
                    const float e = exact[tok * (n + 2) + r];
                    REQUIRE(std::memcmp(&v, &e, 4) == 0);
                }
            // Tokens from 16 on (the second tile group: the AMX kernel's operands from group 1),
            // rows from inside a tile.
            std::vector<float> late((tokens - 16) * n, 0.0f);
            qmatmul_packed(packed, 5, n, a, 16, tokens, late.data(), n);
            for (uint64_t tok = 17; tok < tokens; ++tok)
                for (uint64_t r = 5; r < n; ++r) {
                    INFO("tokens 16.." << tokens << " token " << tok << " row " << r);
                    const float v = late[(tok - 16) * n + (r - 5)];
                    const float e = exact[tok * (n + 2) + r];
                    REQUIRE(std::memcmp(&v, &e, 4) == 0);
                }
        }
    }
}

TEST_CASE("QActivations int8: codes, scales, sums and the AVX2 layout", "[qdot]") {
    for (uint64_t k : {uint64_t{1}, uint64_t{64}, uint64_t{100}, uint64_t{300}, uint64_t{520}}) {
        const uint64_t tokens = 2;
        auto x = test::kernel_activations(tokens, k, 77);
        if (k >= 64)
            for (uint64_t j = 32; j < 64; ++j) x[j] = 0.0f;  // an all-zero block
        if (k >= 300)  // a block whose x / d land on halves: 127 / 127 * (i + 0.5)
            for (uint64_t j = 256; j < 288; ++j)
                x[j] = j == 256 ? 127.0f : static_cast<float>(j % 32) + 0.5f;
        QActivations a;
        a.prepare(QActivations::Mode::int8, x.data(), tokens, k);
        const uint64_t blocks = (k + 31) / 32;
        REQUIRE(a.blocks() == blocks);
        for (uint64_t t = 0; t < tokens; ++t)
            for (uint64_t b = 0; b < blocks; ++b) {
                float amax = 0.0f;
                int32_t sum = 0;
                for (uint64_t j = b * 32; j < std::min(k, b * 32 + 32); ++j)
                    amax = std::max(amax, std::fabs(x[t * k + j]));
                REQUIRE(a.scales(t)[b] == amax / 127.0f);
                for (uint64_t i = 0; i < 32; ++i) {
                    const uint64_t j = b * 32 + i;
                    const int8_t q = a.codes(t)[j];
                    sum += q;
                    REQUIRE(std::abs(q) <= 127);
                    if (j >= k) {
                        REQUIRE(q == 0);
                    } else if (amax > 0.0f) {
                        // Exactly round-to-nearest-even of x / d, whichever path (AVX2 or scalar).
                        REQUIRE(q ==
                                static_cast<int8_t>(std::nearbyint(x[t * k + j] / a.scales(t)[b])));
                        REQUIRE(std::fabs(x[t * k + j] - a.scales(t)[b] * q) <=
                                a.scales(t)[b] * (0.5 + 0x1p-16));
                    }
                    // pair order: [2p lo][2p+1 lo][2p hi][2p+1 hi]; a last odd block in order
                    const bool single = b + 1 == blocks && b % 2 == 0;
                    const uint64_t at =
                        single ? j : (b / 2) * 64 + (i / 16) * 32 + (b % 2) * 16 + i % 16;
                    REQUIRE(a.pair_codes(t)[at] == q);
                }
                REQUIRE(a.sums(t)[b] == sum);
                REQUIRE(a.scaled_sums(t)[b] == a.scales(t)[b] * static_cast<float>(sum));
            }
    }
    // The AMX tile layout (16 or more tokens where cpu_uses_amx_int8()): the same values, token u
    // of group g as row u of each block's operand, scales and sums as runs of 16.
    for (uint64_t k : {uint64_t{40}, uint64_t{300}}) {
        const uint64_t tokens = 21;
        const auto x = test::kernel_activations(tokens, k, 78);
        QActivations a;
        a.prepare(QActivations::Mode::int8, x.data(), tokens, k);
        REQUIRE(a.has_tiles() == cpu_uses_amx_int8());
        if (!a.has_tiles()) continue;
        for (uint64_t t = 0; t < tokens; ++t)
            for (uint64_t b = 0; b < a.blocks(); ++b) {
                const uint64_t g = t / 16, u = t % 16;
                REQUIRE(std::memcmp(a.tile_codes(g, b) + 32 * u, a.codes(t) + 32 * b, 32) == 0);
                REQUIRE(a.tile_scales(g, b)[u] == a.scales(t)[b]);
                REQUIRE(a.tile_sums(g, b)[u] == a.sums(t)[b]);
                REQUIRE(a.tile_scaled_sums(g, b)[u] == a.scaled_sums(t)[b]);
            }
        QActivations few;
        few.prepare(QActivations::Mode::int8, x.data(), 15, k);
        REQUIRE_FALSE(few.has_tiles());  // below a whole tile the AMX kernel is never asked
    }
}

TEST_CASE("QActivations reused, and prepared a range of tokens at a time, equals a fresh prepare",
          "[qdot]") {
    // The runtime sizes the buffers once and lets threads prepare ranges of tokens; buffers a
    // larger earlier input filled must not leak into the padding, an all-zero block's codes or a
    // non-finite block's (which the quantizers leave unwritten).
    for (auto mode : {QActivations::Mode::int8, QActivations::Mode::f32})
        for (uint64_t k : {uint64_t{72}, uint64_t{100}, uint64_t{300}}) {  // 3, 4 and 10 blocks
            const uint64_t tokens = 3;
            auto x = test::kernel_activations(tokens, k, 91);
            for (uint64_t j = 32; j < 64; ++j) x[j] = 0.0f;                  // token 0, block 1
            x[k + 70] = std::numeric_limits<float>::infinity();              // token 1, block 2
            for (uint64_t j = k / 32 * 32; j < k; ++j) x[2 * k + j] = 0.0f;  // token 2's last,
            x[2 * k + k - 1] = k == 300 ? std::nanf("") : 0.0f;              // partial block
            const auto big = test::kernel_activations(5, 520, 92);
            // Ranges in both orders, so a write past a range would show in the one prepared first.
            const std::pair<uint64_t, uint64_t> ranges[2] = {{1, tokens}, {0, 1}};
            QActivations reused[2], fresh;
            for (int order = 0; order < 2; ++order) {
                reused[order].prepare(mode, big.data(), 5, 520);
                reused[order].resize(mode, tokens, k);
                for (int r = 0; r < 2; ++r) {
                    const auto [t0, t1] = ranges[(r + order) % 2];
                    reused[order].prepare_tokens(x.data(), t0, t1);
                }
            }
            fresh.prepare(mode, x.data(), tokens, k);
            const uint64_t padded = fresh.blocks() * 32, stride = (fresh.blocks() + 7) / 8 * 8;
            INFO("k " << k << (mode == QActivations::Mode::int8 ? " int8" : " f32"));
            for (const QActivations& re : reused)
                for (uint64_t t = 0; t < tokens; ++t) {
                    if (mode == QActivations::Mode::f32) {
                        REQUIRE(std::memcmp(re.floats(t), fresh.floats(t), 4 * padded) == 0);
                        continue;
                    }
                    REQUIRE(std::memcmp(re.codes(t), fresh.codes(t), padded) == 0);
                    REQUIRE(std::memcmp(re.pair_codes(t), fresh.pair_codes(t), padded) == 0);
                    REQUIRE(std::memcmp(re.scales(t), fresh.scales(t), 4 * stride) == 0);
                    REQUIRE(std::memcmp(re.scaled_sums(t), fresh.scaled_sums(t), 4 * stride) == 0);
                    REQUIRE(std::memcmp(re.sums(t), fresh.sums(t), 4 * fresh.blocks()) == 0);
                    for (uint64_t j = 32; j < 64 && t == 0; ++j) REQUIRE(fresh.codes(0)[j] == 0);
                    for (uint64_t j = 64; j < 96 && t == 1; ++j) REQUIRE(fresh.codes(1)[j] == 0);
                    for (uint64_t j = k / 32 * 32; j < padded && t == 2; ++j)
                        REQUIRE(fresh.codes(2)[j] == 0);
                }
        }
}

TEST_CASE("qmatmul on float rows in f32 mode is dot_row", "[qdot]") {
    const uint64_t k = 100, n = 3;
    const auto w = test::kernel_activations(n, k, 11);
    const auto x = test::kernel_activations(2, k, 12);
    QActivations a;
    a.prepare(QActivations::Mode::f32, x.data(), 2, k);
    std::vector<float> out(2 * n);
    qmatmul(QType::f32, reinterpret_cast<const uint8_t*>(w.data()), 4 * k, 0, n, a, 0, 2,
            out.data(), n);
    for (uint64_t t = 0; t < 2; ++t)
        for (uint64_t r = 0; r < n; ++r)
            REQUIRE(out[t * n + r] == dot_row(QType::f32,
                                              reinterpret_cast<const uint8_t*>(w.data() + r * k),
                                              x.data() + t * k, k));
}

TEST_CASE("dequantize_rows equals dequantize_row_ref bit for bit", "[qdot]") {
    uint32_t seed = 700;
    for (QType t : quantized_types())
        for (uint64_t k : {uint64_t{1}, uint64_t{31}, uint64_t{100}, uint64_t{172}, uint64_t{576},
                           uint64_t{1000}}) {
            INFO("qtype " << qtype_traits(t).name << " k " << k);
            const Matrix m = make_matrix(t, 5, k, seed++);
            for (Isa isa : cpu_isa_levels()) {
                INFO("isa " << isa_name(isa));
                std::vector<float> out(5 * k + 1, std::nanf(""));
                dequantize_rows_isa(isa, t, m.bytes.data(), m.stride, 5, k, out.data());
                REQUIRE(std::memcmp(out.data(), m.w.data(), 4 * 5 * k) == 0);
                REQUIRE(std::isnan(out[5 * k]));
            }
        }
}

TEST_CASE("qmatmul: a type outside the table or a level above the CPU's throws", "[qdot]") {
    const uint64_t k = 64;
    const auto x = test::kernel_activations(1, k, 13);
    QActivations a;
    a.prepare(QActivations::Mode::int8, x.data(), 1, k);
    std::vector<uint8_t> w(4096, 0);
    float out = 0.0f;
    const auto unknown = static_cast<QType>(kQTypeCount);
    for (Isa isa : cpu_isa_levels()) {
        REQUIRE_THROWS_AS(qmatmul_isa(isa, unknown, w.data(), 64, 0, 1, a, 0, 1, &out, 1), Error);
        REQUIRE_THROWS_AS(dequantize_rows_isa(isa, unknown, w.data(), 64, 1, k, &out), Error);
    }
    REQUIRE_THROWS_AS(qmatmul(unknown, w.data(), 64, 0, 1, a, 0, 1, &out, 1), Error);
    REQUIRE_THROWS_AS(qmatmul_scalar(unknown, w.data(), 64, 0, 1, a, 0, 1, &out, 1), Error);
    REQUIRE_THROWS_AS(row_to_f32(unknown, w.data(), &out, 1), Error);
    std::vector<float> xs(k, 1.0f);  // dot_row serves float rows only
    REQUIRE_THROWS_AS(dot_row(QType::q8, w.data(), xs.data(), k), Error);
    REQUIRE_THROWS_AS(dot_row_scalar(unknown, w.data(), xs.data(), k), Error);
    for (Isa isa : kIsaLevels)
        if (isa > cpu_isa())
            REQUIRE_THROWS_AS(qmatmul_isa(isa, QType::q8, w.data(), 64, 0, 1, a, 0, 1, &out, 1),
                              Error);
}

}  // namespace kernels_qdot_test
