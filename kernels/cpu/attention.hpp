// The two products of one attention head group over a run of cached positions: the scores of
// `group` query heads against n keys, and the probabilities times n values added into the
// heads' outputs. The runtime calls them once per run of positions that lie together in its KV
// cache (kv_cache.hpp's blocks), for prefill and decode alike.
//
// Each output is one fixed sequence of operations that depends only on hd and the position's
// place in the sequence, never on n, the run boundaries or the thread: a score is one dot product
// (its own order per level, then times scale), and each output element adds its positions'
// products in position order, one rounding each. So prefill equals decode and any thread count
// gives the same bits. Levels: scalar (8 lanes of separate multiplies and adds, the order the
// runtime used before these kernels), avx2 (8-lane FMA chains) and avx512 (avx2's scores, and
// the mix's same FMAs per output on 16 lanes: the same bits as avx2). scalar and avx2 differ by
// float rounding only.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.hpp"

namespace qforge {

// Bytes the caller reads next, which the avx2 and avx512 kernels prefetch into L2 while they run,
// spread evenly over their positions (or tiles of 8 keys): the next stream on its way without one
// burst of prefetches (which the core drops once its miss buffers are full). Results never
// depend on it.
struct Ahead {
    const void* at = nullptr;
    uint64_t bytes = 0;
};

// scores[g * ld + j] = scale * (q[g * hd ..] . keys[j * stride ..]) for g < group, j < n.
void head_scores(Isa isa, const float* q, uint64_t group, uint64_t hd, const float* keys,
                 uint64_t stride, uint64_t n, float scale, float* scores, uint64_t ld,
                 Ahead ahead = {});

// out[g * hd + i] += sum over j < n, in order, of p[g * ld + j] * values[j * stride + i].
void head_mix(Isa isa, const float* p, uint64_t ld, uint64_t group, uint64_t hd,
              const float* values, uint64_t stride, uint64_t n, float* out, Ahead ahead = {});

// The same over an f16 KV cache's rows (IEEE halves, `stride` halves apart), widened in
// registers as they are read (scalar: into floats first): the bits of the float versions on the
// rows widened first, since widening is exact, with half the bytes read.
void head_scores(Isa isa, const float* q, uint64_t group, uint64_t hd, const uint16_t* keys,
                 uint64_t stride, uint64_t n, float scale, float* scores, uint64_t ld,
                 Ahead ahead = {});
void head_mix(Isa isa, const float* p, uint64_t ld, uint64_t group, uint64_t hd,
              const uint16_t* values, uint64_t stride, uint64_t n, float* out, Ahead ahead = {});

}  // namespace qforge
