// The reference quantizer and dequantizer of every quantized row type (formats/qtype.hpp has the
// layout and the error bounds). Plain scalar code: the truth the fast kernels are tested against.
#include "formats/qtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"

namespace qforge {

namespace {

// fp16 of |v| rounded up (toward +inf), so the stored scale never makes a group's range smaller;
// nullopt when it does not fit. Called only for groups with a non-zero range, so the result is at
// least the smallest fp16 subnormal even when v itself underflowed to 0 (float-subnormal weights).
std::optional<uint16_t> f16_round_up(float v) {
    uint16_t h = f32_to_f16(v);
    if (f16_to_f32(h) < v) ++h;  // positive binary16 values are ordered like their bits
    h = std::max<uint16_t>(h, 1);
    if ((h & 0x7c00) == 0x7c00) return std::nullopt;
    return h;
}

void put_f16(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }
uint16_t get_f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
}

// 3-bit code j: two bit planes (q3_code_position).
void put_q3_code(uint8_t* row, uint64_t j, int32_t code) {
    const Q3CodePosition at = q3_code_position(j);
    uint8_t& lo = row[at.low_byte];
    uint8_t& hi = row[at.high_byte];
    lo = static_cast<uint8_t>((lo & ~(3u << at.low_shift)) | ((code & 3) << at.low_shift));
    hi = static_cast<uint8_t>((hi & ~(1u << at.high_bit)) | ((code >> 2 & 1) << at.high_bit));
}

int32_t get_q3_code(const uint8_t* row, uint64_t j) {
    const Q3CodePosition at = q3_code_position(j);
    return (row[at.low_byte] >> at.low_shift & 3) | (row[at.high_byte] >> at.high_bit & 1) << 2;
}

// Code j of a row: 4-bit codes sit in 16-byte chunks of 32 (weight i low, i + 16 high nibble).
void put_code(const QTypeTraits& tr, uint8_t* row, uint64_t j, int32_t code) {
    if (tr.bits == 8) {
        row[j] = static_cast<uint8_t>(static_cast<int8_t>(code));
        return;
    }
    if (tr.bits == 3) return put_q3_code(row, j, code);
    const uint64_t chunk = j / kCodeChunk, i = j % kCodeChunk;
    uint8_t& b = row[chunk * 16 + i % 16];
    if (i < 16)
        b = static_cast<uint8_t>((b & 0xf0) | code);
    else
        b = static_cast<uint8_t>((b & 0x0f) | (code << 4));
}

int32_t get_code(const QTypeTraits& tr, const uint8_t* row, uint64_t j) {
    if (tr.bits == 8) return static_cast<int8_t>(row[j]);
    if (tr.bits == 3) return get_q3_code(row, j);
    const uint64_t chunk = j / kCodeChunk, i = j % kCodeChunk;
    const uint8_t b = row[chunk * 16 + i % 16];
    return i < 16 ? (b & 0x0f) : (b >> 4);
}

// Super-block records (QSuperRecord): value i of sm (group i / 2's sc for even i, its mn for
// odd i) is 6 bits at bit 6 i. A value never reaches past the record's stored bytes.
const uint8_t* super_record(const QRowLayout& l, const uint8_t* row, uint64_t g) {
    return row + l.scales_offset + sizeof(QSuperRecord) * (g / 8);
}

uint32_t get_sm(const uint8_t* sm, uint64_t i) {
    const uint64_t bit = 6 * i, byte = bit / 8, shift = bit % 8;
    uint32_t v = sm[byte] >> shift;
    if (shift > 2) v |= static_cast<uint32_t>(sm[byte + 1]) << (8 - shift);
    return v & 63u;
}

void put_sm(uint8_t* sm, uint64_t i, uint32_t v) {
    const uint64_t bit = 6 * i, byte = bit / 8, shift = bit % 8;
    sm[byte] = static_cast<uint8_t>(sm[byte] | (v << shift));
    if (shift > 2) sm[byte + 1] = static_cast<uint8_t>(sm[byte + 1] | (v >> (8 - shift)));
}

struct SuperGroup {
    float d, dmin;
    uint32_t sc, mn;
};

SuperGroup super_group(const QRowLayout& l, const uint8_t* row, uint64_t g) {
    const uint8_t* rec = super_record(l, row, g);
    const uint8_t* sm = rec + offsetof(QSuperRecord, sm);
    return {f16_to_f32(get_f16(rec + offsetof(QSuperRecord, d))),
            f16_to_f32(get_f16(rec + offsetof(QSuperRecord, dmin))), get_sm(sm, 2 * (g % 8)),
            get_sm(sm, 2 * (g % 8) + 1)};
}

// The smallest n in 0 .. 63 with unit * n >= v (63 when none is): a 6-bit multiple that covers
// v, checked in float so the stored product really does.
uint8_t cover_6bit(float v, float unit) {
    if (!(v > 0.0f) || !(unit > 0.0f)) return 0;
    float n = std::min(std::ceil(v / unit), static_cast<float>(kSuperCodeMax));
    while (n < static_cast<float>(kSuperCodeMax) && unit * n < v) n += 1.0f;
    return static_cast<uint8_t>(std::max(n, 1.0f));
}

uint8_t nearest_6bit(float v, float unit) {
    if (!(v > 0.0f) || !(unit > 0.0f)) return 0;
    return static_cast<uint8_t>(
        std::clamp(std::nearbyint(v / unit), 0.0f, static_cast<float>(kSuperCodeMax)));
}

// A group's step for a span: span / (2^bits - 1), and never 0 for a non-zero span (float-subnormal
// weights), so the stored scale is at least the smallest fp16 one as for the other types.
float group_step(QType t, float span) {
    const float s = span / static_cast<float>(qtype_max_code(t));
    return span > 0.0f && s == 0.0f ? std::numeric_limits<float>::denorm_min() : s;
}

QGroupParams super_group_params(const QSuperParams& sp, uint8_t sc, uint8_t mn) {
    QGroupParams p;
    p.sc = sc;
    p.mn = mn;
    p.d_bits = sp.d_bits;
    p.dmin_bits = sp.dmin_bits;
    p.scale = sp.d * static_cast<float>(sc);   // exact: 11 by 6 bits
    p.min = sp.dmin * static_cast<float>(mn);  // exact
    return p;
}

// Groups [g0, g0 + count) of a super-block type's row from w (the row's weights).
QuantStatus super_block_grids(QType t, const float* w, uint64_t k, QGroupParams* groups) {
    const uint64_t sb = qtype_traits(t).super_block, group = qtype_traits(t).group;
    for (uint64_t b = 0; b < k; b += sb) {
        const uint64_t e = std::min(k, b + sb);
        const auto sp = qtype_super_params(t, w + b, e - b);
        if (!sp) return QuantStatus::scale_overflow;
        for (uint64_t g = b; g < e; g += group)
            groups[g / group] = qtype_group_params_in(t, *sp, w + g, std::min(e, g + group) - g);
    }
    return QuantStatus::ok;
}

// The index of the level nearest x, the lower on ties: the count of midpoints between
// consecutive levels that x exceeds (levels ascending, 16 of them; the midpoints are exact in
// float). The quantizer's scale searches call this for every weight of every candidate grid, so
// it is a table lookup: for x in [i, i + 1) every midpoint below i counts (below[i]), and at most
// one midpoint lies in [i, i + 1) (levels are at least 2 apart), compared directly.
struct LevelMidpoints {
    static constexpr int32_t kLo = -128, kHi = 128;  // |level| <= 127: every midpoint inside
    uint8_t below[kHi - kLo];                        // midpoints < i, for i = kLo .. kHi - 1
    float inside[kHi - kLo];                         // the midpoint in [i, i + 1), or +inf
};

LevelMidpoints level_midpoints(const int8_t* levels) {
    LevelMidpoints t;
    for (int32_t i = LevelMidpoints::kLo; i < LevelMidpoints::kHi; ++i) {
        uint8_t below = 0;
        float inside = std::numeric_limits<float>::infinity();
        for (int32_t c = 0; c + 1 < 16; ++c) {
            const float mid = 0.5f * static_cast<float>(levels[c] + levels[c + 1]);
            if (mid < static_cast<float>(i)) ++below;
            if (mid >= static_cast<float>(i) && mid < static_cast<float>(i + 1)) inside = mid;
        }
        t.below[i - LevelMidpoints::kLo] = below;
        t.inside[i - LevelMidpoints::kLo] = inside;
    }
    return t;
}

int32_t nearest_level(const int8_t* levels, float x) {
    if (levels != kNonLinearLevels) {  // a row's learned levels: count the midpoints below x
        int32_t c = 0;
        for (int32_t i = 0; i + 1 < 16; ++i)
            c += x > 0.5f * static_cast<float>(levels[i] + levels[i + 1]) ? 1 : 0;
        return c;
    }
    static const LevelMidpoints table = level_midpoints(kNonLinearLevels);
    if (!(x >= static_cast<float>(LevelMidpoints::kLo))) return 0;  // NaN too (never given)
    if (x >= static_cast<float>(LevelMidpoints::kHi)) return 15;
    const auto i = static_cast<int32_t>(std::floor(x)) - LevelMidpoints::kLo;
    return table.below[i] + (x > table.inside[i] ? 1 : 0);
}

// The levels a grid of type t indexes: the row's (learned-table types) or the type's.
const int8_t* grid_levels(const QTypeTraits& tr, const QGroupParams& p) {
    return tr.row_levels ? p.levels : tr.levels;
}

// Learned levels from refitted values u (table units, any order): sorted, mirrored so the end
// of largest magnitude is the negative one (a group's scale may have either sign), scaled so
// the lowest is exactly -127, rounded, and made distinct and ascending inside [-127, 127] with
// the top at least 0 (qtype.hpp's bound). False when u has no spread to scale.
bool normalize_levels(double* u, int8_t* out) {
    std::sort(u, u + 16);
    if (std::fabs(u[15]) > std::fabs(u[0])) {
        for (int c = 0; c < 8; ++c) std::swap(u[c], u[15 - c]);
        for (int c = 0; c < 16; ++c) u[c] = -u[c];
    }
    if (!(u[0] < 0.0)) return false;
    const double f = -127.0 / u[0];
    int32_t v[16];
    for (int c = 0; c < 16; ++c)
        v[c] = static_cast<int32_t>(std::clamp(std::nearbyint(u[c] * f), -127.0, 127.0));
    v[0] = -127;
    for (int c = 1; c < 16; ++c) v[c] = std::max(v[c], v[c - 1] + 1);
    for (int c = 15; c >= 1; --c) v[c] = std::min(v[c], 127 - (15 - c));
    v[15] = std::max(v[15], 0);
    for (int c = 0; c < 16; ++c) out[c] = static_cast<int8_t>(v[c]);
    return true;
}

constexpr int kLevelFitIterations = 8;

}  // namespace

