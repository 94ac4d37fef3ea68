// The table of tensor types a .qf file can hold: float rows and quantized (packed) rows. Every
// code path that names, sizes, quantizes, dequantizes or bounds a stored tensor consults this one
// table; a static check makes sure every enum value has its row.
//
// A quantized tensor is a matrix [rows = out, cols = k = in], stored row by row. Each row is
// self-contained (docs/FORMAT.md, "Quantized rows"):
//
//   codes    k rounded up to whole code chunks (qtype_code_chunk). 8-bit: one int8 per weight.
//            4-bit: 16 bytes per 32 weights; byte i of a chunk holds weight i in its low nibble and
//            weight i + 16 in its high nibble, so one AND and one shift give 32 weights in order
//            (AVX2: two 16-lane halves; CUDA: a 16-byte load is one chunk). 3-bit: 48 bytes per
//            128 weights (4 blocks of 32), a 32-byte plane of the codes' low two bits and a
//            16-byte plane of their high bits, both ordered so that AVX2 shifts and masks give
//            the 4-bit kernel's pair order directly (q3_code_position below; docs/FORMAT.md
//            has the bytes). Codes past k hold the zero code, so they dequantize to exactly 0
//            (level types have no zero level: their codes past k are 0 and the kernels meet
//            them only with zero activations, as the super-block types' codes).
//   scales   one fp16 per group, in group order (little-endian binary16).
//   zeros    asymmetric types only: one uint8 per group, the integer zero point.
//   No padding: the row stride is exactly codes + scales + zeros, so a tensor's bytes are its
//   weights times their bits (format version 2; the tensor as a whole starts on a 64-byte
//   boundary and is padded to the next tensor). The CPU kernels load rows unaligned; the CUDA
//   backend copies rows to a 64-byte GPU stride when it uploads them. Format version 1 padded
//   every row to a multiple of 64 bytes (kQfV1RowAlign); readers repack such rows on load.
//
// Scales live in the row, after its codes, so a thread that owns a range of rows streams one
// contiguous region and a row can be sliced without touching other rows. Weight j of a row is
// w = scale[g] * (code[j] - zero[g]) with g = j / group; for symmetric types zero is the
// type's implicit zero; for level types (q4nl_*) w = scale[g] * levels[code[j]], levels int8.
// This product is exact in float32 (11-bit scale times an 8-bit integer), so every kernel sees
// bit-identical dequantized weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "core/checked_math.hpp"
#include "formats/dtype.hpp"

namespace qforge {

enum class QType : uint8_t {
    f32,
    f16,
    bf16,
    q8,
    q8_g32,
    q8_g128,
    q4_g32,
    q4_g64,
    q4_g128,
    q4s_g32,
    q4s_g64,
    q4s_g128,
    q3_g32,
    q3_g128,
    q4k_g32,
    q3k_g32,
    q4nl_g32,
    q4t_g32,
};

struct QTypeTraits {
    QType type;
    std::string_view name;  // the name used verbatim by the CLI and the .qf header
    uint32_t bits;          // float rows: bits per element; quantized rows: bits per code
    bool is_float;          // plain float storage: no codes, no scales
    DType dtype;            // float rows: the element type; quantized rows: unused (f32)
    uint32_t group;         // quantized: weights per scale; 0 = one scale per row
    bool symmetric;         // quantized: no stored zero points
    bool signed_codes;      // codes are int8 (q8 types); otherwise unsigned
    int32_t implicit_zero;  // symmetric types: the code that means 0
    // The reference quantizer's worst-case error per weight, in units of the group's scale:
    // rounding gives 1/2; a clamped extreme code or the fp16 rounding of the scale add to it
    // (docs/FORMAT.md derives each value). Tests allow this plus float rounding and no more.
    double error_bound;
    // Weights per super-block (256) for types whose group scales and mins are 6-bit integers
    // against one fp16 super-scale d and super-min dmin per super-block (llama.cpp's K-quants):
    // w = d * sc[g] * code - dmin * mn[g]. 0: each group's scale is stored as fp16 (and its zero
    // as an integer code).
    uint32_t super_block = 0;
    // Non-uniform types: the 16 integer levels the 4-bit codes index, so weight j is
    // scale * levels[code[j]] (no zero). Null: the uniform grid scale * (code - zero).
    const int8_t* levels = nullptr;
    // levels != nullptr or row_levels, as a value compile-time checks can read: under the
    // sanitizer builds (-fsanitize implies -fno-delete-null-pointer-checks) the address of a
    // constexpr array is not a constant known to be non-null. qtype_test checks they agree.
    bool nonuniform = false;
    // Learned-table types (q4t_*): each row stores its own 16 int8 levels (kRowLevelsBytes after
    // its scales), fitted to that row's weights (fit_row_levels); levels is then null.
    bool row_levels = false;
};

inline constexpr uint64_t kRowLevelsBytes = 16;  // a learned-table row's 16 int8 levels

// IQ4_NL's fixed non-linear grid (llama.cpp's kvalues_iq4nl): 16 int8 levels, denser near zero
// where most weights of a group lie, as NF4's normal-quantile levels are. Its gaps grow from 11
// (around zero) to 24 (89 .. 113); the negative end reaches -127, the positive only 113.
inline constexpr int8_t kNonLinearLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                1,    13,   25,  38,  53,  69,  89,  113};

