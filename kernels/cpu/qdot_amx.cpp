// AMX-INT8 products on packed rows (kernels/cpu/qpack.hpp), int8 activations, 16 or more tokens
// at the avx512 level where cpu_uses_amx_int8() (kernels/cpu/qdot.cpp dispatches; the VNNI
// kernels in qdot_avx512.cpp serve the rest).
//
// The same block sums from tile products. Per block, a C tile (16 tokens x 16 rows of int32) is A
// (16 tokens' 32 activation bytes) times B (the block's 8 code vectors of a packed tile: 8 rows of
// 64 bytes, vector j = weights 4j .. 4j + 3 of each row in its lane), so each C element is an
// exact integer and block_step takes it on as qdot_avx512.cpp's kernels do: the bits stay
// qmatmul_scalar's. B holds signed bytes (tdpbssd) wherever they can carry code - zero: 8-bit
// codes and levels as they are, 4-bit codes less their implicit or stored zero (the chunk biases,
// then the byte's top bit flipped), so C is the reference's integer itself. Super-block types
// (no zero) and a chunk with a damaged stored zero above 128 (zeros_biasable) take the raw codes
// unsigned (tdpbsud) and subtract zero * sum q after conversion, exactly, as the VNNI kernel's raw
// paths do.
//
// Steps. A row pair's chunk runs one step per (block, token group of 16): B operands 6 and 7 (the
// pair's two row tiles) once per block, then per token group A 4 + s % 2 and C tiles 2 (s % 2),
// 2 (s % 2) + 1. A step's C tiles are stored at the next step and summed at the one after, so the
// tiles multiply while the vector units sum, and no load waits on the tile store just issued. The
// sums (4 float operations per output: the per-block scaling that int8 activations need) are
// what bounds this kernel: without them its tile work ran 2.1-2.6x faster (2048x5632, 128
// tokens). The tokens come as A operands from QActivations (tile_codes: each 16-token group's
// block a contiguous 512 bytes) with their scales, code sums and d * sums beside them.
#include <algorithm>

#include "kernels/cpu/amx_tiles.hpp"
#include "kernels/cpu/qdot_avx2.hpp"

#include "kernels/cpu/qdot_avx512_blocks.hpp"

