// The key/value cache of one sequence: for every layer, the keys and values (after RoPE for
// keys) of the positions seen so far. Prefill and decode append to the same cache, so a prompt
// processed as a batch continues token by token without recomputation.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/model_config.hpp"

namespace qforge {

class KvCache {
  public:
    virtual ~KvCache() = default;
    uint64_t size() const { return size_; }          // positions filled: the next one to run
    uint64_t capacity() const { return capacity_; }  // positions it can hold
    void clear() { size_ = 0; }
    // Forgets the positions from `n` on (n <= size()).
    void truncate(uint64_t n);

  protected:
    explicit KvCache(uint64_t capacity) : capacity_(capacity) {}
    uint64_t size_ = 0;
    uint64_t capacity_;
    friend class CpuBackend;
};

// Host memory, float32, in blocks of kBlockPositions positions: block b holds positions
// [b * P, (b + 1) * P) of every layer as [layer][keys, values][kv head][P][head_dim], so the rows
// one attention task reads (one KV head's keys, then its values) lie together: 4 KiB per block at
// head_dim 64, where a [P][kv_dim] layout spread them over the block 768 bytes apart (SmolLM2
// serving 16 streams: attention's share of the step fell from 15%; see serve/README.md). The
// block table maps a
// block index to its storage, so the blocks of one sequence need not be adjacent: this cache
// owns one contiguous run of them; a PagedKvCache (runtime/paged_kv_cache.hpp) takes them one by
// one from a pool shared by many sequences. Attention reads every key and value row through the
// table, so both kinds hold the same floats at the same positions and give the same logits bit
// for bit (only the addresses differ).
class CpuKvCache : public KvCache {
  public:
    // Positions per block: a power of two, so a position's block is a shift away. 16 keeps the
    // memory lost to a sequence's partly filled last block small (under 16 positions) while a
    // block (SmolLM2-135M: 30 layers x 2 x 16 x 192 floats = 720 KiB) is large enough that the
    // table costs nothing.
    static constexpr uint64_t kBlockShift = 4;
    static constexpr uint64_t kBlockPositions = uint64_t{1} << kBlockShift;
    // Floats of one block of a model's cache: num_layers x 2 x kBlockPositions x kv_dim.
    static uint64_t block_floats(const ModelConfig& config);
    // Blocks holding `positions` positions.
    static uint64_t blocks_for(uint64_t positions) {
        return (positions + kBlockPositions - 1) >> kBlockShift;
    }

    // A cache of `capacity` positions in memory of its own.
    CpuKvCache(const ModelConfig& config, uint64_t capacity);

    // KV head `head`'s key (value) row at `pos`: head_dim floats.
    float* keys(uint64_t layer, uint64_t head, uint64_t pos) { return row(layer, 0, head, pos); }
    float* values(uint64_t layer, uint64_t head, uint64_t pos) { return row(layer, 1, head, pos); }
    // Positions pos, pos + 1, ... whose rows of one head follow each other head_dim floats apart
    // (the rest of pos's block).
    static uint64_t run_from(uint64_t pos) {
        return kBlockPositions - (pos & (kBlockPositions - 1));
    }

  protected:
    // A cache whose blocks a derived class supplies (blocks_), of `capacity` positions.
    CpuKvCache(const ModelConfig& config, uint64_t capacity, bool own_storage);

    float* row(uint64_t layer, uint64_t which, uint64_t head, uint64_t pos) {
        return blocks_[pos >> kBlockShift] +
               (((layer * 2 + which) * kv_heads_ + head) * kBlockPositions +
                (pos & (kBlockPositions - 1))) *
                   head_dim_;
    }
    uint64_t kv_heads_, head_dim_;
    std::vector<float*> blocks_;  // the block table: block b's storage

  private:
    std::vector<float> data_;  // own storage (empty for a cache of pooled blocks)
};

}  // namespace qforge
