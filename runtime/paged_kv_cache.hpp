// A paged KV cache (in the manner of vLLM's PagedAttention): one pool of fixed-size blocks
// (CpuKvCache::kBlockPositions positions of every layer each) shared by all the sequences a
// server runs, and per sequence a block table (CpuKvCache's) filled from the pool as the
// sequence grows. A sequence holds only the blocks its positions need, a finished sequence
// returns them at once, and the blocks of one sequence can be anywhere in the pool, so no
// compaction is ever needed.
//
// Admission control is the caller's (serve/scheduler.hpp): reserve() takes every block a
// sequence will need or none of them, so a short pool is a refusal the caller can queue,
// never an out-of-memory failure in the middle of a step.
//
// Prefix sharing: a new cache may start with another cache's whole blocks (adopt()), which both
// then hold (a block goes back to the pool when its last holder lets go). A cache only writes
// at its size() and beyond, and adopts only blocks wholly below the other's size(), so neither
// writes a shared block, except one truncated below a shared block: shared_from() tells the
// caller before it truncates (serve's prefix reuse takes such a cache over only where it is
// not).
//
// Not thread-safe: one thread (the scheduler's) allocates and releases.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "formats/model_config.hpp"
#include "runtime/kv_cache.hpp"

namespace qforge {

// Which of `total` blocks are taken: a free stack (the most recently returned block is reused
// first; a fresh set hands out blocks in id order) and a holder count per block (a block is free
// again when its last holder returns it). The bookkeeping of KvBlockPool here and of the CUDA
// backend's device pool (runtime/cuda_engine.hpp).
class BlockIds {
  public:
    explicit BlockIds(uint64_t total);
    uint64_t total() const { return holders_.size(); }
    uint64_t free() const { return free_.size(); }
    // `n` ids, or nullopt (and nothing taken) when fewer than n are free.
    std::optional<std::vector<uint32_t>> allocate(uint64_t n);
    // One more holder for each of `ids` (taken ones; otherwise an Error, and none is shared).
    void share(std::span<const uint32_t> ids);
    // Whether id has more than one holder.
    bool shared(uint32_t id) const { return id < holders_.size() && holders_[id] > 1; }
    // One holder fewer for each of ids (free once none is left); an id not taken (or returned
    // more often than held) is an Error, and then none is returned.
    void release(std::span<const uint32_t> ids);
    // As release, without the check: an id not taken is skipped (for destructors).
    void give_back(std::span<const uint32_t> ids) noexcept;

  private:
    std::vector<uint32_t> free_;
    std::vector<uint32_t> holders_;  // 0: free
};

// Bytes of a pool of `blocks` blocks of `block_bytes` each; throws when that is outside 1 block
// .. 4 TiB (block ids are 32-bit).
uint64_t kv_pool_bytes(uint64_t block_bytes, uint64_t blocks);

class KvBlockPool {
  public:
    // `blocks` blocks for `config`'s model (at least one), of `type` elements.
    KvBlockPool(const ModelConfig& config, uint64_t blocks, KvType type = KvType::f32);
    KvBlockPool(const KvBlockPool&) = delete;
    KvBlockPool& operator=(const KvBlockPool&) = delete;

    const ModelConfig& config() const { return config_; }
    KvType type() const { return type_; }
    uint64_t total_blocks() const { return ids_.total(); }
    uint64_t free_blocks() const { return ids_.free(); }
    uint64_t block_bytes() const { return block_bytes_; }

    // `n` blocks, or nullopt (and nothing taken) when fewer than n are free.
    std::optional<std::vector<uint32_t>> allocate(uint64_t n) { return ids_.allocate(n); }
    // Returns blocks taken by allocate; a block not taken (or returned twice) is an Error.
    void release(std::span<const uint32_t> ids) { ids_.release(ids); }
    // As release, without the check: a block not taken is skipped (for destructors).
    void give_back(std::span<const uint32_t> ids) noexcept { ids_.give_back(ids); }
    void share(std::span<const uint32_t> ids) { ids_.share(ids); }
    bool shared(uint32_t id) const { return ids_.shared(id); }
    uint8_t* block(uint32_t id) {
        return reinterpret_cast<uint8_t*>(data_.data()) + id * block_bytes_;
    }

  private:
    ModelConfig config_;
    KvType type_;
    uint64_t block_bytes_;
    std::vector<float> data_;  // floats: aligned for either element type
    BlockIds ids_;
};

// One sequence's cache of at most `limit` positions, in blocks of `pool`. capacity() is the
// positions its blocks hold (so Backend::forward refuses to run past them); reserve() grows it.
// The blocks go back to the pool when the cache is destroyed or release()d. The pool must
// outlive the cache.
class PagedKvCache final : public CpuKvCache {
  public:
    PagedKvCache(KvBlockPool& pool, uint64_t limit);
    ~PagedKvCache() override;
    PagedKvCache(const PagedKvCache&) = delete;
    PagedKvCache& operator=(const PagedKvCache&) = delete;

    uint64_t limit() const { return limit_; }
    // Makes capacity() at least `positions` (<= limit()): takes the blocks missing, all or none.
    // False when the pool has too few free blocks (then nothing changes).
    bool reserve(uint64_t positions);
    // Raises the limit to `positions` and takes the blocks missing for it, all or none; false
    // (nothing changed) when the pool has too few free blocks. A kept cache reused by a longer
    // sequence (serve's prefix reuse).
    bool extend(uint64_t positions);
    // Returns every block to the pool; the cache is then empty, of capacity 0.
    void release();
    uint64_t blocks_held() const { return ids_.size(); }
    // Starts this cache (empty, without blocks) with the first `blocks` blocks of `from` (of the
    // same pool, wholly below from.size(), blocks * kBlockPositions <= limit()), shared: its
    // size() and capacity() are then their positions. Error otherwise.
    void adopt(const PagedKvCache& from, uint64_t blocks);
    // Whether a block holding `position` or a later one is shared with another cache (writing
    // there, after truncate(), would change that cache's positions).
    bool shared_from(uint64_t position) const;

  private:
    KvBlockPool& pool_;
    uint64_t limit_;
    std::vector<uint32_t> ids_;  // the pool's ids of blocks_, in order
};

// A cache of `pool` of at most `limit` positions holding the first `positions` positions of
// `from` (a PagedKvCache of the pool), shared (KvPool::share); an Error when `from` is not one
// or `positions` is not a whole number of its blocks below its size.
std::unique_ptr<PagedKvCache> share_paged(KvBlockPool& pool, const KvCache& from,
                                          uint64_t positions, uint64_t limit);

}  // namespace qforge