namespace qforge::detail {

#if defined(__x86_64__)

namespace {

#define QF_AMX_INT8                                                               \
    __attribute__((                                                               \
        target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-" \
               "int8")))

constexpr uint64_t kAmxTokens = QActivations::kTileTokens;  // rows of an A or C tile
constexpr uint64_t kAmxAhead = 2048;  // bytes of a packed tile prefetched ahead of its products

// C 2u + g (step slot u, row group g), A 4 + u, B 6 + g.
QF_AMX_INT8 inline void amx_int8_configure() {
    AmxTileConfig c;
    for (int i = 0; i < 8; ++i) {
        c.colsb[i] = (i == 4 || i == 5) ? kBlock : 64;
        c.rows[i] = i >= 6 ? 8 : kAmxTokens;
    }
    amx_load_config(c);
}

// C += A . B (tile numbers: the intrinsics paste them into the instruction): signed activations
// against signed (tdpbssd) or unsigned (tdpbsud) codes.
#define QF_AMX_PRODUCT(Unsigned, C, A, B) \
    do {                                  \
        if constexpr (Unsigned)           \
            _tile_dpbsud(C, A, B);        \
        else                              \
            _tile_dpbssd(C, A, B);        \
    } while (0)

// The prefetches of one row group's tiles: the current tile's bytes and then, once past its end,
// the next row pair's tile in the same slot (so a pair's first lines are on their way before its
// products start), kAmxAhead past the end of the block whose B operand is being built (one block
// ahead of the block multiplied). Never past the next tile's end: with tiles smaller than the
// distance the count would otherwise claim bytes of tiles further on.
struct AmxPrefetch {
    const uint8_t* tile = nullptr;
    const uint8_t* next = nullptr;
    uint64_t tile_bytes = 0;
    uint64_t done = 0;  // bytes of [tile, next) asked for, at most 2 tile_bytes

    QF_AMX_INT8 void upto(uint64_t offset) {
        for (offset = std::min(offset, 2 * tile_bytes); done < offset; done += 64)
            _mm_prefetch(reinterpret_cast<const char*>(
                             done < tile_bytes ? tile + done : next + (done - tile_bytes)),
                         _MM_HINT_T0);
    }
    // Moves on to the next pair: what was asked of `next` counts as its own.
    void advance(const uint8_t* t, const uint8_t* n) {
        done = done > tile_bytes ? done - tile_bytes : 0;
        tile = t;
        next = n;
    }
};

// Block sums of c (row u of c[g]: token u of the group, row group g) added into sums, the first m
// tokens. RawZero: c holds raw codes' sums (block_step subtracts zero * sum q).
template <QType T, bool RawZero>
__attribute__((always_inline)) QF_AMX_INT8 inline void amx_block_sums(
    const int32_t (*c)[kAmxTokens][kLanes], const PackedBlock (&p)[kGroups], const float* dt,
    const int32_t* qt, const float* dst, uint64_t m, __m512* __restrict sums) {
    const PackedBlock p0 = p[0], p1 = p[1];
    auto token = [&](uint64_t u) QF_AMX_INT8 {
        const __m512 d = _mm512_set1_ps(dt[u]);
        const __m512 qsum = _mm512_set1_ps(static_cast<float>(qt[u]));
        const __m512 ds = _mm512_set1_ps(dst[u]);
        const __m512i isum0 = _mm512_load_si512(c[0][u]), isum1 = _mm512_load_si512(c[1][u]);
        sums[kGroups * u] = block_step<T, RawZero>(sums[kGroups * u], isum0, p0, d, qsum, ds);
        sums[kGroups * u + 1] =
            block_step<T, RawZero>(sums[kGroups * u + 1], isum1, p1, d, qsum, ds);
    };
    if (m == kAmxTokens) {
#pragma GCC unroll 16
        for (uint64_t u = 0; u < kAmxTokens; ++u) token(u);
    } else {
        for (uint64_t u = 0; u < m; ++u) token(u);
    }
}

// One chunk of a row pair (meta in pk, codes of row group g at codes[g], nb blocks from b0)
// against every token, its sums added into sums. Raw: a stored-zero chunk that cannot be biased.
template <QType T, bool Raw>
QF_AMX_INT8 void amx_chunk(const PackedBlock (*pk)[kGroups], const uint8_t* const (&codes)[kGroups],
                           const __m512i (&bias)[kGroups][kChunkBlocks], uint64_t block_bytes,
                           __m128i table, uint64_t b0, uint64_t nb, const QActivations& a,
                           uint64_t g0, uint64_t n, AmxPrefetch (&pf)[kGroups], __m512* sums) {
    constexpr bool kUnsigned = Kind<T>::super || Raw;
    constexpr bool kBiased = Kind<T>::q4 && !Kind<T>::levels && !kUnsigned;
    alignas(64) uint8_t b_operand[2][kGroups][8][64];
    alignas(64) int32_t c[4][kAmxTokens][kLanes];
    uint64_t step = 0;
    uint64_t sb[2] = {}, stg[2] = {};           // the block and token group of step s, at [s % 2]
    auto store = [&](uint64_t s) QF_AMX_INT8 {  // step s's C tiles into c[2 (s % 2) ..]
        if (s % 2 == 0) {
            _tile_stored(0, c[0], 64);
            _tile_stored(1, c[1], 64);
        } else {
            _tile_stored(2, c[2], 64);
            _tile_stored(3, c[3], 64);
        }
    };
    auto sum = [&](uint64_t s) QF_AMX_INT8 {
        const uint64_t b = sb[s % 2], g = stg[s % 2];
        amx_block_sums<T, Raw>(c + 2 * (s % 2), pk[b - b0], a.tile_scales(g0 + g, b),
                               a.tile_sums(g0 + g, b), a.tile_scaled_sums(g0 + g, b),
                               std::min(kAmxTokens, n - g * kAmxTokens),
                               sums + kGroups * kAmxTokens * g);
    };
    // Block i's B operands: 8-bit codes as they lie; others built into b_operand[i % 2] one block
    // ahead, so a tile load never waits on the vector stores just issued (loaded right after
    // them, they stalled 15% of a 16-sequence decode step).
    auto build = [&](uint64_t i) QF_AMX_INT8 {
        for (uint64_t g = 0; g < kGroups; ++g) {
            const uint8_t* at = codes[g] + i * block_bytes;
            pf[g].upto(static_cast<uint64_t>(at - pf[g].tile) + block_bytes + kAmxAhead);
            if constexpr (!(Kind<T>::q8 && !Kind<T>::levels)) {
                __m512i u[8];
                packed_vectors<T>(at, table, u);
                for (int j = 0; j < 8; ++j) {
                    if constexpr (kBiased)  // (code - zero + 128) with its top bit flipped
                        u[j] = _mm512_xor_si512(_mm512_add_epi8(u[j], bias[g][i]),
                                                _mm512_set1_epi8(static_cast<char>(0x80)));
                    _mm512_store_si512(b_operand[i % 2][g][j], u[j]);
                }
            }
        }
    };
    const uint64_t groups = (n + kAmxTokens - 1) / kAmxTokens;
    build(0);
    for (uint64_t i = 0; i < nb; ++i) {
        const uint64_t b = b0 + i;
        if (i + 1 < nb) build(i + 1);
        const uint8_t* operand[kGroups];
        for (uint64_t g = 0; g < kGroups; ++g)
            operand[g] = Kind<T>::q8 && !Kind<T>::levels ? codes[g] + i * block_bytes
                                                         : &b_operand[i % 2][g][0][0];
        // GCC's tile-load intrinsic tells the compiler it reads no memory, so the vector stores
        // that built the operand could be dropped as dead: a memory clobber keeps them.
        __asm__ __volatile__("" : : : "memory");
        _tile_loadd(6, operand[0], 64);
        _tile_loadd(7, operand[1], 64);
        for (uint64_t g = 0; g < groups; ++g, ++step) {
            const int8_t* x = a.tile_codes(g0 + g, b);
            if (step % 2 == 0) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_loadd(4, x, kBlock);
                QF_AMX_PRODUCT(kUnsigned, 0, 4, 6);
                QF_AMX_PRODUCT(kUnsigned, 1, 4, 7);
            } else {
                _tile_zero(2);
                _tile_zero(3);
                _tile_loadd(5, x, kBlock);
                QF_AMX_PRODUCT(kUnsigned, 2, 5, 6);
                QF_AMX_PRODUCT(kUnsigned, 3, 5, 7);
            }
            if (step >= 1) store(step - 1);
            if (step >= 2) sum(step - 2);
            sb[step % 2] = b;
            stg[step % 2] = g;
        }
    }
    if (step >= 2) sum(step - 2);
    store(step - 1);
    sum(step - 1);
}

template <QType T>
QF_AMX_INT8 void amx_packed_rows(const QPackedRows& m, uint64_t r0, uint64_t r1,
                                 const QActivations& a, uint64_t t0, uint64_t t1, float* out,
                                 uint64_t ldo) {
    const QPackLayout& pl = m.layout();
    const uint64_t n = t1 - t0;
    const uint64_t g0 = t0 / kAmxTokens;  // t0 is a multiple of 16 (qmatmul_packed_isa)
    __m512* sums = token_sums(n);
    alignas(64) PackedBlock pk[kChunkBlocks][kGroups];
    __m128i table = _mm_setzero_si128();
    if constexpr (Kind<T>::levels)
        table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qtype_traits(T).levels));
    AmxPrefetch pf[kGroups];
    for (auto& p : pf) p.tile_bytes = pl.tile_bytes;
    amx_int8_configure();
    for (uint64_t rg = r0 - r0 % kLanes; rg < r1; rg += kGroups * kLanes) {
        // As packed_rows: one past the matrix's end computes tile rg's rows again, not stored.
        const uint8_t* tile[kGroups];
        GroupMeta row[kGroups];
        for (uint64_t g = 0; g < kGroups; ++g) {
            const uint64_t i = rg / kLanes + g;
            tile[g] = m.tile(i < m.tiles() ? i : rg / kLanes);
            row[g] = packed_row_meta<T>(tile[g]);
        }
        for (uint64_t i = 0; i < n * kGroups; ++i) sums[i] = _mm512_setzero_ps();
        for (uint64_t g = 0; g < kGroups; ++g) {
            const uint64_t i = rg / kLanes + kGroups + g;  // the next pair's tile g
            pf[g].advance(tile[g], m.tile(std::min(i, m.tiles() - 1)));
        }
        for (uint64_t ch = 0; ch < pl.chunks; ++ch) {
            const uint64_t nb = pl.chunk_blocks(ch), b0 = ch * kChunkBlocks;
            const uint8_t* codes[kGroups];
            __m512i bias[kGroups][kChunkBlocks];
            for (uint64_t g = 0; g < kGroups; ++g) {
                const uint8_t* chunk = tile[g] + pl.header + ch * pl.chunk_bytes;
                packed_chunk_meta<T, true>(chunk, pl, nb, row[g], &pk[0][g], kGroups, bias[g]);
                codes[g] = chunk + pl.meta_bytes(nb);
            }
            if (!Kind<T>::zero_stored || zeros_biasable<T>(pk, nb, kGroups))
                amx_chunk<T, false>(pk, codes, bias, pl.block_bytes, table, b0, nb, a, g0, n, pf,
                                    sums);
            else if constexpr (Kind<T>::zero_stored)  // raw codes: only stored zeros
                amx_chunk<T, true>(pk, codes, bias, pl.block_bytes, table, b0, nb, a, g0, n, pf,
                                   sums);
        }
        store_lanes(sums, kGroups, rg, r0, r1, n, out, ldo);
    }
    _tile_release();
}

template <QType T>
constexpr QPackedKernel amx_entry() {
    if constexpr (qtype_is_quantized(T) && (Kind<T>::q4 || Kind<T>::q8) && !Kind<T>::row_levels)
        return amx_packed_rows<T>;
    else
        return nullptr;
}

template <size_t... I>
constexpr QPackedKernelRow amx_row(std::index_sequence<I...>) {
    return {{amx_entry<kQTypes[I].type>()...}};
}

}  // namespace

const QPackedKernelRow& amx_packed_kernels() {
    static constexpr QPackedKernelRow row = amx_row(std::make_index_sequence<kQTypeCount>{});
    return row;
}

#else  // no x86: the table never selects this kernel

const QPackedKernelRow& amx_packed_kernels() {
    static constexpr QPackedKernelRow row{};
    return row;
}

#endif

}  // namespace qforge::detail
