// formats/qtype: the row layout against an independent recomputation, and the reference
// quantizer's round trip within each type's stored error bound (error_bound * the group's scale,
// nothing more), on awkward lengths and groups: all-zero, constant, huge, tiny, mixed magnitudes.
#include "formats/qtype.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>
#include "test_support.hpp"

namespace qtype_test {

using namespace qforge;
using qforge::test::quantized_types;

namespace {

// Row lengths: 1, one chunk, a TinyLlama/SmolLM2 width, large, and lengths that end inside a
// chunk or a group of every size (100 = 3 * 32 + 4, 172 = 5 * 32 + 12, 200 = 128 + 64 + 8; 64:
// half a 3-bit chunk).
constexpr uint64_t kLengths[] = {1, 32, 64, 100, 172, 200, 576, 4096};

// The steps a group's range is divided into: q8 amax / 127, q4s m / 8, asymmetric 2^bits - 1;
// level types m / -levels[0] (127).
double levels_of(QType t) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.bits == 8) return 127.0;
    if (tr.nonuniform) return 127.0;  // m on the lowest level, -127 (fixed or learned)
    return tr.symmetric ? 8.0 : static_cast<double>((1 << tr.bits) - 1);
}

uint64_t group_of(QType t, uint64_t k) {
    const uint64_t g = qtype_traits(t).group;
    return g ? g : k;
}

struct Quantized {
    std::vector<uint8_t> row;
    std::vector<float> back;
};

Quantized quantize_ok(QType t, const std::vector<float>& w, uint8_t fill = 0xa5) {
    const uint64_t k = w.size();
    Quantized q;
    q.row.assign(*qtype_row_bytes(t, k), fill);  // the quantizer must overwrite every byte
    REQUIRE(quantize_row_ref(t, w.data(), k, q.row.data()) == QuantStatus::ok);
    q.back.assign(k, std::nanf(""));
    dequantize_row_ref(t, q.row.data(), k, q.back.data());
    return q;
}

// Every weight back within error_bound * |scale| of the group; codes in range; dequantization
// exactly scale * (code - zero); the scale no larger than the fp16 round-up of the group's range
// over its levels (so the bound is not met by a lazy, oversized scale).
void check_round_trip(QType t, const std::vector<float>& w) {
    const QTypeTraits& tr = qtype_traits(t);
    const uint64_t k = w.size();
    const uint64_t group = group_of(t, k);
    const Quantized q = quantize_ok(t, w);
    INFO("qtype " << tr.name << " k " << k);
    for (uint64_t g = 0; g * group < k; ++g) {
        const float s = row_group_scale(t, q.row.data(), k, g);
        const int32_t z = row_group_zero(t, q.row.data(), k, g);
        const float mn = row_group_min(t, q.row.data(), k, g);  // super-block types; else 0
        REQUIRE(mn >= 0.0f);
        REQUIRE(std::isfinite(s));
        REQUIRE(z >= 0);
        REQUIRE(z <= (tr.symmetric ? 15 : (1 << tr.bits) - 1));
        float lo = 0.0f, hi = 0.0f, amax = 0.0f;
        for (uint64_t j = g * group; j < std::min(k, (g + 1) * group); ++j) {
            INFO("group " << g << " j " << j << " w " << w[j] << " back " << q.back[j]);
            const int32_t c = row_code(t, q.row.data(), j);
            REQUIRE(c >= (tr.signed_codes ? -127 : 0));
            REQUIRE(c <= (tr.signed_codes ? 127 : (1 << tr.bits) - 1));
            const int8_t* lv = row_levels(t, q.row.data(), k);
            REQUIRE(q.back[j] == s * static_cast<float>(qtype_code_level(t, c, lv) - z) - mn);
            REQUIRE(std::fabs(static_cast<double>(q.back[j]) - w[j]) <=
                    qtype_row_error_bound(t, q.row.data(), k) * std::fabs(static_cast<double>(s)));
            lo = std::min(lo, w[j]);
            hi = std::max(hi, w[j]);
            amax = std::max(amax, std::fabs(w[j]));
        }
        const double range = tr.symmetric ? amax : static_cast<double>(hi) - lo;
        const double levels = levels_of(t);
        // fp16 rounds up by at most one ulp: relative 2^-10 for normals, 2^-24 for subnormals.
        double max_scale = range / levels * (1.0 + 0x1p-10 + 0x1p-20) + 0x1p-24;
        if (tr.super_block) {
            // The min rounds up by less than one dmin and the 6-bit scale by less than one d.
            const QSuperParams sp = row_super_params(t, q.row.data(), k, g / 8);
            REQUIRE(static_cast<double>(mn) < -lo + sp.dmin + 0x1p-24);
            max_scale = (range + sp.dmin) / levels * (1.0 + 0x1p-20) + sp.d + 0x1p-24;
        }
        REQUIRE(std::fabs(static_cast<double>(s)) <= max_scale);
        if (range == 0.0) REQUIRE(s == 0.0f);
    }
}