// Scales are rounded up (away from zero) to fp16, so no group's range exceeds its codes' range:
// q8*:   amax / 127 maps the group into [-127, 127]; rounding only: 1/2.
// q4_*:  asymmetric, range [min(0, lo), max(0, hi)] in 15 steps with an integer zero, as GPTQ and
//        AWQ store it; the zero's rounding can push the top element to exactly 15.5, where it
//        clamps to 15: still 1/2.
// q3_*:  asymmetric as q4_*, in 7 steps: the same argument, 1/2.
// q4s_*: symmetric, scale = m / -8 for the element m of largest magnitude (llama.cpp's Q4_0): 16
//        levels; an element of the opposite sign and equal magnitude lands on +8 and clamps to
//        +7: one whole step.
// q4k_*, q3k_*: the reference rounds each group's 6-bit min up (m' >= -lo) and then its 6-bit
//        scale up against (hi + m') / (2^bits - 1), so the grid [-m', (2^bits - 1) s' - m']
//        covers the group and rounding gives 1/2 of the group's own step s' = d * sc.
// q4nl_*: scale = m / -127 for the element m of largest magnitude (llama.cpp's IQ4_NL), so m
//        lands on level -127 and every w / scale lies in [-127, 127]; inside [-127, 113] the
//        nearest level is at most half the widest gap (24) away: 12; an element of the opposite
//        sign and equal magnitude (127) is nearest to 113: 14, in units of the scale (one int8
//        level step).
// q4t_*: as q4nl_* against the row's own levels, which the fit keeps ascending, distinct, with
//        levels[0] = -127 and levels[15] >= 0, so every w / scale lies in [-127, 127] and its
//        nearest level is at most max(half the widest gap, 127 - levels[15]) away: at most 127
//        (the type's bound); qtype_row_error_bound gives a row's own, usually near 12.
// Each bound adds 2^-10 for the float rounding of w / scale (relative 2^-24 times at most 2^8).
inline constexpr double kHalfStepBound = 0.5 + 1.0 / 1024;
inline constexpr double kSymClampBound = 1.0 + 1.0 / 1024;
inline constexpr double kNonLinearBound = 14.0 + 1.0 / 1024;
inline constexpr double kRowLevelsBound = 127.0 + 1.0 / 1024;

