#include "runtime/paged_kv_cache.hpp"

#include <algorithm>
#include <string>

#include "core/checked_math.hpp"
#include "core/error.hpp"

namespace qforge {

BlockIds::BlockIds(uint64_t total) {
    holders_.assign(total, 0);
    free_.resize(total);
    // Block 0 on top of the stack: a fresh set hands out blocks in id order.
    for (uint64_t i = 0; i < total; ++i) free_[i] = static_cast<uint32_t>(total - 1 - i);
}

std::optional<std::vector<uint32_t>> BlockIds::allocate(uint64_t n) {
    if (n > free_.size()) return std::nullopt;
    std::vector<uint32_t> ids(free_.end() - static_cast<std::ptrdiff_t>(n), free_.end());
    std::reverse(ids.begin(), ids.end());
    free_.resize(free_.size() - n);
    for (uint32_t id : ids) holders_[id] = 1;
    return ids;
}

void BlockIds::share(std::span<const uint32_t> ids) {
    for (uint32_t id : ids)
        if (id >= holders_.size() || holders_[id] == 0 || holders_[id] == UINT32_MAX)
            throw Error("KV block pool: block " + std::to_string(id) +
                        " is shared but was not taken");
    for (uint32_t id : ids) ++holders_[id];
}

void BlockIds::release(std::span<const uint32_t> ids) {
    for (uint32_t id : ids)
        if (id >= holders_.size() || holders_[id] == 0)
            throw Error("KV block pool: block " + std::to_string(id) +
                        " is returned but was not taken");
    give_back(ids);
}

void BlockIds::give_back(std::span<const uint32_t> ids) noexcept {
    // free_ was sized for every block at construction and only shrinks by allocate(), so its
    // capacity holds them all: push_back never reallocates here, and nothing can throw.
    for (uint32_t id : ids) {
        if (id >= holders_.size() || holders_[id] == 0) continue;
        if (--holders_[id] == 0) free_.push_back(id);
    }
}

uint64_t kv_pool_bytes(uint64_t block_bytes, uint64_t blocks) {
    // Block ids are 32-bit; a pool beyond 4 TiB is a mistake anyway.
    const uint64_t dims[] = {block_bytes, blocks};
    auto n = checked_product(dims);
    if (blocks == 0 || blocks > UINT32_MAX || !n || *n > (uint64_t{1} << 42))
        throw Error("KV block pool: " + std::to_string(blocks) + " blocks of " +
                    std::to_string(block_bytes) + " bytes is outside 1 block .. 4 TiB");
    return *n;
}

KvBlockPool::KvBlockPool(const ModelConfig& config, uint64_t blocks, KvType type)
    : config_(config),
      type_(type),
      block_bytes_(CpuKvCache::block_bytes(config, type)),
      data_(kv_pool_bytes(block_bytes_, blocks) / sizeof(float)),
      ids_(blocks) {}

PagedKvCache::PagedKvCache(KvBlockPool& pool, uint64_t limit)
    : CpuKvCache(pool.config(), 0, pool.type(), false), pool_(pool), limit_(limit) {}

// A destructor must not throw (it may run while an exception unwinds): the blocks go back through
// the pool's unchecked path; release() checks them.
PagedKvCache::~PagedKvCache() { pool_.give_back(ids_); }

bool PagedKvCache::extend(uint64_t positions) {
    if (positions <= limit_) return reserve(positions);
    const uint64_t before = limit_;
    limit_ = positions;
    bool ok = false;
    try {
        ok = reserve(positions);
    } catch (...) {  // out of memory in the block table: as it was
        limit_ = before;
        throw;
    }
    if (!ok) {
        limit_ = before;
        return false;
    }
    capacity_ = std::min(limit_, ids_.size() * kBlockPositions);  // the blocks held may cover it
    return true;
}

bool PagedKvCache::reserve(uint64_t positions) {
    if (positions > limit_)
        throw Error("KV cache: " + std::to_string(positions) +
                    " positions requested, the sequence's limit is " + std::to_string(limit_));
    const uint64_t need = blocks_for(positions);
    if (need <= ids_.size()) return true;
    auto got = pool_.allocate(need - ids_.size());
    if (!got) return false;
    for (uint32_t id : *got) {
        ids_.push_back(id);
        blocks_.push_back(pool_.block(id));
    }
    capacity_ = std::min(limit_, ids_.size() * kBlockPositions);
    return true;
}

void PagedKvCache::adopt(const PagedKvCache& from, uint64_t blocks) {
    if (&from.pool_ != &pool_ || !ids_.empty() || size_ != 0 ||
        blocks * kBlockPositions > from.size() || blocks * kBlockPositions > limit_)
        throw Error("KV cache: " + std::to_string(blocks) +
                    " blocks cannot be shared from a cache of " + std::to_string(from.size()) +
                    " positions into one of limit " + std::to_string(limit_));
    const std::span<const uint32_t> ids(from.ids_.data(), blocks);
    blocks_.reserve(blocks);  // may throw: nothing shared yet
    ids_.reserve(blocks);
    pool_.share(ids);
    ids_.assign(ids.begin(), ids.end());
    blocks_.assign(from.blocks_.begin(),
                   from.blocks_.begin() + static_cast<std::ptrdiff_t>(blocks));
    size_ = capacity_ = blocks * kBlockPositions;
}

bool PagedKvCache::shared_from(uint64_t position) const {
    for (uint64_t b = position >> kBlockShift; b < ids_.size(); ++b)
        if (pool_.shared(ids_[b])) return true;
    return false;
}

std::unique_ptr<PagedKvCache> share_paged(KvBlockPool& pool, const KvCache& from,
                                          uint64_t positions, uint64_t limit) {
    const auto* paged = dynamic_cast<const PagedKvCache*>(&from);
    if (!paged || positions % CpuKvCache::kBlockPositions != 0)
        throw Error("KV cache: " + std::to_string(positions) +
                    " positions cannot be shared from this cache (a paged one's whole blocks)");
    auto cache = std::make_unique<PagedKvCache>(pool, limit);
    cache->adopt(*paged, positions / CpuKvCache::kBlockPositions);
    return cache;
}

void PagedKvCache::release() {
    pool_.release(ids_);
    ids_.clear();
    blocks_.clear();
    size_ = 0;
    capacity_ = 0;
}

}  // namespace qforge