std::optional<QSuperParams> qtype_super_from_groups(const float* scale, const float* min,
                                                    uint64_t groups) {
    float smax = 0.0f, mmax = 0.0f;
    for (uint64_t g = 0; g < groups; ++g) {
        smax = std::max(smax, scale[g]);
        mmax = std::max(mmax, min[g]);
    }
    QSuperParams sp;
    const float top = static_cast<float>(kSuperCodeMax);
    if (smax > 0.0f) {
        auto h = f16_round_up(smax / top);
        if (!h) return std::nullopt;
        sp.d_bits = *h;
    }
    if (mmax > 0.0f) {
        auto h = f16_round_up(mmax / top);
        if (!h) return std::nullopt;
        sp.dmin_bits = *h;
    }
    sp.d = f16_to_f32(sp.d_bits);
    sp.dmin = f16_to_f32(sp.dmin_bits);
    return sp;
}

std::optional<QSuperParams> qtype_super_params(QType t, const float* w, uint64_t n) {
    const uint64_t group = qtype_traits(t).group, groups = (n + group - 1) / group;
    std::vector<float> lo(groups, 0.0f), hi(groups, 0.0f), scale(groups), min(groups);
    for (uint64_t j = 0; j < n; ++j) {
        lo[j / group] = std::min(lo[j / group], w[j]);
        hi[j / group] = std::max(hi[j / group], w[j]);
    }
    for (uint64_t g = 0; g < groups; ++g) min[g] = -lo[g];
    // dmin first: the scales must cover hi + the rounded-up min.
    const std::vector<float> zero(groups, 0.0f);
    auto mins = qtype_super_from_groups(zero.data(), min.data(), groups);
    if (!mins) return std::nullopt;
    for (uint64_t g = 0; g < groups; ++g) {
        const float m = mins->dmin * static_cast<float>(cover_6bit(min[g], mins->dmin));
        scale[g] = group_step(t, hi[g] + m);
    }
    auto sp = qtype_super_from_groups(scale.data(), zero.data(), groups);
    if (!sp) return std::nullopt;
    sp->dmin_bits = mins->dmin_bits;
    sp->dmin = mins->dmin;
    return sp;
}

