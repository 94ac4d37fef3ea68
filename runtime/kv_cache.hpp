// The key/value cache of one sequence: for every layer, the keys and values (after RoPE for
// keys) of the positions seen so far. Prefill and decode append to the same cache, so a prompt
// processed as a batch continues token by token without recomputation.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "formats/model_config.hpp"
#include "kernels/cpu/attention.hpp"

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

// What a CPU cache stores per element: float32 (exact, the default) or IEEE binary16 (half the
// memory and half the bytes attention reads per step; keys and values rounded to nearest even
// once, when stored, and widened exactly when read, so every level computes on the same floats).
enum class KvType : uint8_t { f32, f16 };
const char* kv_type_name(KvType t);
// "f32" or "f16"; nullopt for anything else.
std::optional<KvType> kv_type_from_name(std::string_view name);

// Host memory in blocks of kBlockPositions positions: block b holds positions [b * P, (b + 1) * P)
// of every layer as [layer][keys, values][kv head][P][head_dim] elements (f32 or f16), so the rows
// one attention task reads (one KV head's keys, then its values) lie together: 16 KiB of
// floats per block at head_dim 64. The block table maps a block index to its storage, so the blocks
// of one sequence need not be adjacent: this cache owns one contiguous run of them; a PagedKvCache
// (runtime/paged_kv_cache.hpp) takes them one by one from a pool shared by many sequences.
// Attention reads every key and value row through the table, so both kinds hold the same values
// at the same positions and give the same logits bit for bit (only the addresses differ).
class CpuKvCache : public KvCache {
  public:
    // Positions per block: a power of two, so a position's block is a shift away. Attention
    // reads one run of a block at a time (kBlockPositions x head_dim elements) and pays for
    // starting each run afresh in memory: 16 KiB runs at head_dim 64 (64 positions) decode 16
    // sequences of SmolLM2-135M at 384-448 positions 1.19x faster than 4 KiB runs (16), at
    // 48-112 positions 1.09x (serve/README.md). 128 and 256 measured another 1.06x and 1.17x at
    // 384 positions, for twice and four times the memory a sequence's partly filled last block
    // may leave unused (SmolLM2, f32: 30 layers x 2 x 64 x 192 floats = 2.8 MiB a block).
    static constexpr uint64_t kBlockShift = 6;
    static constexpr uint64_t kBlockPositions = uint64_t{1} << kBlockShift;
    // Bytes of one block of a model's cache: num_layers x 2 x kBlockPositions x kv_dim elements.
    static uint64_t block_bytes(const ModelConfig& config, KvType type);
    // Blocks holding `positions` positions.
    static uint64_t blocks_for(uint64_t positions) {
        return (positions + kBlockPositions - 1) >> kBlockShift;
    }

    // A cache of `capacity` positions in memory of its own.
    CpuKvCache(const ModelConfig& config, uint64_t capacity, KvType type = KvType::f32);

    KvType type() const { return type_; }
    // Position pos's keys and values of every KV head (kv_dim floats each, head after head),
    // rounded to f16 in an f16 cache, where a finite value beyond f16's range is clamped to
    // +-65504 (as the CUDA cache does) rather than made infinite. Returns how many were clamped.
    uint64_t store(uint64_t layer, uint64_t pos, const float* keys, const float* values);
    // KV head `head`'s key (which = 0) or value (1) rows at positions pos .. pos + n - 1,
    // n <= run_from(pos), in the cache's own memory, head_dim elements (f32 or f16) apart: what
    // attention reads (kernels/cpu/attention.hpp widens f16 rows as it reads them) and prefetches.
    Ahead stored(uint64_t layer, uint64_t which, uint64_t head, uint64_t pos, uint64_t n) const {
        return {row(layer, which, head, pos), n * row_bytes_};
    }
    // Appends `from`'s positions size() .. positions - 1 (a cache of the same model and type,
    // holding them: positions <= from.size(), <= capacity()), their stored rows copied: the
    // same keys and values this cache would store running those positions' tokens, where a
    // position's rows depend only on the tokens up to it (serve's prefix sharing of a partly
    // filled block). An Error otherwise, and nothing changes.
    void append_copy(const CpuKvCache& from, uint64_t positions);
    // Positions pos, pos + 1, ... whose rows of one head follow each other (the rest of pos's
    // block).
    static uint64_t run_from(uint64_t pos) {
        return kBlockPositions - (pos & (kBlockPositions - 1));
    }

  protected:
    // A cache whose blocks a derived class supplies (blocks_), of `capacity` positions.
    CpuKvCache(const ModelConfig& config, uint64_t capacity, KvType type, bool own_storage);

    uint8_t* row(uint64_t layer, uint64_t which, uint64_t head, uint64_t pos) const {
        return blocks_[pos >> kBlockShift] +
               ((((layer * 2 + which) * kv_heads_ + head) << kBlockShift) +
                (pos & (kBlockPositions - 1))) *
                   row_bytes_;
    }

    KvType type_;
    uint64_t layers_, kv_heads_, head_dim_, row_bytes_;
    std::vector<uint8_t*> blocks_;  // the block table: block b's storage

  private:
    std::vector<float> data_;  // own storage (empty for a cache of pooled blocks)
};

}  // namespace qforge
