#include "runtime/kv_cache.hpp"

#include "core/checked_math.hpp"
#include "core/error.hpp"

namespace qforge {

void KvCache::truncate(uint64_t n) {
    if (n > size_)
        throw Error("KV cache: cannot truncate to " + std::to_string(n) + " positions, it holds " +
                    std::to_string(size_));
    size_ = n;
}

uint64_t CpuKvCache::block_floats(const ModelConfig& config) {
    const uint64_t dims[] = {config.num_layers, 2, kBlockPositions, config.kv_dim()};
    auto n = checked_product(dims);
    if (!n || *n > (uint64_t{1} << 40))
        throw Error("KV cache: a block of " + std::to_string(kBlockPositions) +
                    " positions is too large for this model");
    return *n;
}

CpuKvCache::CpuKvCache(const ModelConfig& config, uint64_t capacity, bool own_storage)
    : KvCache(capacity), kv_heads_(config.num_kv_heads), head_dim_(config.head_dim) {
    if (!own_storage) return;
    const uint64_t per_block = block_floats(config), blocks = blocks_for(capacity);
    const uint64_t dims[] = {per_block, blocks};
    auto n = checked_product(dims);
    if (!n || *n > (uint64_t{1} << 40))
        throw Error("KV cache of " + std::to_string(capacity) + " positions is too large");
    data_.resize(*n);
    blocks_.resize(blocks);
    for (uint64_t b = 0; b < blocks; ++b) blocks_[b] = data_.data() + b * per_block;
}

CpuKvCache::CpuKvCache(const ModelConfig& config, uint64_t capacity)
    : CpuKvCache(config, capacity, true) {}

}  // namespace qforge
