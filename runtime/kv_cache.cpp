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

CpuKvCache::CpuKvCache(const ModelConfig& config, uint64_t capacity)
    : KvCache(capacity), kv_dim_(config.kv_dim()) {
    const uint64_t dims[] = {config.num_layers, 2, capacity, kv_dim_};
    auto n = checked_product(dims);
    if (!n || *n > (uint64_t{1} << 40))
        throw Error("KV cache of " + std::to_string(capacity) + " positions is too large");
    data_.resize(*n);
}

}  // namespace qforge