QGroupParams qtype_group_params_in(QType t, const QSuperParams& sp, const float* w, uint64_t n) {
    float lo = 0.0f, hi = 0.0f;
    for (uint64_t j = 0; j < n; ++j) {
        lo = std::min(lo, w[j]);
        hi = std::max(hi, w[j]);
    }
    const uint8_t mn = cover_6bit(-lo, sp.dmin);
    const float m = sp.dmin * static_cast<float>(mn);
    const uint8_t sc = cover_6bit(group_step(t, hi + m), sp.d);
    return super_group_params(sp, sc, mn);
}

QGroupParams qtype_group_nearest(const QSuperParams& sp, float scale, float min) {
    return super_group_params(sp, nearest_6bit(scale, sp.d), nearest_6bit(min, sp.dmin));
}

uint64_t store_float_row(QType t, const float* x, uint64_t n, uint8_t* out) {
    const DType d = qtype_traits(t).dtype;
    for (uint64_t j = 0; j < n; ++j) {
        if (!std::isfinite(x[j])) return j;
        if (d == DType::f32) {
            std::memcpy(out + 4 * j, &x[j], 4);
            continue;
        }
        const uint16_t h = d == DType::f16 ? f32_to_f16(x[j]) : f32_to_bf16(x[j]);
        const uint16_t inf = d == DType::f16 ? 0x7c00 : 0x7f80;
        if ((h & 0x7fff) == inf) return j;  // a finite value rounded to infinity
        put_f16(out + 2 * j, h);
    }
    return n;
}