inline constexpr QTypeTraits kQTypes[] = {
    // type        name        bits float  dtype       group sym    signed zero bound
    {QType::f32, "f32", 32, true, DType::f32, 0, true, false, 0, 0.0},
    {QType::f16, "f16", 16, true, DType::f16, 0, true, false, 0, 0.0},
    {QType::bf16, "bf16", 16, true, DType::bf16, 0, true, false, 0, 0.0},
    {QType::q8, "q8", 8, false, DType::f32, 0, true, true, 0, kHalfStepBound},
    {QType::q8_g32, "q8_g32", 8, false, DType::f32, 32, true, true, 0, kHalfStepBound},
    {QType::q8_g128, "q8_g128", 8, false, DType::f32, 128, true, true, 0, kHalfStepBound},
    {QType::q4_g32, "q4_g32", 4, false, DType::f32, 32, false, false, 0, kHalfStepBound},
    {QType::q4_g64, "q4_g64", 4, false, DType::f32, 64, false, false, 0, kHalfStepBound},
    {QType::q4_g128, "q4_g128", 4, false, DType::f32, 128, false, false, 0, kHalfStepBound},
    {QType::q4s_g32, "q4s_g32", 4, false, DType::f32, 32, true, false, 8, kSymClampBound},
    {QType::q4s_g64, "q4s_g64", 4, false, DType::f32, 64, true, false, 8, kSymClampBound},
    {QType::q4s_g128, "q4s_g128", 4, false, DType::f32, 128, true, false, 8, kSymClampBound},
    {QType::q3_g32, "q3_g32", 3, false, DType::f32, 32, false, false, 0, kHalfStepBound},
    {QType::q3_g128, "q3_g128", 3, false, DType::f32, 128, false, false, 0, kHalfStepBound},
    {QType::q4k_g32, "q4k_g32", 4, false, DType::f32, 32, false, false, 0, kHalfStepBound, 256},
    {QType::q3k_g32, "q3k_g32", 3, false, DType::f32, 32, false, false, 0, kHalfStepBound, 256},
    {QType::q4nl_g32, "q4nl_g32", 4, false, DType::f32, 32, true, false, 0, kNonLinearBound, 0,
     kNonLinearLevels, true},
    {QType::q4t_g32, "q4t_g32", 4, false, DType::f32, 32, true, false, 0, kRowLevelsBound, 0,
     nullptr, true, true},
};

inline constexpr size_t kQTypeCount = std::size(kQTypes);

constexpr bool qtype_table_in_enum_order() {
    for (size_t i = 0; i < std::size(kQTypes); ++i)
        if (static_cast<size_t>(kQTypes[i].type) != i) return false;
    return true;
}
constexpr bool qtype_table_consistent() {
    for (const auto& r : kQTypes) {
        if (r.is_float) continue;
        if (r.bits != 3 && r.bits != 4 && r.bits != 8) return false;
        // Groups are whole activation blocks of 32 (a 3-bit code chunk of 128 may hold several).
        if (r.group != 0 && r.group % 32 != 0) return false;
        if (r.bits == 3 && r.symmetric) return false;  // the reference has no symmetric 3-bit grid
        if (r.signed_codes != (r.bits == 8)) return false;
        if (!r.symmetric && r.implicit_zero != 0) return false;
        // Super-blocks: 8 groups of 32 (one 8-lane vector of scales), asymmetric, 3 or 4 bits.
        if (r.super_block != 0 &&
            (r.super_block != 256 || r.group != 32 || r.symmetric || r.bits == 8))
            return false;
        // Level types: 4-bit indices into 16 levels, symmetric (no zero), one fp16 scale per group.
        if (r.nonuniform &&
            (r.bits != 4 || !r.symmetric || r.implicit_zero != 0 || r.super_block != 0))
            return false;
        if (r.row_levels && (!r.nonuniform || r.group == 0)) return false;
    }
    return true;
}
static_assert(std::size(kQTypes) == static_cast<size_t>(QType::q4t_g32) + 1,
              "every QType needs a row");
static_assert(qtype_table_in_enum_order(), "kQTypes rows must follow the enum order");
static_assert(qtype_table_consistent(), "a quantized row breaks the layout's rules");

constexpr const QTypeTraits& qtype_traits(QType t) { return kQTypes[static_cast<size_t>(t)]; }
constexpr bool qtype_is_quantized(QType t) { return !qtype_traits(t).is_float; }
constexpr bool qtype_has_super_blocks(QType t) { return qtype_traits(t).super_block != 0; }
constexpr bool qtype_has_levels(QType t) { return qtype_traits(t).nonuniform; }
constexpr bool qtype_has_row_levels(QType t) { return qtype_traits(t).row_levels; }

