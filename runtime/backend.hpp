// The Backend interface: one forward pass of the transformer over a run of tokens, appending to
// a KV cache. Every compute device (CPU now, CUDA later) implements it; perplexity, generation
// and calibration use only this interface.
//
// The forward pass itself is written once, in runtime/transformer.hpp, over operations each
// backend implements.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "runtime/kv_cache.hpp"
#include "runtime/model.hpp"

namespace qforge {

class ThreadPool;

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string_view name() const = 0;
    virtual const Model& model() const = 0;

    // A cache for this backend holding up to `capacity` positions (at most
    // max_position_embeddings).
    virtual std::unique_ptr<KvCache> new_cache(uint64_t capacity) const = 0;

    // Runs `tokens` at positions cache.size() .. cache.size() + n - 1 (one batch: prefill; one
    // token: decode), appends their keys and values to `cache`, and writes the logits of
    // tokens[logits_from ..] into `logits`: (n - logits_from) rows of vocab_size floats.
    // Throws qforge::Error for an out-of-range token id, a full cache or a wrong logits size.
    virtual void forward(std::span<const int32_t> tokens, KvCache& cache, uint64_t logits_from,
                         std::span<float> logits) = 0;
};

struct CpuBackendOptions {
    // Regions with fewer multiply-adds run on the calling thread: waking the workers and meeting
    // at the barrier costs a few microseconds, about this much work. (stories260K's 64x64
    // matrices in decode fall below it; TinyLlama's never do.) Tests set 0 to split everything.
    uint64_t min_parallel_work = 32 * 1024;
    // Activations multiplied with quantized matrices: int8 blocks (integer dot products, the
    // default) or float32 (exact; for measuring the int8 cost). kernels/cpu/qdot.hpp.
    bool int8_activations = true;
};

// The CPU backend; `pool` (shared by every backend of a process) runs its parallel loops.
std::unique_ptr<Backend> make_cpu_backend(const Model& model, ThreadPool& pool,
                                          CpuBackendOptions options = {});

}  // namespace qforge