QuantStatus quantize_row_ref(QType t, const float* w, uint64_t k, uint8_t* row) {
    const QTypeTraits& tr = qtype_traits(t);
    for (uint64_t j = 0; j < k; ++j)
        if (!std::isfinite(w[j])) return QuantStatus::non_finite;
    if (tr.is_float)  // every weight is finite here, so a misfit is an overflow
        return store_float_row(t, w, k, row) == k ? QuantStatus::ok : QuantStatus::scale_overflow;
    const QRowLayout l = *qtype_row_layout(t, k);
    std::vector<int32_t> codes(k);
    std::vector<QGroupParams> groups(l.groups);
    if (tr.super_block) {
        if (super_block_grids(t, w, k, groups.data()) != QuantStatus::ok)
            return QuantStatus::scale_overflow;
        for (uint64_t j = 0; j < k; ++j)
            codes[j] = qtype_quantize_value(t, groups[j / l.group], w[j]);
        pack_row(t, codes.data(), groups.data(), k, row);
        return QuantStatus::ok;
    }
    int8_t levels[16];
    if (tr.row_levels) fit_row_levels(w, nullptr, k, l.group, levels);
    for (uint64_t g = 0; g < l.groups; ++g) {
        const uint64_t b = g * l.group, e = std::min(k, b + l.group);  // real elements only
        auto p = qtype_group_params(t, w + b, e - b, levels);
        if (!p) return QuantStatus::scale_overflow;
        groups[g] = *p;
        for (uint64_t j = b; j < e; ++j) codes[j] = qtype_quantize_value(t, *p, w[j]);
    }
    pack_row(t, codes.data(), groups.data(), k, row);
    return QuantStatus::ok;
}

