// The CUDA backend's KV cache layouts, shared by the kernels (attention.cu) and the host (the
// engine, the tests): __host__ __device__ under nvcc, plain inline functions elsewhere. Elements
// are fp16 (uint16_t halves), kv_dim = kv_heads * head_dim halves a position.
//
// Contiguous: one sequence's cache allocated whole: per layer its keys, then its values, each
//   [capacity][kv_dim]; layer L's keys (values) start L * layer_stride halves after layer 0's.
// Paged: one pool of blocks that many sequences share (qforge serve); a block holds 2^block_shift
//   consecutive positions of every layer, [layer][keys, values][position in block][kv_dim], so
//   block_halves = layers * 2 * 2^block_shift * kv_dim; a sequence's position p lies in the
//   pool's block blocks[p >> block_shift] (its block table, launchers.hpp: CacheRow).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define QF_KV_HD __host__ __device__ __forceinline__
#else
#define QF_KV_HD inline
#endif

namespace qforge::cuda {

QF_KV_HD uint64_t paged_block_halves(uint64_t layers, uint32_t block_shift, uint64_t kv_dim) {
    return layers * 2 * (uint64_t{1} << block_shift) * kv_dim;
}

// Halves from the pool's start to the row of position `pos` (keys: which 0, values: 1) of
// `layer`, the position lying in pool block `block`.
QF_KV_HD uint64_t paged_row_offset(uint32_t block, uint64_t block_halves, uint32_t layer,
                                   uint32_t which, uint64_t pos, uint32_t block_shift,
                                   uint64_t kv_dim) {
    const uint64_t in_block = pos & ((uint64_t{1} << block_shift) - 1);
    return block * block_halves +
           (((uint64_t{layer} * 2 + which) << block_shift) + in_block) * kv_dim;
}

}  // namespace qforge::cuda