std::vector<float> normal_weights(uint64_t k, float sigma, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> w(k);
    for (auto& v : w) v = dist(rng);
    return w;
}

}  // namespace

TEST_CASE("qtype layout: offsets and row bytes match an independent recomputation", "[qtype]") {
    for (const auto& tr : kQTypes) {
        INFO("qtype " << tr.name);
        if (tr.is_float) {
            REQUIRE_FALSE(qtype_row_layout(tr.type, 64).has_value());
            REQUIRE(*qtype_row_bytes(tr.type, 7) == 7 * (tr.bits / 8));
            continue;
        }
        REQUIRE_FALSE(qtype_row_layout(tr.type, 0).has_value());
        for (uint64_t k = 1; k <= 1100; k += (k < 300 ? 1 : 37)) {
            INFO("k " << k);
            const auto l = qtype_row_layout(tr.type, k);
            REQUIRE(l.has_value());
            const uint64_t group = tr.group ? tr.group : k;
            uint64_t groups = 0;
            while (groups * group < k) ++groups;
            // Chunks: 32 weights in 32 (8-bit) or 16 (4-bit) bytes, 128 in 48 bytes (3-bit).
            const uint64_t chunk_weights = tr.bits == 3 ? 128 : 32;
            uint64_t chunks = 0;
            while (chunks * chunk_weights < k) ++chunks;
            const uint64_t codes = chunks * (tr.bits == 8 ? 32 : tr.bits == 4 ? 16 : 48);
            // Learned-table types: the row's 16 int8 levels after the scales.
            uint64_t end =
                codes + 2 * groups + (tr.symmetric ? 0 : groups) + (tr.row_levels ? 16 : 0);
            if (tr.super_block) {
                // 16-byte records per 256 weights; a last partial one of G groups holds 4 bytes
                // of d and dmin and 12 bits per group.
                const uint64_t last_groups = (groups % 8 != 0) ? groups % 8 : 0;
                end =
                    codes + 16 * (groups / 8) + (last_groups ? 4 + (12 * last_groups + 7) / 8 : 0);
            }
            const uint64_t row = end;  // no padding (format version 2)
            uint64_t v1_row = 0;
            while (v1_row < end) v1_row += 64;
            REQUIRE(l->k == k);
            REQUIRE(l->group == group);
            REQUIRE(l->groups == groups);
            REQUIRE(l->codes_bytes == codes);
            REQUIRE(l->scales_offset == codes);
            REQUIRE(l->zeros_offset == (tr.symmetric || tr.super_block ? row : codes + 2 * groups));
            REQUIRE(l->levels_offset == (tr.row_levels ? row - 16 : row));
            REQUIRE(l->row_bytes == row);
            REQUIRE(*qtype_row_bytes(tr.type, k) == row);
            const uint64_t shape[2] = {3, k};
            REQUIRE(*qtype_tensor_bytes(tr.type, shape) == 3 * row);
            // Format version 1: the same row followed by zeros to a multiple of 64.
            const auto v1 = qtype_row_layout(tr.type, k, kQfV1RowAlign);
            REQUIRE(v1->row_bytes == v1_row);
            REQUIRE(v1->scales_offset == l->scales_offset);
            if (!tr.symmetric && !tr.super_block) REQUIRE(v1->zeros_offset == l->zeros_offset);
            REQUIRE(*qtype_tensor_bytes(tr.type, shape, kQfV1RowAlign) == 3 * v1_row);
        }
    }
    // Known values: TinyLlama's 2048-wide rows.
    REQUIRE(qtype_row_layout(QType::q4_g32, 2048)->row_bytes == 1024 + 128 + 64);
    REQUIRE(qtype_row_layout(QType::q4s_g128, 2048)->row_bytes == 1024 + 32);
    REQUIRE(qtype_row_layout(QType::q4s_g128, 2048, kQfV1RowAlign)->row_bytes == 1024 + 64);
    REQUIRE(qtype_row_layout(QType::q8, 2048)->row_bytes == 2048 + 2);
    REQUIRE(qtype_bits_per_weight(QType::q4_g32, 2048) == Approx(4.75));
    // SmolLM2's 576-wide rows: q4s_g32 is Q4_0's 4.5 bits per weight (324 bytes; 384 padded).
    REQUIRE(qtype_row_layout(QType::q4s_g32, 576)->row_bytes == 288 + 36);
    REQUIRE(qtype_row_layout(QType::q4s_g32, 576, kQfV1RowAlign)->row_bytes == 384);
    REQUIRE(qtype_bits_per_weight(QType::q4s_g32, 576) == Approx(4.5));
    // 3-bit at 4096: 32 chunks of 48 bytes, then 128 scales and 128 zeros (g32: exactly 3.75
    // bits per weight), or 32 scales and 32 zeros (g128: 3.1875; 1664 bytes padded).
    REQUIRE(qtype_row_layout(QType::q3_g32, 4096)->row_bytes == 1536 + 256 + 128);
    REQUIRE(qtype_row_layout(QType::q3_g128, 4096)->row_bytes == 1536 + 64 + 32);
    REQUIRE(qtype_row_layout(QType::q3_g128, 4096, kQfV1RowAlign)->row_bytes == 1664);
    REQUIRE(qtype_bits_per_weight(QType::q3_g32, 4096) == Approx(3.75));
    REQUIRE(qtype_row_layout(QType::q3_g32, 172)->codes_bytes == 96);  // two chunks
    const uint64_t huge[2] = {uint64_t{1} << 40, uint64_t{1} << 30};
    REQUIRE_FALSE(qtype_tensor_bytes(QType::q8, huge).has_value());
}