// The integer a group's scale multiplies for code `code` before the zero is subtracted: the
// code's level for non-uniform types (`levels`: the row's own for learned-table types, ignored
// otherwise), the code itself otherwise.
constexpr int32_t qtype_code_level(QType t, int32_t code, const int8_t* levels = nullptr) {
    if (!qtype_has_levels(t)) return code;
    return qtype_has_row_levels(t) ? levels[code] : qtype_traits(t).levels[code];
}

inline std::optional<QType> qtype_from_name(std::string_view s) {
    for (const auto& row : kQTypes)
        if (row.name == s) return row.type;
    return std::nullopt;
}

inline std::optional<QType> qtype_from_dtype(DType d) {
    for (const auto& row : kQTypes)
        if (row.is_float && row.dtype == d) return row.type;
    return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Row layout
// ---------------------------------------------------------------------------------------------

// Row stride alignment: 1 (rows packed tight) since format version 2; version 1 files padded
// each row to kQfV1RowAlign bytes.
inline constexpr uint64_t kQuantRowAlign = 1;
inline constexpr uint64_t kQfV1RowAlign = 64;
inline constexpr uint64_t kCodeChunk = 32;     // weights per code chunk (16 bytes at 4 bits)
inline constexpr uint64_t kQ3CodeChunk = 128;  // weights per 3-bit code chunk (48 bytes)

// Weights per code chunk of quantized type t: rows hold whole chunks.
constexpr uint64_t qtype_code_chunk(QType t) {
    return qtype_traits(t).bits == 3 ? kQ3CodeChunk : kCodeChunk;
}

// Where 3-bit code j of a row lives. Chunk c = j / 128 takes bytes [48 c, 48 c + 48); weight i
// (i = j % 32) of its block r = j % 128 / 32 has its low two bits in byte 16 * (r % 2) + i % 16 of
// the chunk (the 2-bit plane, bytes 0..31) at bit 4 * (r / 2) + 2 * (i / 16), and its high bit in
// byte 32 + i % 16 (the high plane, bytes 32..47) at bit (r % 2) + 2 * (i / 16) + 4 * (r / 2).
// So one 32-byte load of the 2-bit plane, shifted by 0, 2, 4 and 6, gives blocks (0, 1) weights
// 0..15, their weights 16..31, then the same for blocks (2, 3): the int8 kernel's pair order; the
// high plane, broadcast to both 128-bit lanes, gives the matching bits with one shift per lane
// (kernels/README.md, docs/FORMAT.md).
struct Q3Chunk {
    uint8_t low[32];   // 2-bit plane: byte i blocks 0 and 2, byte 16 + i blocks 1 and 3
    uint8_t high[16];  // high plane: byte i, bit per (block, weight i or 16 + i)
};
static_assert(sizeof(Q3Chunk) == kQ3CodeChunk * 3 / 8, "3 bits per weight, no padding");
struct Q3CodePosition {
    uint64_t low_byte;   // byte of the low two bits, from the start of the row
    uint32_t low_shift;  // their position in it
    uint64_t high_byte;  // byte of the high bit
    uint32_t high_bit;   // its position
};
constexpr Q3CodePosition q3_code_position(uint64_t j) {
    const uint64_t chunk = j / kQ3CodeChunk, r = j % kQ3CodeChunk / 32, i = j % 32;
    const uint32_t half = static_cast<uint32_t>(i / 16), odd = static_cast<uint32_t>(r % 2),
                   upper = static_cast<uint32_t>(r / 2);
    const uint64_t at = chunk * sizeof(Q3Chunk);
    return {at + offsetof(Q3Chunk, low) + 16 * odd + i % 16, 4 * upper + 2 * half,
            at + offsetof(Q3Chunk, high) + i % 16, odd + 2 * half + 4 * upper};
}

// Super-block types: after the codes, one record per super-block of 256 weights (8 groups of 32)
// in order. Group i's 6-bit scale sc is bits [12 i, 12 i + 6) of sm (little-endian bit order:
// bit b is bit b % 8 of sm[b / 8]) and its 6-bit min mn bits [12 i + 6, 12 i + 12), so the first
// G groups' values fill the first ceil(12 G / 8) bytes: a last super-block of G < 8 groups (k not
// a multiple of 256) stores only those, 4 + ceil(1.5 G) bytes. Records are read with memcpy
// (rows are packed tight: no alignment).
struct QSuperRecord {
    uint16_t d;      // fp16 super-scale: group scale = d * sc
    uint16_t dmin;   // fp16 super-min: group min = dmin * mn
    uint8_t sm[12];  // 8 x (6-bit sc, 6-bit mn)
};
static_assert(sizeof(QSuperRecord) == 16, "two fp16 and 96 bits of 6-bit values, no padding");
constexpr uint64_t qtype_super_record_bytes(uint64_t groups) {
    return groups == 0 ? 0 : 4 + (12 * groups + 7) / 8;
}

struct QRowLayout {
    uint64_t k = 0;              // weights per row (the tensor's second dimension)
    uint64_t group = 0;          // weights per scale (k for one scale per row)
    uint64_t groups = 0;         // ceil(k / group); the last may be partial
    uint64_t codes_bytes = 0;    // codes start at byte 0
    uint64_t scales_offset = 0;  // fp16 scales
    uint64_t zeros_offset = 0;   // uint8 zero points (asymmetric types; == row_bytes otherwise)
    uint64_t levels_offset = 0;  // learned-table types: the row's 16 int8 levels; else row_bytes
    uint64_t row_bytes = 0;      // the row stride, a multiple of the row alignment
};

constexpr uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

// The layout of one row of k weights, rows padded to a multiple of row_align bytes (1: the
// current format; kQfV1RowAlign: format version 1); nullopt for float types or k == 0.
constexpr std::optional<QRowLayout> qtype_row_layout(QType t, uint64_t k,
                                                     uint64_t row_align = kQuantRowAlign) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.is_float || k == 0 || k > (uint64_t{1} << 40)) return std::nullopt;
    QRowLayout l;
    l.k = k;
    l.group = tr.group ? tr.group : k;
    l.groups = (k + l.group - 1) / l.group;
    l.codes_bytes = round_up(k, qtype_code_chunk(t)) * tr.bits / 8;
    l.scales_offset = l.codes_bytes;
    if (tr.super_block) {  // super-block records (QSuperRecord), no zeros
        const uint64_t full = k / tr.super_block;
        const uint64_t rest = (k % tr.super_block + l.group - 1) / l.group;
        l.row_bytes =
            round_up(l.scales_offset + full * sizeof(QSuperRecord) + qtype_super_record_bytes(rest),
                     row_align);
        l.zeros_offset = l.levels_offset = l.row_bytes;
        return l;
    }
    l.zeros_offset = l.scales_offset + 2 * l.groups;
    l.levels_offset = l.zeros_offset + (tr.symmetric ? 0 : l.groups);
    const uint64_t end = l.levels_offset + (tr.row_levels ? kRowLevelsBytes : 0);
    l.row_bytes = round_up(end, row_align);
    if (tr.symmetric) l.zeros_offset = l.row_bytes;
    if (!tr.row_levels) l.levels_offset = l.row_bytes;
    return l;
}