std::optional<QGroupParams> qtype_group_params(QType t, const float* w, uint64_t n,
                                               const int8_t* levels) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.row_levels && !levels)
        throw Error(std::string("qtype_group_params: a ") + std::string(tr.name) +
                    " grid needs its row's levels");
    if (tr.super_block) {  // the group as a super-block of its own (qtype.hpp)
        const auto sp = qtype_super_params(t, w, n);
        if (!sp) return std::nullopt;
        return qtype_group_params_in(t, *sp, w, n);
    }
    QGroupParams p;
    p.zero = tr.implicit_zero;
    if (tr.row_levels) p.levels = levels;
    if (tr.symmetric) {
        // The element of largest magnitude (the first one on ties).
        float m = 0.0f;
        for (uint64_t j = 0; j < n; ++j)
            if (std::fabs(w[j]) > std::fabs(m)) m = w[j];
        if (m != 0.0f) {
            // q8: amax / 127, positive. q4s: m / -8, so m lands exactly on code 0 (= -8);
            // q4nl, q4t: m / levels[0] (-127), so m lands exactly on the lowest level.
            const int8_t* lv = grid_levels(tr, p);
            const float steps = tr.bits == 8 ? 127.0f : lv ? -static_cast<float>(lv[0]) : 8.0f;
            const float s = std::fabs(m) / steps;
            auto h = f16_round_up(s);
            if (!h) return std::nullopt;
            const bool negate = tr.bits == 4 && m > 0.0f;
            p.scale_bits = static_cast<uint16_t>(*h | (negate ? 0x8000 : 0));
        }
    } else {
        float lo = 0.0f, hi = 0.0f;  // the range always includes 0
        for (uint64_t j = 0; j < n; ++j) {
            lo = std::min(lo, w[j]);
            hi = std::max(hi, w[j]);
        }
        if (hi > lo) {
            auto h = f16_round_up((hi - lo) / static_cast<float>(qtype_max_code(t)));
            if (!h) return std::nullopt;
            p.scale_bits = *h;
            p.zero = static_cast<int32_t>(std::clamp(std::nearbyint(-lo / f16_to_f32(p.scale_bits)),
                                                     0.0f, static_cast<float>(qtype_max_code(t))));
        }
    }
    p.scale = f16_to_f32(p.scale_bits);
    return p;
}

int32_t qtype_quantize_value(QType t, const QGroupParams& p, float w) {
    if (const int8_t* levels = grid_levels(qtype_traits(t), p)) {
        if (p.scale == 0.0f) return nearest_level(levels, 0.0f);
        return nearest_level(levels, w / p.scale);
    }
    if (qtype_has_super_blocks(t)) {  // w = scale * code - min
        if (p.scale == 0.0f) return 0;
        const float r = std::nearbyint((w + p.min) / p.scale);
        return static_cast<int32_t>(std::clamp(r, 0.0f, static_cast<float>(qtype_max_code(t))));
    }
    if (p.scale == 0.0f) return p.zero;
    const float r = std::nearbyint(w / p.scale) + static_cast<float>(p.zero);
    return static_cast<int32_t>(std::clamp(r, static_cast<float>(qtype_min_code(t)),
                                           static_cast<float>(qtype_max_code(t))));
}