TEST_CASE("quantize_row_ref round trip: within error_bound * scale for every quantized type",
          "[qtype]") {
    uint32_t seed = 1;
    for (QType t : quantized_types())
        for (uint64_t k : kLengths) {
            check_round_trip(t, normal_weights(k, 0.02f, seed++));
            // Mixed magnitudes: every 32 weights a different scale, from 1e-6 to 1e4.
            auto w = normal_weights(k, 1.0f, seed++);
            for (uint64_t j = 0; j < k; ++j)
                w[j] *= std::pow(10.0f, static_cast<float>(static_cast<int>(j / 32 % 11) - 6));
            check_round_trip(t, w);
            // One-signed rows and a single outlier.
            auto pos = normal_weights(k, 1.0f, seed++);
            for (auto& v : pos) v = std::fabs(v) + 0.5f;
            check_round_trip(t, pos);
            for (auto& v : pos) v = -v;
            check_round_trip(t, pos);
            auto outlier = normal_weights(k, 0.01f, seed++);
            outlier[k / 2] = 3.0f;
            check_round_trip(t, outlier);
        }
}

TEST_CASE("quantize_row_ref special groups: zero, constant, huge, tiny", "[qtype]") {
    for (QType t : quantized_types())
        for (uint64_t k : {uint64_t{1}, uint64_t{172}, uint64_t{576}}) {
            INFO("qtype " << qtype_traits(t).name << " k " << k);
            const std::vector<float> zeros(k, 0.0f);
            const Quantized q = quantize_ok(t, zeros);
            for (float v : q.back) REQUIRE(v == 0.0f);
            for (uint64_t g = 0; g * group_of(t, k) < k; ++g)
                REQUIRE(row_group_scale(t, q.row.data(), k, g) == 0.0f);
            for (float c : {1.0f, -1.0f, 0.3f, -7.25f, 1e4f, -1e4f, 1e-6f, -1e-6f, 1e-30f})
                check_round_trip(t, std::vector<float>(k, c));
            for (float sigma : {1e4f, 1e-6f, 1e-30f})
                check_round_trip(t, normal_weights(k, sigma, 9));
            // Groups of different kinds side by side: zero, constant, huge, tiny, normal.
            std::vector<float> mixed = normal_weights(k, 1.0f, 11);
            for (uint64_t j = 0; j < k; ++j) {
                switch (j / 32 % 5) {
                    case 0:
                        mixed[j] = 0.0f;
                        break;
                    case 1:
                        mixed[j] = 0.75f;
                        break;
                    case 2:
                        mixed[j] *= 1e4f;
                        break;
                    case 3:
                        mixed[j] *= 1e-30f;
                        break;
                    default:
                        break;
                }
            }
            check_round_trip(t, mixed);
            // The same magnitude with both signs: q4s clamps +8 to +7 (its bound is one step).
            std::vector<float> pm(k, 0.0f);
            for (uint64_t j = 0; j < k; ++j)
                pm[j] = (j % 2 ? 1.0f : -1.0f) * static_cast<float>(j % 3 + 1);
            check_round_trip(t, pm);
        }
}

