// The super-block types (q4k_g32, q3k_g32; formats/qtype.hpp, docs/FORMAT.md "Super-block
// rows"): the record bytes against the document's bit positions, computed here independently;
// the importance-weighted search (quant/rtn_super.hpp) against the reference quantizer's error;
// GPTQ's rows against the error its own loss predicts (so its error feedback saw the stored
// grid). Layout, round trip, kernels and backends are covered by the table-driven tests
// (qtype_test, kernels_qdot_test, backend_ops_test), which iterate these rows too.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "core/half.hpp"
#include "formats/qtype.hpp"
#include "quant/gptq.hpp"
#include "quant/rtn_importance.hpp"
#include "quant/rtn_super.hpp"

namespace qtype_super_test {

using namespace qforge;

namespace {

constexpr QType kSuperTypes[] = {QType::q4k_g32, QType::q3k_g32};

std::vector<float> heavy_weights(uint64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    std::vector<float> w(n);
    for (uint64_t i = 0; i < n; ++i) w[i] = dist(rng) * (i % 37 == 0 ? 6.0f : 1.0f);
    return w;
}

// sum_j a_j (w_j - q_j)^2 over rows of k, q the stored rows dequantized.
double weighted_error(QType t, const std::vector<float>& w, const std::vector<uint8_t>& rows,
                      uint64_t k, const std::vector<double>& a) {
    const uint64_t rb = *qtype_row_bytes(t, k), n = w.size() / k;
    std::vector<float> back(k);
    double e = 0.0;
    for (uint64_t r = 0; r < n; ++r) {
        dequantize_row_ref(t, rows.data() + r * rb, k, back.data());
        for (uint64_t j = 0; j < k; ++j) {
            const double d = double(w[r * k + j]) - back[j];
            e += a[j] * d * d;
        }
    }
    return e;
}

}  // namespace

TEST_CASE("super-block records: d, dmin and each 6-bit value sit where docs/FORMAT.md says",
          "[qtype][super]") {
    const uint64_t k = 576;  // two whole super-blocks and one of two groups
    for (QType t : kSuperTypes) {
        const QRowLayout l = *qtype_row_layout(t, k);
        const uint64_t codes = qtype_traits(t).bits == 4 ? 288 : 240;
        REQUIRE(l.codes_bytes == codes);
        REQUIRE(l.row_bytes == codes + 16 + 16 + 4 + 3);
        std::vector<int32_t> zero_codes(k, 0);
        std::vector<uint8_t> row(l.row_bytes);
        for (uint64_t g = 0; g < l.groups; ++g)
            for (int which = 0; which < 2; ++which) {
                INFO(qtype_traits(t).name << " group " << g << (which ? " mn" : " sc"));
                std::vector<QGroupParams> groups(l.groups);
                for (uint64_t i = 0; i < l.groups; ++i) {  // each record its own d and dmin
                    groups[i].d_bits = static_cast<uint16_t>(0x3c00 + i / 8);
                    groups[i].dmin_bits = static_cast<uint16_t>(0x2c00 + i / 8);
                }
                const uint8_t v = 45;  // 101101: both ends set, so a shift by one shows
                (which ? groups[g].mn : groups[g].sc) = v;
                pack_row(t, zero_codes.data(), groups.data(), k, row.data());
                std::vector<uint8_t> want(l.row_bytes, 0);
                for (uint64_t s = 0; s < 3; ++s) {
                    const uint64_t at = codes + 16 * s;
                    const uint16_t d = static_cast<uint16_t>(0x3c00 + s),
                                   dmin = static_cast<uint16_t>(0x2c00 + s);
                    want[at] = static_cast<uint8_t>(d & 0xff);
                    want[at + 1] = static_cast<uint8_t>(d >> 8);
                    want[at + 2] = static_cast<uint8_t>(dmin & 0xff);
                    want[at + 3] = static_cast<uint8_t>(dmin >> 8);
                }
                // Group i's sc at bits 12 i .. 12 i + 5 of sm, mn at 12 i + 6 .. 12 i + 11.
                const uint64_t sm = codes + 16 * (g / 8) + 4;
                for (uint64_t bit = 0; bit < 6; ++bit)
                    if (v >> bit & 1) {
                        const uint64_t b = 12 * (g % 8) + 6 * which + bit;
                        want[sm + b / 8] = static_cast<uint8_t>(want[sm + b / 8] | 1u << (b % 8));
                    }
                REQUIRE(row == want);
                REQUIRE((which ? row_group_mn(t, row.data(), k, g)
                               : row_group_sc(t, row.data(), k, g)) == v);
                const float unit = f16_to_f32(which ? groups[g].dmin_bits : groups[g].d_bits);
                REQUIRE((which ? row_group_min(t, row.data(), k, g)
                               : row_group_scale(t, row.data(), k, g)) == unit * 45.0f);
            }
        // Groups of one super-block must share its d and dmin.
        std::vector<QGroupParams> mixed(l.groups);
        mixed[3].d_bits = 0x3c00;
        REQUIRE_THROWS(pack_row(t, zero_codes.data(), mixed.data(), k, row.data()));
    }
}

TEST_CASE("super-block importance search: lower weighted error than the reference grid",
          "[qtype][super][importance]") {
    const uint64_t rows = 24, k = 576;
    std::mt19937 rng(7);
    std::lognormal_distribution<double> spread(0.0, 1.5);
    std::vector<double> a(k), ones(k, 1.0);
    for (auto& v : a) v = spread(rng);
    const auto w = heavy_weights(rows * k, 8);
    for (QType t : kSuperTypes) {
        INFO(qtype_traits(t).name);
        const uint64_t rb = *qtype_row_bytes(t, k);
        std::vector<uint8_t> ref(rows * rb), imp(rows * rb), flat(rows * rb);
        for (uint64_t r = 0; r < rows; ++r) {
            REQUIRE(quantize_row_ref(t, w.data() + r * k, k, ref.data() + r * rb) ==
                    QuantStatus::ok);
            REQUIRE(quantize_row_super(t, w.data() + r * k, a.data(), k, imp.data() + r * rb) ==
                    QuantStatus::ok);
            REQUIRE(quantize_row_super(t, w.data() + r * k, nullptr, k, flat.data() + r * rb) ==
                    QuantStatus::ok);
            // RTN --calib's entry point takes this search for these types.
            std::vector<uint8_t> via(rb);
            REQUIRE(quantize_row_importance(t, w.data() + r * k, a.data(), k, via.data()) ==
                    QuantStatus::ok);
            REQUIRE(std::equal(via.begin(), via.end(), imp.begin() + r * rb));
        }
        const double e_ref = weighted_error(t, w, ref, k, a);
        const double e_imp = weighted_error(t, w, imp, k, a);
        const double e_flat = weighted_error(t, w, flat, k, ones);
        const double e_ref_flat = weighted_error(t, w, ref, k, ones);
        // Measured (fixed seeds): weighted 0.47 (q4k) and 0.54 (q3k) of the reference's
        // error, unweighted 0.76 and 0.80; the bounds are about 1.2x and 1.12x the worse, so a
        // search that keeps only the min-max grid fails.
        UNSCOPED_INFO("weighted ratio " << e_imp / e_ref << " unweighted " << e_flat / e_ref_flat);
        REQUIRE(e_imp <= 0.65 * e_ref);
        REQUIRE(e_flat <= 0.9 * e_ref_flat);
        REQUIRE(weighted_error(t, w, imp, k, a) < weighted_error(t, w, flat, k, a));
    }
}

TEST_CASE("GPTQ on super-block types: the stored rows have the error GPTQ's loss predicts",
          "[gptq][super]") {
    const uint64_t rows = 16, k = 288, n = 1024;  // one super-block and one of a single group
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> latent(n * 24), x(n * k);
    for (auto& v : latent) v = dist(rng);
    for (uint64_t i = 0; i < n; ++i)
        for (uint64_t j = 0; j < k; ++j) x[i * k + j] = latent[i * 24 + j % 24] + 0.3f * dist(rng);
    std::vector<double> h(k * k, 0.0);
    for (uint64_t i = 0; i < n; ++i)
        for (uint64_t p = 0; p < k; ++p)
            for (uint64_t q = 0; q <= p; ++q)
                h[p * k + q] += 2.0 / n * double(x[i * k + p]) * x[i * k + q];
    for (uint64_t p = 0; p < k; ++p)
        for (uint64_t q = p + 1; q < k; ++q) h[p * k + q] = h[q * k + p];
    const auto w = heavy_weights(rows * k, 4);
    for (QType t : kSuperTypes)
        for (bool importance : {false, true})
            for (bool act_order : {false, true}) {
                INFO(qtype_traits(t).name << (importance ? " importance" : "")
                                          << (act_order ? " act-order" : ""));
                GptqOptions o;
                o.qtype = t;
                o.importance = importance;
                o.act_order = act_order;
                const GptqResult res = gptq_quantize(w.data(), rows, k, h, o);
                // Rounded on any other grid than the stored one, the rows would not have it.
                REQUIRE(hessian_output_error(w.data(), t, res.packed.data(), rows, k, h) ==
                        Approx(res.output_error).epsilon(1e-9));
                // Measured 0.144 .. 0.194 of RTN's output error over these 8 cases (fixed seeds);
                // 0.3 is about 1.5x the worst, so losing the error feedback fails.
                UNSCOPED_INFO("ratio " << res.output_error / res.rtn_output_error);
                REQUIRE(res.output_error <= 0.3 * res.rtn_output_error);
            }
}

}  // namespace qtype_super_test
