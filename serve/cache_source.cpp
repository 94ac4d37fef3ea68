#include "serve/cache_source.hpp"

#include <string>
#include <utility>

#include "core/error.hpp"

namespace qforge::serve {

std::unique_ptr<KvCache> PagedCacheSource::take(uint64_t positions) {
    auto cache = std::make_unique<PagedKvCache>(pool_, positions);
    if (!cache->reserve(positions)) return nullptr;
    return cache;
}

bool PagedCacheSource::extend(KvCache& cache, uint64_t positions) {
    auto* paged = dynamic_cast<PagedKvCache*>(&cache);
    return paged && paged->extend(positions);
}

bool PagedCacheSource::shared_from(const KvCache& cache, uint64_t position) const {
    const auto* paged = dynamic_cast<const PagedKvCache*>(&cache);
    return paged && paged->shared_from(position);
}

PoolCacheSource::PoolCacheSource(std::unique_ptr<KvPool> pool) : pool_(std::move(pool)) {
    if (!pool_) throw Error("serve: no KV block pool");
}

BackendCacheSource::BackendCacheSource(const Backend& backend, uint64_t blocks)
    : backend_(backend), total_(blocks), free_(blocks) {
    if (blocks == 0) throw Error("serve: a KV cache budget needs at least one block");
}

std::unique_ptr<KvCache> BackendCacheSource::take(uint64_t positions) {
    const uint64_t blocks = CpuKvCache::blocks_for(positions);
    if (blocks > free_) return nullptr;
    auto cache = backend_.new_cache(positions);  // throws (out of memory, say) before counting
    free_ -= blocks;
    return cache;
}

void BackendCacheSource::give_back(std::unique_ptr<KvCache> cache) {
    if (!cache) return;
    const uint64_t blocks = CpuKvCache::blocks_for(cache->capacity());
    cache.reset();
    free_ += blocks;
}

bool copy_positions(KvCache& to, const KvCache& from, uint64_t positions) {
    auto* host = dynamic_cast<CpuKvCache*>(&to);
    const auto* source = dynamic_cast<const CpuKvCache*>(&from);
    if (!host || !source) return false;
    host->append_copy(*source, positions);
    return true;
}

}  // namespace qforge::serve