void pack_row(QType t, const int32_t* codes, const QGroupParams* groups, uint64_t k, uint8_t* row) {
    const QTypeTraits& tr = qtype_traits(t);
    const QRowLayout l = *qtype_row_layout(t, k);
    std::memset(row, 0, l.row_bytes);
    for (uint64_t j = 0; j < k; ++j) put_code(tr, row, j, codes[j]);
    if (tr.super_block) {  // records; codes past k stay 0 (they meet zero activations)
        for (uint64_t g = 0; g < l.groups; ++g) {
            uint8_t* rec = row + (super_record(l, row, g) - row);
            const QGroupParams& first = groups[g / 8 * 8];
            if (groups[g].d_bits != first.d_bits || groups[g].dmin_bits != first.dmin_bits)
                throw Error("pack_row: group " + std::to_string(g) + " of a " +
                            std::string(tr.name) + " row has another super-block's d or dmin");
            put_f16(rec + offsetof(QSuperRecord, d), first.d_bits);
            put_f16(rec + offsetof(QSuperRecord, dmin), first.dmin_bits);
            put_sm(rec + offsetof(QSuperRecord, sm), 2 * (g % 8), groups[g].sc);
            put_sm(rec + offsetof(QSuperRecord, sm), 2 * (g % 8) + 1, groups[g].mn);
        }
        return;
    }
    for (uint64_t g = 0; g < l.groups; ++g) {
        put_f16(row + l.scales_offset + 2 * g, groups[g].scale_bits);
        if (!tr.symmetric) row[l.zeros_offset + g] = static_cast<uint8_t>(groups[g].zero);
        if (tr.row_levels && groups[g].levels != groups[0].levels &&
            (!groups[g].levels || std::memcmp(groups[g].levels, groups[0].levels, 16) != 0))
            throw Error("pack_row: group " + std::to_string(g) + " of a " + std::string(tr.name) +
                        " row indexes other levels than its first");
    }
    if (tr.row_levels) {
        if (!groups[0].levels)
            throw Error("pack_row: a " + std::string(tr.name) + " row without its levels");
        std::memcpy(row + l.levels_offset, groups[0].levels, kRowLevelsBytes);
    }
    // Codes past k: the last group's zero, so they dequantize to exactly 0.
    const int32_t zero = tr.symmetric ? tr.implicit_zero : groups[l.groups - 1].zero;
    for (uint64_t j = k; j < round_up(k, qtype_code_chunk(t)); ++j) put_code(tr, row, j, zero);
}

void dequantize_row_ref(QType t, const uint8_t* row, uint64_t k, float* out) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.is_float) {
        for (uint64_t j = 0; j < k; ++j) {
            if (tr.dtype == DType::f32)
                std::memcpy(&out[j], row + 4 * j, 4);
            else if (tr.dtype == DType::f16)
                out[j] = f16_to_f32(get_f16(row + 2 * j));
            else
                out[j] = bf16_to_f32(get_f16(row + 2 * j));
        }
        return;
    }
    const QRowLayout l = *qtype_row_layout(t, k);
    if (tr.super_block) {
        for (uint64_t j = 0; j < k; ++j) {
            const SuperGroup sg = super_group(l, row, j / l.group);
            const float scale = sg.d * static_cast<float>(sg.sc),
                        min = sg.dmin * static_cast<float>(sg.mn);
            out[j] = scale * static_cast<float>(get_code(tr, row, j)) - min;
        }
        return;
    }
    const int8_t* levels = row_levels(t, row, k);
    for (uint64_t j = 0; j < k; ++j) {
        const uint64_t g = j / l.group;
        const float s = f16_to_f32(get_f16(row + l.scales_offset + 2 * g));
        const int32_t z = tr.symmetric ? tr.implicit_zero : row[l.zeros_offset + g];
        out[j] = s * static_cast<float>(qtype_code_level(t, get_code(tr, row, j), levels) - z);
    }
}

float row_group_scale(QType t, const uint8_t* row, uint64_t k, uint64_t g) {
    const QRowLayout l = *qtype_row_layout(t, k);
    if (qtype_has_super_blocks(t)) {
        const SuperGroup sg = super_group(l, row, g);
        return sg.d * static_cast<float>(sg.sc);
    }
    return f16_to_f32(get_f16(row + l.scales_offset + 2 * g));
}

float row_group_min(QType t, const uint8_t* row, uint64_t k, uint64_t g) {
    if (!qtype_has_super_blocks(t)) return 0.0f;
    const SuperGroup sg = super_group(*qtype_row_layout(t, k), row, g);
    return sg.dmin * static_cast<float>(sg.mn);
}