// Level types: every code is the level nearest w / scale (found here in float64 over all 16),
// the scale is m / -127 rounded up in magnitude (m the first weight of largest magnitude), and the
// bound is reached: a weight of m's magnitude and the opposite sign lands 14 units away.
// The compile-time flag and the levels pointer say the same thing on every row.
TEST_CASE("qtype table: nonuniform is set exactly where levels are", "[qtype]") {
    for (const QTypeTraits& tr : kQTypes) {
        INFO(tr.name);
        CHECK(tr.nonuniform == (tr.levels != nullptr || tr.row_levels));
        CHECK_FALSE((tr.levels != nullptr && tr.row_levels));
    }
}

TEST_CASE("q4nl rows: nearest levels, the scale on the lowest level, the bound of 14 reached",
          "[qtype]") {
    for (const QTypeTraits& tr : kQTypes) {
        if (!tr.levels) continue;
        for (uint64_t k : kLengths) {
            INFO("qtype " << tr.name << " k " << k);
            std::vector<float> w = normal_weights(k, 0.5f, 21);
            const Quantized q = quantize_ok(tr.type, w);
            for (uint64_t g = 0; g * tr.group < k; ++g) {
                const uint64_t b = g * tr.group, e = std::min(k, b + tr.group);
                float m = 0.0f;
                for (uint64_t j = b; j < e; ++j)
                    if (std::fabs(w[j]) > std::fabs(m)) m = w[j];
                const float s = row_group_scale(tr.type, q.row.data(), k, g);
                REQUIRE(s != 0.0f);
                REQUIRE((s < 0.0f) == (m > 0.0f));  // m sits on level -127
                REQUIRE(std::fabs(static_cast<double>(s)) >= std::fabs(m) / 127.0);
                REQUIRE(std::fabs(static_cast<double>(s)) <=
                        std::fabs(m) / 127.0 * (1.0 + 0x1p-10) + 0x1p-24);
                for (uint64_t j = b; j < e; ++j) {
                    INFO("j " << j);
                    const double x = static_cast<double>(w[j]) / s;
                    double best = 1e300;
                    for (int c = 0; c < 16; ++c) best = std::min(best, std::fabs(x - tr.levels[c]));
                    const int32_t c = row_code(tr.type, q.row.data(), j);
                    REQUIRE(std::fabs(x - tr.levels[c]) <= best + 1e-4);
                }
            }
        }
        // +-1 in one group: -1 is m (the first of largest magnitude) on -127, +1 is 127 units
        // up, nearest to 113: exactly 14 units of the scale away.
        const std::vector<float> pm = {-1.0f, 1.0f};
        const Quantized q = quantize_ok(tr.type, pm);
        const double s = row_group_scale(tr.type, q.row.data(), 2, 0);
        REQUIRE(std::fabs(q.back[0] + 1.0) <= 0x1p-10);
        REQUIRE(q.back[1] == static_cast<float>(113.0 * s));
        REQUIRE(std::fabs(q.back[1] - 1.0) >= 14.0 * s - 0x1p-10);  // 1 <= 127 s <= 1 + 2^-10
        REQUIRE(std::fabs(q.back[1] - 1.0) <= tr.error_bound * s);
    }
}

