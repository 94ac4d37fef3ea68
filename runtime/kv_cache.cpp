#include "runtime/kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace qforge {

void KvCache::truncate(uint64_t n) {
    if (n > size_)
        throw Error("KV cache: cannot truncate to " + std::to_string(n) + " positions, it holds " +
                    std::to_string(size_));
    size_ = n;
}

const char* kv_type_name(KvType t) { return t == KvType::f16 ? "f16" : "f32"; }

std::optional<KvType> kv_type_from_name(std::string_view name) {
    if (name == "f32") return KvType::f32;
    if (name == "f16") return KvType::f16;
    return std::nullopt;
}

namespace {
uint64_t element_bytes(KvType t) { return t == KvType::f16 ? 2 : 4; }
}  // namespace

uint64_t CpuKvCache::block_bytes(const ModelConfig& config, KvType type) {
    const uint64_t dims[] = {config.num_layers, 2, kBlockPositions, config.kv_dim(),
                             element_bytes(type)};
    auto n = checked_product(dims);
    if (!n || *n > (uint64_t{1} << 42))
        throw Error("KV cache: a block of " + std::to_string(kBlockPositions) +
                    " positions is too large for this model");
    return *n;
}

CpuKvCache::CpuKvCache(const ModelConfig& config, uint64_t capacity, KvType type, bool own_storage)
    : KvCache(capacity),
      type_(type),
      layers_(config.num_layers),
      kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      row_bytes_(config.head_dim * element_bytes(type)) {
    if (!own_storage) return;
    const uint64_t per_block = block_bytes(config, type), blocks = blocks_for(capacity);
    const uint64_t dims[] = {per_block, blocks};
    auto n = checked_product(dims);
    if (!n || *n > (uint64_t{1} << 42))
        throw Error("KV cache of " + std::to_string(capacity) + " positions is too large");
    data_.resize(*n / sizeof(float));  // floats: aligned for either element type
    blocks_.resize(blocks);
    auto* base = reinterpret_cast<uint8_t*>(data_.data());
    for (uint64_t b = 0; b < blocks; ++b) blocks_[b] = base + b * per_block;
}

CpuKvCache::CpuKvCache(const ModelConfig& config, uint64_t capacity, KvType type)
    : CpuKvCache(config, capacity, type, true) {}

uint64_t CpuKvCache::store(uint64_t layer, uint64_t pos, const float* keys, const float* values) {
    uint64_t clamped = 0;
    for (uint64_t h = 0; h < kv_heads_; ++h)
        for (uint64_t which = 0; which < 2; ++which) {
            const float* from = (which == 0 ? keys : values) + h * head_dim_;
            uint8_t* to = row(layer, which, h, pos);
            if (type_ == KvType::f32) {
                std::memcpy(to, from, head_dim_ * sizeof(float));
                continue;
            }
            for (uint64_t i = 0; i < head_dim_; ++i) {
                float x = from[i];
                if (f16_overflows(x)) {
                    x = std::copysign(65504.0f, x);
                    ++clamped;
                }
                const uint16_t half = f32_to_f16(x);
                std::memcpy(to + 2 * i, &half, 2);
            }
        }
    return clamped;
}

void CpuKvCache::append_copy(const CpuKvCache& from, uint64_t positions) {
    if (from.type_ != type_ || from.layers_ != layers_ || from.kv_heads_ != kv_heads_ ||
        from.head_dim_ != head_dim_)
        throw Error(
            "KV cache: positions can be copied only from a cache of the same shape and type");
    if (positions > from.size() || positions > capacity() || positions < size())
        throw Error("KV cache: cannot copy positions " + std::to_string(size()) + " .. " +
                    std::to_string(positions) + " from a cache of " + std::to_string(from.size()) +
                    " into one of capacity " + std::to_string(capacity()));
    for (uint64_t pos = size(), run; pos < positions; pos += run) {
        run = std::min(positions - pos, run_from(pos));
        for (uint64_t layer = 0; layer < layers_; ++layer)
            for (uint64_t which = 0; which < 2; ++which)
                for (uint64_t h = 0; h < kv_heads_; ++h)
                    std::memcpy(row(layer, which, h, pos), from.row(layer, which, h, pos),
                                run * row_bytes_);
    }
    size_ = positions;
}

}  // namespace qforge