QSuperParams row_super_params(QType t, const uint8_t* row, uint64_t k, uint64_t s) {
    const QRowLayout l = *qtype_row_layout(t, k);
    const uint8_t* rec = super_record(l, row, 8 * s);
    QSuperParams sp;
    sp.d_bits = get_f16(rec + offsetof(QSuperRecord, d));
    sp.dmin_bits = get_f16(rec + offsetof(QSuperRecord, dmin));
    sp.d = f16_to_f32(sp.d_bits);
    sp.dmin = f16_to_f32(sp.dmin_bits);
    return sp;
}

uint8_t row_group_sc(QType t, const uint8_t* row, uint64_t k, uint64_t g) {
    return static_cast<uint8_t>(super_group(*qtype_row_layout(t, k), row, g).sc);
}

uint8_t row_group_mn(QType t, const uint8_t* row, uint64_t k, uint64_t g) {
    return static_cast<uint8_t>(super_group(*qtype_row_layout(t, k), row, g).mn);
}

const int8_t* row_levels(QType t, const uint8_t* row, uint64_t k) {
    const QTypeTraits& tr = qtype_traits(t);
    if (!tr.row_levels) return tr.levels;
    return reinterpret_cast<const int8_t*>(row + qtype_row_layout(t, k)->levels_offset);
}

double qtype_row_error_bound(QType t, const uint8_t* row, uint64_t k) {
    const QTypeTraits& tr = qtype_traits(t);
    if (!tr.row_levels) return tr.error_bound;
    const int8_t* lv = row_levels(t, row, k);
    double b = std::max(127.0 - lv[15], lv[0] + 127.0);
    for (int c = 0; c + 1 < 16; ++c) b = std::max(b, (lv[c + 1] - lv[c]) / 2.0);
    return b + 1.0 / 1024;
}

void fit_row_levels(const float* w, const double* a, uint64_t k, uint64_t group, int8_t* levels) {
    // All-zero importance says nothing: fit as without importance (as the grids keep min-max).
    if (a && std::all_of(a, a + k, [](double v) { return v == 0.0; })) a = nullptr;
    int8_t cur[16];
    std::memcpy(cur, kNonLinearLevels, 16);
    std::memcpy(levels, cur, 16);
    // Every iterate keeps levels[0] = -127, so each group's scale (m / -127) is the same in every
    // iteration: found once. The grids point at cur, which each iteration overwrites in place.
    std::vector<QGroupParams> grids;
    for (uint64_t b = 0; b < k; b += group) {
        const auto p = qtype_group_params(QType::q4t_g32, w + b, std::min(k, b + group) - b, cur);
        if (!p) return;  // an overflowing scale: the quantizer reports it
        grids.push_back(*p);
    }
    double best = std::numeric_limits<double>::infinity();
    for (int it = 0; it <= kLevelFitIterations; ++it) {
        double num[16] = {}, den[16] = {}, err = 0.0;
        for (uint64_t j = 0; j < k; ++j) {
            const QGroupParams& p = grids[j / group];
            const int32_t c = qtype_quantize_value(QType::q4t_g32, p, w[j]);
            const double aj = a ? a[j] : 1.0, s = p.scale;
            const double d = static_cast<double>(w[j]) - s * cur[c];
            err += aj * d * d;
            num[c] += aj * s * w[j];
            den[c] += aj * s * s;
        }
        if (err < best) {
            best = err;
            std::memcpy(levels, cur, 16);
        }
        if (it == kLevelFitIterations) break;
        double u[16];
        for (int c = 0; c < 16; ++c) u[c] = den[c] > 0.0 ? num[c] / den[c] : cur[c];
        int8_t next[16];
        if (!normalize_levels(u, next) || std::memcmp(next, cur, 16) == 0) break;
        std::memcpy(cur, next, 16);
    }
}

int32_t row_code(QType t, const uint8_t* row, uint64_t j) {
    return get_code(qtype_traits(t), row, j);
}

int32_t row_group_zero(QType t, const uint8_t* row, uint64_t k, uint64_t g) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.symmetric || tr.super_block) return tr.implicit_zero;  // super-blocks: a min instead
    return row[qtype_row_layout(t, k)->zeros_offset + g];
}

}  // namespace qforge