// Groups of weights below about 1e-43 (float subnormals) make amax / 127 (or range / 15) round to
// 0 in float; the stored scale must still be non-zero (the smallest fp16 subnormal), or the
// weights come back as 0 where the bound (error_bound * scale) would be 0.
TEST_CASE("quantize_row_ref: float-subnormal weights keep a non-zero scale", "[qtype]") {
    for (QType t : quantized_types()) {
        INFO("qtype " << qtype_traits(t).name);
        check_round_trip(t, std::vector<float>(64, 1e-44f));
    }
}

TEST_CASE("quantize_row_ref: f16 and bf16 refuse values that round to infinity", "[qtype]") {
    // bf16's largest finite value is 0x7f7f (about 3.3895e38); 3.4e38 rounds up to infinity.
    std::vector<uint8_t> row(8);
    const float bf16_over[] = {3.4e38f, -3.4e38f};
    for (float v : bf16_over)
        REQUIRE(quantize_row_ref(QType::bf16, &v, 1, row.data()) == QuantStatus::scale_overflow);
    const float bf16_ok = 3.38e38f;
    REQUIRE(quantize_row_ref(QType::bf16, &bf16_ok, 1, row.data()) == QuantStatus::ok);
    const float f16_over = 65520.0f, f16_ok = 65504.0f;
    REQUIRE(quantize_row_ref(QType::f16, &f16_over, 1, row.data()) == QuantStatus::scale_overflow);
    REQUIRE(quantize_row_ref(QType::f16, &f16_ok, 1, row.data()) == QuantStatus::ok);
}

TEST_CASE("quantize_row_ref refuses NaN, infinities and scales beyond fp16", "[qtype]") {
    const float bad[] = {std::nanf(""), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity()};
    for (QType t : quantized_types())
        for (uint64_t k : {uint64_t{1}, uint64_t{172}}) {
            INFO("qtype " << qtype_traits(t).name << " k " << k);
            std::vector<uint8_t> row(*qtype_row_bytes(t, k));
            for (float b : bad)
                for (uint64_t pos : {uint64_t{0}, k - 1}) {
                    auto w = normal_weights(k, 1.0f, 5);
                    w[pos] = b;
                    REQUIRE(quantize_row_ref(t, w.data(), k, row.data()) ==
                            QuantStatus::non_finite);
                }
            // Largest fp16 is 65504: q4s needs |w| / 8, q4 range / 15, q3 range / 7, q8 amax / 127
            // to fit.
            for (float huge : {1e9f, -1e9f, 3e38f}) {
                auto w = normal_weights(k, 1.0f, 6);
                w[k - 1] = huge;
                REQUIRE(quantize_row_ref(t, w.data(), k, row.data()) ==
                        QuantStatus::scale_overflow);
            }
            // A range that overflows float itself (hi - lo = inf).
            if (k > 1 && !qtype_traits(t).symmetric) {
                auto w = normal_weights(k, 1.0f, 7);
                w[0] = 3e38f;
                w[1] = -3e38f;
                REQUIRE(quantize_row_ref(t, w.data(), k, row.data()) ==
                        QuantStatus::scale_overflow);
            }
            // Just inside the limit still quantizes.
            check_round_trip(t, std::vector<float>(k, static_cast<float>(60000.0 * levels_of(t))));
        }
}