// Bytes of one stored row of k elements (float rows are not padded).
inline std::optional<uint64_t> qtype_row_bytes(QType t, uint64_t k,
                                               uint64_t row_align = kQuantRowAlign) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.is_float) return checked_mul(k, dtype_info(tr.dtype).size);
    auto l = qtype_row_layout(t, k, row_align);
    if (!l) return std::nullopt;
    return l->row_bytes;
}

// Bytes a tensor of this type and shape occupies; nullopt when the size overflows 64 bits, or
// for a quantized type whose shape is not a non-empty matrix.
inline std::optional<uint64_t> qtype_tensor_bytes(QType t, std::span<const uint64_t> shape,
                                                  uint64_t row_align = kQuantRowAlign) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.is_float) {
        auto n = checked_product(shape);
        if (!n) return std::nullopt;
        return checked_mul(*n, dtype_info(tr.dtype).size);
    }
    if (shape.size() != 2) return std::nullopt;
    auto row = qtype_row_bytes(t, shape[1], row_align);
    if (!row) return std::nullopt;
    return checked_mul(shape[0], *row);
}

// Storage bits per weight of a [rows, k] tensor, scales and zeros included (and row padding, for
// a row_align above 1).
inline double qtype_bits_per_weight(QType t, uint64_t k, uint64_t row_align = kQuantRowAlign) {
    auto row = qtype_row_bytes(t, k, row_align);
    return row && k ? 8.0 * static_cast<double>(*row) / static_cast<double>(k) : 0.0;
}

