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

// Host memory, float32: per layer, keys then values, each [capacity][kv_dim].
class CpuKvCache : public KvCache {
  public:
    CpuKvCache(const ModelConfig& config, uint64_t capacity);

    float* keys(uint64_t layer, uint64_t pos) { return data_.data() + offset(layer, 0, pos); }
    float* values(uint64_t layer, uint64_t pos) { return data_.data() + offset(layer, 1, pos); }

  private:
    uint64_t offset(uint64_t layer, uint64_t which, uint64_t pos) const {
        return ((layer * 2 + which) * capacity_ + pos) * kv_dim_;
    }
    uint64_t kv_dim_;
    std::vector<float> data_;
};

}  // namespace qforge
