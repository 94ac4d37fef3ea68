// kernels/cpu/group_codes: at every level this CPU has, each code equals qtype_quantize_value's
// (formats/qtype.cpp, the scalar definition the stored files follow), for every quantized type,
// on groups of random weights with their reference grid, on weights placed exactly halfway
// between two codes (round to nearest even), on weights far outside the grid (the clamp), on
// signed zeros, on an all-zero group (scale 0) and on run lengths that end inside a vector.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "formats/qtype.hpp"
#include "kernels/cpu/group_codes.hpp"
#include "kernels/cpu/isa.hpp"

namespace kernels_group_codes_test {

using namespace qforge;

namespace {

// The reference grid of w for type t (super-block types: the group as its own super-block).
std::optional<QGroupParams> reference_grid(QType t, const std::vector<float>& w) {
    if (qtype_has_super_blocks(t)) {
        const auto sp = qtype_super_params(t, w.data(), w.size());
        if (!sp) return std::nullopt;
        return qtype_group_params_in(t, *sp, w.data(), w.size());
    }
    return qtype_group_params(t, w.data(), w.size());
}

void require_same_codes(QType t, const QGroupParams& p, const std::vector<float>& w) {
    std::vector<int32_t> want(w.size());
    for (size_t j = 0; j < w.size(); ++j) want[j] = qtype_quantize_value(t, p, w[j]);
    for (Isa isa : cpu_isa_levels()) {
        std::vector<int32_t> got(w.size(), -999);
        group_codes_isa(isa, t, p, w.data(), w.size(), got.data());
        INFO(qtype_traits(t).name << " level " << isa_name(isa) << " n " << w.size());
        REQUIRE(got == want);
    }
}

}  // namespace

TEST_CASE("group_codes: every level gives qtype_quantize_value's codes", "[kernels][group_codes]") {
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (const auto& row : kQTypes) {
        const QType t = row.type;
        if (!qtype_is_quantized(t) || qtype_has_row_levels(t)) continue;  // row tables: scalar
        for (uint64_t n : {1u, 7u, 16u, 17u, 31u, 32u, 128u, 200u}) {
            std::vector<float> w(n);
            for (float& v : w) v = dist(rng) * 0.05f;
            const auto p = reference_grid(t, w);
            REQUIRE(p);
            require_same_codes(t, *p, w);
            if (p->scale == 0.0f || qtype_has_levels(t)) continue;
            // Halfway between codes (ties to even), outside the grid, and signed zeros, on the
            // same grid.
            std::vector<float> edge(n);
            for (uint64_t j = 0; j < n; ++j) {
                const float c = static_cast<float>(static_cast<int>(j % 40) - 20);
                switch (j % 4) {
                    case 0:
                        edge[j] = (c + 0.5f) * p->scale - p->min;
                        break;
                    case 1:
                        edge[j] = c * 1e3f * p->scale;
                        break;
                    case 2:
                        edge[j] = j % 8 == 2 ? -0.0f : 0.0f;
                        break;
                    default:
                        edge[j] = (c - 0.5f) * p->scale;
                        break;
                }
            }
            require_same_codes(t, *p, edge);
        }
        const std::vector<float> zeros(33, 0.0f);
        const auto pz = reference_grid(t, zeros);
        if (pz) require_same_codes(t, *pz, zeros);
    }
}

// group_error against a float64 reference written here: the terms from qtype_quantize_value and
// qtype_dequantize_value, summed in the documented order (term j into partial sum j mod 8, then
// ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))): the same bits at every level, with and
// without importance, for run lengths that end inside a vector.
TEST_CASE("group_error: every level gives the reference's bits", "[kernels][group_codes]") {
    std::mt19937 rng(9);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::uniform_real_distribution<double> decade(-2.0, 2.0);
    for (const auto& row : kQTypes) {
        const QType t = row.type;
        if (!qtype_is_quantized(t) || qtype_has_row_levels(t)) continue;
        for (uint64_t n : {1u, 7u, 8u, 15u, 16u, 17u, 31u, 128u, 200u}) {
            std::vector<float> w(n);
            std::vector<double> a(n);
            for (uint64_t j = 0; j < n; ++j) {
                w[j] = dist(rng) * 0.05f;
                a[j] = std::pow(10.0, decade(rng));
            }
            const auto p = reference_grid(t, w);
            REQUIRE(p);
            for (const double* imp :
                 {static_cast<const double*>(nullptr), static_cast<const double*>(a.data())}) {
                double s[8] = {};
                for (uint64_t j = 0; j < n; ++j) {
                    const double d =
                        static_cast<double>(w[j]) - static_cast<double>(qtype_dequantize_value(
                                                        t, *p, qtype_quantize_value(t, *p, w[j])));
                    s[j % 8] += (imp ? imp[j] : 1.0) * d * d;
                }
                const double want =
                    ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
                for (Isa isa : cpu_isa_levels()) {
                    INFO(row.name << " level " << isa_name(isa) << " n " << n << " importance "
                                  << (imp != nullptr));
                    const double got = group_error_isa(isa, t, *p, w.data(), imp, n);
                    REQUIRE(std::memcmp(&got, &want, sizeof got) == 0);
                }
            }
        }
    }
}

// code_moments against the five sums written here in the documented order (term j into partial
// sum j mod 8, then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))): the same bits at every
// level, with and without importance, with an offset, for lengths that end inside a vector.
TEST_CASE("code_moments: every level gives the reference's bits", "[kernels][group_codes]") {
    std::mt19937 rng(13);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::uniform_real_distribution<double> decade(-2.0, 2.0);
    for (uint64_t n : {1u, 3u, 8u, 12u, 16u, 31u, 128u}) {
        std::vector<int32_t> codes(n);
        std::vector<float> w(n);
        std::vector<double> a(n);
        for (uint64_t j = 0; j < n; ++j) {
            codes[j] = static_cast<int32_t>(rng() % 16);
            w[j] = dist(rng) * 0.05f;
            a[j] = std::pow(10.0, decade(rng));
        }
        for (int32_t offset : {0, 8})
            for (const double* imp :
                 {static_cast<const double*>(nullptr), static_cast<const double*>(a.data())}) {
                double s[5][8] = {};
                for (uint64_t j = 0; j < n; ++j) {
                    const double c = codes[j] - offset, x = w[j], aj = imp ? imp[j] : 1.0;
                    const double terms[5] = {aj, aj * c, aj * c * c, aj * x, aj * x * c};
                    for (int i = 0; i < 5; ++i) s[i][j % 8] += terms[i];
                }
                double want[5];
                for (int i = 0; i < 5; ++i)
                    want[i] = ((s[i][0] + s[i][1]) + (s[i][2] + s[i][3])) +
                              ((s[i][4] + s[i][5]) + (s[i][6] + s[i][7]));
                for (Isa isa : cpu_isa_levels()) {
                    INFO("level " << isa_name(isa) << " n " << n << " offset " << offset);
                    const CodeMoments m =
                        code_moments_isa(isa, codes.data(), offset, w.data(), imp, n);
                    const double got[5] = {m.s, m.sc, m.scc, m.sw, m.swc};
                    REQUIRE(std::memcmp(got, want, sizeof got) == 0);
                }
            }
    }
}

}  // namespace kernels_group_codes_test