// ---------------------------------------------------------------------------------------------
// Reference (scalar) quantization: the truth every fast kernel and every importer is tested
// against. Defined in formats/qtype.cpp.
// ---------------------------------------------------------------------------------------------

enum class QuantStatus : uint8_t {
    ok,
    non_finite,      // a weight is NaN or infinite
    scale_overflow,  // a group's scale does not fit in fp16 (|w| above ~5e5 for q4s)
};

// The one conversion of floats to a float row type (f32, f16 or bf16), under the one narrowing
// rule every writer shares: values round to nearest even, and a value that is not finite or
// that rounds to infinity in t (f16: |x| >= 65520; bf16: |x| >= 2^128 (1 - 2^-9)) does not fit.
// Stores x[0..n) into out (t's element size each) and returns the index of the first element
// that does not fit (out then holds only the elements before it), or n when all fit. Callers
// that report the error tell the two cases apart with std::isfinite.
uint64_t store_float_row(QType t, const float* x, uint64_t n, uint8_t* out);

// Quantizes k float weights into one row of qtype t (row_bytes(t, k) bytes, padding zeroed).
// Float types round to nearest even. Deterministic: depends only on the inputs. On an error
// status the row's contents are unspecified.
QuantStatus quantize_row_ref(QType t, const float* w, uint64_t k, uint8_t* row);

// The grid of one group of n weights as quantize_row_ref chooses it (scale rounded up to fp16,
// zero for asymmetric types; the implicit zero otherwise); nullopt when the scale does not fit
// fp16. Weights must be finite. GPTQ and AWQ choose groups on updated or scaled weights with the
// same function, so every method shares one grid.
//
// Super-block types (qtype_has_super_blocks): a group's grid is w = scale * code - min with
// scale = d * sc and min = dmin * mn (sc, mn in 0 .. 63; d, dmin the fp16 of the group's
// super-block; both products exact in float32: 11 by 6 bits). qtype_group_params then treats
// the group as a super-block of its own (AWQ's fake quantization uses it so); rows are built from
// a QSuperParams per super-block and qtype_group_params_in per group (quantize_row_ref).
struct QGroupParams {
    uint16_t scale_bits = 0;             // binary16, as stored (super-block types: unused)
    float scale = 0.0f;                  // the same value as float (super-block types: d * sc)
    int32_t zero = 0;                    // the integer zero point (implicit for symmetric types)
    float min = 0.0f;                    // super-block types: dmin * mn, subtracted; 0 otherwise
    uint8_t sc = 0, mn = 0;              // super-block types: the 6-bit scale and min as stored
    uint16_t d_bits = 0, dmin_bits = 0;  // super-block types: the super-block's fp16 d and dmin
    // Learned-table types: the row's 16 levels (ascending, levels[0] = -127), which the grid's
    // codes index; the caller keeps them alive. Null for every other type.
    const int8_t* levels = nullptr;
};
// Learned-table types take the row's levels (required: an Error without them); others ignore it.
std::optional<QGroupParams> qtype_group_params(QType t, const float* w, uint64_t n,
                                               const int8_t* levels = nullptr);

// One super-block's fp16 super-scale and super-min.
struct QSuperParams {
    uint16_t d_bits = 0, dmin_bits = 0;
    float d = 0.0f, dmin = 0.0f;
};
inline constexpr int32_t kSuperCodeMax = 63;  // 6-bit group scales and mins

// The reference super-block grid of n <= super_block weights (docs/FORMAT.md): per group g of
// 32, m_g = -min(0, lo_g); dmin = fp16 round-up of max m_g / 63; m'_g = dmin * ceil(m_g / dmin);
// s_g = (hi_g + m'_g) / (2^bits - 1); d = fp16 round-up of max s_g / 63. nullopt when d or dmin
// does not fit fp16.
std::optional<QSuperParams> qtype_super_params(QType t, const float* w, uint64_t n);
// The super-block of float group scales and mins (scale, min: `groups` of each, min >= 0), as a
// search chose them: d and dmin the fp16 nearest max / 63 (rounded up when that is below it).
std::optional<QSuperParams> qtype_super_from_groups(const float* scale, const float* min,
                                                    uint64_t groups);
