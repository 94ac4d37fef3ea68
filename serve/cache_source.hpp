// Where the scheduler's KV caches come from (serve/scheduler.hpp). Both sources count in blocks
// of CpuKvCache::kBlockPositions positions and give a sequence every position it may need at
// admission, or nothing, so a short budget is a wait in the queue, never a failure mid-step.
//
// - PagedCacheSource: the paged pool (runtime/paged_kv_cache.hpp), for the CPU backend, whose
//   batched step reads every sequence's cache through its block table.
// - PoolCacheSource: the backend's own pool (Backend::new_kv_pool): the CPU backend's is the
//   paged pool above, the CUDA backend's a pool of blocks in device memory whose batched step
//   reads each row's cache through its block table (qforge serve takes this one).
// - BackendCacheSource: one cache per sequence made by the backend itself (Backend::new_cache:
//   allocated whole), against a budget of blocks; for a backend without a pool.
//
// Not thread-safe: the scheduler's thread alone takes and gives back.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/backend.hpp"
#include "runtime/paged_kv_cache.hpp"

namespace qforge::serve {

class KvCacheSource {
  public:
    virtual ~KvCacheSource() = default;
    // A cache of `positions` positions, or null (nothing taken) when too few blocks are free.
    virtual std::unique_ptr<KvCache> take(uint64_t positions) = 0;
    // Returns a cache take() gave; it is destroyed.
    virtual void give_back(std::unique_ptr<KvCache> cache) = 0;
    // Makes a cache take() gave hold at least `positions` positions, or false with nothing
    // changed (too few free blocks; a source that cannot).
    virtual bool extend(KvCache& /*cache*/, uint64_t /*positions*/) { return false; }
    // KvPool::share and KvPool::shared_from (runtime/backend.hpp): a cache starting with
    // another's whole blocks, shared; null from a source that cannot share.
    virtual std::unique_ptr<KvCache> share(const KvCache& /*from*/, uint64_t /*positions*/,
                                           uint64_t /*limit*/) {
        return nullptr;
    }
    virtual bool shared_from(const KvCache& /*cache*/, uint64_t /*position*/) const {
        return false;
    }
    virtual uint64_t free_blocks() const = 0;
    virtual uint64_t total_blocks() const = 0;
};

// Appends `from`'s positions to.size() .. positions - 1 to `to`, their rows copied, where both
// are host caches (CpuKvCache::append_copy: the CPU backend's, pooled or not); false (nothing
// changed) for caches that are not (the CUDA device pool's).
bool copy_positions(KvCache& to, const KvCache& from, uint64_t positions);

class PagedCacheSource final : public KvCacheSource {
  public:
    explicit PagedCacheSource(KvBlockPool& pool) : pool_(pool) {}
    std::unique_ptr<KvCache> take(uint64_t positions) override;
    void give_back(std::unique_ptr<KvCache> cache) override { cache.reset(); }
    bool extend(KvCache& cache, uint64_t positions) override;
    std::unique_ptr<KvCache> share(const KvCache& from, uint64_t positions,
                                   uint64_t limit) override {
        return share_paged(pool_, from, positions, limit);
    }
    bool shared_from(const KvCache& cache, uint64_t position) const override;
    uint64_t free_blocks() const override { return pool_.free_blocks(); }
    uint64_t total_blocks() const override { return pool_.total_blocks(); }

  private:
    KvBlockPool& pool_;
};

class PoolCacheSource final : public KvCacheSource {
  public:
    explicit PoolCacheSource(std::unique_ptr<KvPool> pool);
    std::unique_ptr<KvCache> take(uint64_t positions) override { return pool_->take(positions); }
    void give_back(std::unique_ptr<KvCache> cache) override { cache.reset(); }
    bool extend(KvCache& cache, uint64_t positions) override {
        return pool_->extend(cache, positions);
    }
    std::unique_ptr<KvCache> share(const KvCache& from, uint64_t positions,
                                   uint64_t limit) override {
        return pool_->share(from, positions, limit);
    }
    bool shared_from(const KvCache& cache, uint64_t position) const override {
        return pool_->shared_from(cache, position);
    }
    uint64_t free_blocks() const override { return pool_->free_blocks(); }
    uint64_t total_blocks() const override { return pool_->total_blocks(); }

  private:
    std::unique_ptr<KvPool> pool_;
};

class BackendCacheSource final : public KvCacheSource {
  public:
    // At most `blocks` blocks' positions in all the caches out at once (at least one block).
    BackendCacheSource(const Backend& backend, uint64_t blocks);
    std::unique_ptr<KvCache> take(uint64_t positions) override;
    void give_back(std::unique_ptr<KvCache> cache) override;
    uint64_t free_blocks() const override { return free_; }
    uint64_t total_blocks() const override { return total_; }

  private:
    const Backend& backend_;
    uint64_t total_, free_;
};

}  // namespace qforge::serve