TEST_CASE(
    "quantized rows: padding is zero, codes past k are the zero code, output is deterministic",
    "[qtype]") {
    for (QType t : quantized_types()) {
        const QTypeTraits& tr = qtype_traits(t);
        for (uint64_t k : kLengths) {
            INFO("qtype " << tr.name << " k " << k);
            const QRowLayout l = *qtype_row_layout(t, k);
            // Negative-only weights give asymmetric groups a non-zero zero point (the top code).
            auto w = normal_weights(k, 1.0f, 3);
            for (auto& v : w) v = -std::fabs(v) - 0.1f;
            const Quantized a = quantize_ok(t, w, 0xff);
            const uint64_t used = tr.super_block  ? l.row_bytes
                                  : tr.row_levels ? l.levels_offset + kRowLevelsBytes
                                  : tr.symmetric  ? l.scales_offset + 2 * l.groups
                                                  : l.zeros_offset + l.groups;
            for (uint64_t i = used; i < l.row_bytes; ++i) REQUIRE(a.row[i] == 0);
            const uint64_t last = l.groups - 1;
            if (tr.super_block) {  // codes past k are 0 (they meet zero activations), see below
                for (uint64_t j = k; j < round_up(k, qtype_code_chunk(t)); ++j)
                    REQUIRE(row_code(t, a.row.data(), j) == 0);
                REQUIRE(quantize_ok(t, w, 0x00).row == a.row);
                continue;
            }
            const int32_t z = row_group_zero(t, a.row.data(), k, last);
            if (!tr.symmetric) REQUIRE(z > 0);
            const float s = row_group_scale(t, a.row.data(), k, last);
            for (uint64_t j = k; j < round_up(k, qtype_code_chunk(t)); ++j) {
                REQUIRE(row_code(t, a.row.data(), j) == z);
                REQUIRE(s * static_cast<float>(row_code(t, a.row.data(), j) - z) == 0.0f);
            }
            // The same bytes whatever the buffer held before, and on a second run.
            const Quantized b = quantize_ok(t, w, 0x00);
            REQUIRE(a.row == b.row);
            REQUIRE(std::memcmp(a.back.data(), b.back.data(), 4 * k) == 0);
        }
    }
}

// The 3-bit planes byte by byte, as docs/FORMAT.md writes them: for one code at a time set to 7
// (every other code 0), exactly one bit pair of the 2-bit plane and one bit of the high plane are
// set, at the documented places; a code of 4 sets only the high bit, 3 only the pair.
TEST_CASE("q3 rows: each code's bits sit where docs/FORMAT.md says", "[qtype]") {
    const uint64_t k = 256;  // two chunks
    const QRowLayout l = *qtype_row_layout(QType::q3_g32, k);
    REQUIRE(l.codes_bytes == 96);
    std::vector<int32_t> codes(k, 0);
    std::vector<QGroupParams> groups(l.groups);  // scale 0, zero 0
    std::vector<uint8_t> row(l.row_bytes);
    for (uint64_t j = 0; j < k; ++j) {
        const uint64_t c = j / 128, b = j % 128 / 32, w = j % 32;
        // Byte i (< 16) of the 2-bit plane: bits 0-1 b0 w_i, 2-3 b0 w_{16+i}, 4-5 b2 w_i, 6-7
        // b2 w_{16+i}; byte 16 + i the same for b1 and b3. High plane byte i: bit 0 b0 w_i, 1 b1
        // w_i, 2 b0 w_{16+i}, 3 b1 w_{16+i}, 4 b2 w_i, 5 b3 w_i, 6 b2 w_{16+i}, 7 b3 w_{16+i}.
        const uint64_t low_byte = 48 * c + (b % 2 == 1 ? 16 : 0) + w % 16;
        const uint64_t low_shift = (b >= 2 ? 4 : 0) + (w >= 16 ? 2 : 0);
        const uint64_t high_byte = 48 * c + 32 + w % 16;
        const uint64_t high_bit = (b % 2) + (w >= 16 ? 2 : 0) + (b >= 2 ? 4 : 0);
        for (int32_t code : {7, 4, 3}) {
            INFO("j " << j << " code " << code);
            codes.assign(k, 0);
            codes[j] = code;
            pack_row(QType::q3_g32, codes.data(), groups.data(), k, row.data());
            for (uint64_t i = 0; i < l.codes_bytes; ++i) {
                uint8_t want = 0;
                if (i == low_byte) want |= static_cast<uint8_t>((code & 3) << low_shift);
                if (i == high_byte) want |= static_cast<uint8_t>((code >> 2) << high_bit);
                REQUIRE(row[i] == want);
            }
            for (uint64_t i = 0; i < k; ++i)
                REQUIRE(row_code(QType::q3_g32, row.data(), i) == codes[i]);
        }
    }
}