// Group grids against a super-block: the reference rule (mn then sc rounded up, clamped to 63),
// or the nearest 6-bit values to a searched scale and min (clamped to 0 .. 63).
QGroupParams qtype_group_params_in(QType t, const QSuperParams& sp, const float* w, uint64_t n);
QGroupParams qtype_group_nearest(const QSuperParams& sp, float scale, float min);

// The code of weight w on a group's grid: round to nearest even, clamped to the type's codes;
// level types: the code of the level nearest w / scale (the lower one on ties).
int32_t qtype_quantize_value(QType t, const QGroupParams& p, float w);
// (min is 0 for every type without super-blocks, and x - 0.0f == x, so their values are
// scale * (code - zero) bit for bit; level types: scale * level, zero 0.)
inline float qtype_dequantize_value(QType t, const QGroupParams& p, int32_t code) {
    return p.scale * static_cast<float>(qtype_code_level(t, code, p.levels) - p.zero) - p.min;
}
constexpr int32_t qtype_max_code(QType t) {
    return qtype_traits(t).bits == 8 ? 127 : (1 << qtype_traits(t).bits) - 1;
}
constexpr int32_t qtype_min_code(QType t) { return qtype_traits(t).bits == 8 ? -127 : 0; }

// Packs codes (k of them) and group grids (ceil(k / group)) into one row of qtype t, padding and
// codes past k as the layout says.
void pack_row(QType t, const int32_t* codes, const QGroupParams* groups, uint64_t k, uint8_t* row);

// Dequantizes one stored row of k weights into out (exact: see the layout comment).
void dequantize_row_ref(QType t, const uint8_t* row, uint64_t k, float* out);

// The scale of group g of a quantized row (for error bounds and tests).
float row_group_scale(QType t, const uint8_t* row, uint64_t k, uint64_t g);

// The 16 levels a level type's row indexes: the type's table, or a learned-table row's own
// (at levels_offset); null for types without levels.
const int8_t* row_levels(QType t, const uint8_t* row, uint64_t k);
// The reference quantizer's worst error per weight of this row, in units of its group's scale:
// the type's error_bound, or for learned-table types the bound its stored levels give (half
// the widest gap, or the distance from the top level to 127, plus 2^-10).
double qtype_row_error_bound(QType t, const uint8_t* row, uint64_t k);

// Learned-table types: the 16 levels of one row of k weights fitted to them (importance a per
// column, null: all 1): importance-weighted Lloyd iterations from IQ4_NL's grid, each group's
// scale by the min-max rule (its element of largest magnitude on the level -127), each level
// refitted to the weights it takes, then rescaled so the lowest is -127, rounded and made
// ascending and distinct (levels[15] >= 0). The iterate with the least weighted error is kept.
// Deterministic (float64 sums in order); weights must be finite; all-zero importance fits as
// none.
void fit_row_levels(const float* w, const double* a, uint64_t k, uint64_t group, int8_t* levels);

// Code j and zero point of a quantized row, as integers (for importers, exporters and tests).
// Level types: the code is the level's index (qtype_code_level gives the level).
int32_t row_code(QType t, const uint8_t* row, uint64_t j);
int32_t row_group_zero(QType t, const uint8_t* row, uint64_t k, uint64_t g);
// Super-block types: group g's min (dmin * mn, subtracted after scale * code); 0 otherwise.
float row_group_min(QType t, const uint8_t* row, uint64_t k, uint64_t g);
// Super-block types: the bytes of super-block s's record (QSuperRecord) and its decoded values.
QSuperParams row_super_params(QType t, const uint8_t* row, uint64_t k, uint64_t s);
uint8_t row_group_sc(QType t, const uint8_t* row, uint64_t k, uint64_t g);
uint8_t row_group_mn(QType t, const uint8_t* row, uint64_t k, uint64_t g);

}  // namespace qforge