// Learned-level rows (q4t_g32): the fitted levels are what the layout promises (ascending,
// distinct, the lowest -127, the top >= 0), every code is the level nearest w / scale (found here
// in float64 over all 16 stored levels), and the fit never does worse than its start, the fixed
// IQ4_NL grid (q4nl_g32, the same scale rule): the squared error of each row, in float64, is at
// most q4nl's, and over heavy-tailed rows (Laplace, Student-t with 3 degrees) clearly below it.
TEST_CASE("q4t rows: valid fitted levels, nearest codes, less error than the fixed grid",
          "[qtype]") {
    std::mt19937 rng(20261202);
    double err_t = 0.0, err_nl = 0.0;
    for (int row = 0; row < 48; ++row) {
        const uint64_t k = row % 3 == 0 ? 576 : row % 3 == 1 ? 2048 : 100;
        std::vector<float> w(k);
        std::exponential_distribution<float> ex(1.0f);
        std::student_t_distribution<float> st(3.0f);
        for (auto& v : w)
            v = row % 2 ? (rng() % 2 ? 1.0f : -1.0f) * ex(rng) * 0.02f : st(rng) * 0.01f;
        INFO("row " << row << " k " << k);
        const Quantized t = quantize_ok(QType::q4t_g32, w);
        const Quantized nl = quantize_ok(QType::q4nl_g32, w);
        const int8_t* lv = row_levels(QType::q4t_g32, t.row.data(), k);
        REQUIRE(lv ==
                reinterpret_cast<const int8_t*>(t.row.data() + k / 32 * 18 + (k % 32 ? 18 : 0)));
        REQUIRE(lv[0] == -127);
        REQUIRE(lv[15] >= 0);
        for (int c = 0; c + 1 < 16; ++c) REQUIRE(lv[c] < lv[c + 1]);
        REQUIRE(qtype_row_error_bound(QType::q4t_g32, t.row.data(), k) <= kRowLevelsBound);
        double et = 0.0, en = 0.0;
        for (uint64_t j = 0; j < k; ++j) {
            const double s = row_group_scale(QType::q4t_g32, t.row.data(), k, j / 32);
            const double x = static_cast<double>(w[j]) / s;
            double best = std::numeric_limits<double>::infinity();
            for (int c = 0; c < 16; ++c) best = std::min(best, std::fabs(x - lv[c]));
            const int32_t code = row_code(QType::q4t_g32, t.row.data(), j);
            REQUIRE(std::fabs(x - lv[code]) <= best + 1e-4);
            et += std::pow(static_cast<double>(t.back[j]) - w[j], 2);
            en += std::pow(static_cast<double>(nl.back[j]) - w[j], 2);
        }
        REQUIRE(et <= en * (1.0 + 1e-12));
        err_t += et;
        err_nl += en;
    }
    INFO("q4t " << err_t << " q4nl " << err_nl);
    CHECK(err_t < 0.95 * err_nl);
}

}  // namespace qtype_test
