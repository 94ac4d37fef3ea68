// The Backend interface: one forward pass of the transformer over a run of tokens, appending to
// a KV cache. Every compute device (CPU now, CUDA later) implements it; perplexity, generation
// and calibration use only this interface.
//
// The forward pass itself is written once, in runtime/transformer.hpp, over operations each
// backend implements.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "kernels/cpu/isa.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/model.hpp"
#include "runtime/transformer.hpp"

namespace qforge {

class ThreadPool;

// One step of a backend opened for op-level tests (tests/backend_ops_test.cpp, in the manner of
// llama.cpp's test-backend-ops): the operations of runtime/transformer.hpp, the activation rows
// forward computes in (in the backend's memory: host for the CPU, the device for CUDA, so they
// carry the backend's own leading dimensions and buffer layout), and copies between them and
// host memory.
class OpsStep {
  public:
    virtual ForwardOps& ops() = 0;
    virtual const BlockActivations& rows() const = 0;
    virtual Rows logits() const = 0;            // vocab_size wide
    virtual const int32_t* tokens() const = 0;  // the step's token ids, where embed reads them
    // n rows of `width` floats from host `src` (packed) into `dst`, and from `src` back.
    virtual void write(Rows dst, const float* src, uint64_t n, uint64_t width) = 0;
    virtual void read(Rows src, float* dst, uint64_t n, uint64_t width) = 0;

  protected:
    ~OpsStep() = default;
};

// One sequence's part of a batched step (Backend::forward_batch): its tokens, run at positions
// cache->size() .., and whether the logits of its last token are wanted (a decode token, or the
// last chunk of a prompt; not an earlier chunk), or of every token (all_logits: a prompt whose
// positions' log-probabilities are asked for).
struct BatchSequence {
    std::span<const int32_t> tokens;
    KvCache* cache = nullptr;
    bool logits = false;
    bool all_logits = false;
    // Its rows of logits: the last `logit_rows()` tokens'.
    uint64_t logit_rows() const { return all_logits ? tokens.size() : logits ? 1 : 0; }
};

// A pool of KV cache blocks (CpuKvCache::kBlockPositions positions of every layer each) in the
// backend's memory, from which many sequences' caches take their blocks (qforge serve: paged
// caches, no allocation per request). take() gives a cache whose blocks hold at least
// `positions` positions (capacity() == positions), or null, with nothing taken, when too few
// blocks are free; positions outside 1 .. max_position_embeddings throw qforge::Error. The cache
// returns its blocks when destroyed. The pool must outlive its caches. Not thread-safe.
class KvPool {
  public:
    virtual ~KvPool() = default;
    virtual std::unique_ptr<KvCache> take(uint64_t positions) = 0;
    // Makes a cache this pool gave hold at least `positions` positions (its blocks kept, more
    // taken), or returns false with nothing changed: too few free blocks, or a pool that cannot.
    virtual bool extend(KvCache& /*cache*/, uint64_t /*positions*/) { return false; }
    // A cache of at most `limit` positions starting with the first `positions` positions of
    // `from` (a cache of this pool; a whole number of blocks wholly below from.size()), their
    // blocks shared, not copied; no other block is taken yet (extend() takes them). Null from a
    // pool that cannot share (runtime/paged_kv_cache.hpp, "Prefix sharing").
    virtual std::unique_ptr<KvCache> share(const KvCache& /*from*/, uint64_t /*positions*/,
                                           uint64_t /*limit*/) {
        return nullptr;
    }
    // Whether a block of `cache` (this pool's) holding `position` or a later one is shared with
    // another cache: truncating it there and writing would change that cache.
    virtual bool shared_from(const KvCache& /*cache*/, uint64_t /*position*/) const {
        return false;
    }
    virtual uint64_t free_blocks() const = 0;
    virtual uint64_t total_blocks() const = 0;
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string_view name() const = 0;
    virtual const Model& model() const = 0;

    // A cache for this backend holding up to `capacity` positions (at most
    // max_position_embeddings).
    virtual std::unique_ptr<KvCache> new_cache(uint64_t capacity) const = 0;
    // A pool of `blocks` blocks for paged caches (KvPool) on the backend's device. The default
    // throws: a backend without one (serve then gives each sequence a cache of its own).
    virtual std::unique_ptr<KvPool> new_kv_pool(uint64_t blocks) const;

    // Runs `tokens` at positions cache.size() .. cache.size() + n - 1 (one batch: prefill; one
    // token: decode), appends their keys and values to `cache`, and writes the logits of
    // tokens[logits_from ..] into `logits`: (n - logits_from) rows of vocab_size floats.
    // Throws qforge::Error for an out-of-range token id, a full cache or a wrong logits size.
    virtual void forward(std::span<const int32_t> tokens, KvCache& cache, uint64_t logits_from,
                         std::span<float> logits) = 0;

    // Several sequences in one step (continuous batching, serve/): each sequence's tokens are
    // appended to its own cache, and `logits` receives its logit_rows() rows of vocab_size floats
    // (its last token's, or every token's), sequence after sequence in batch order. Each sequence's
    // logits are bit for bit those forward() gives it alone, whatever else is in the batch. No
    // cache may appear twice. The default runs the sequences one after another through forward()
    // (runtime/batch_forward.cpp); the CPU backend runs them as one batch, reading each weight
    // matrix once per step for every row; the CUDA backend runs its single-token sequences so
    // (cuda_backend.hpp).
    virtual void forward_batch(std::span<const BatchSequence> batch, std::span<float> logits);

    // Op-level access, for tests: sets up a step of `tokens` (one internal batch at most) at
    // positions cache.size() .. as forward does, calls fn, then appends the step to the cache
    // (the keys and values fn's attention calls stored). The default throws: a backend that
    // offers no op-level access (a test double) says so.
    virtual void run_ops(std::span<const int32_t> tokens, KvCache& cache,
                         const std::function<void(OpsStep&)>& fn);

    // Values that exceeded fp16's range where the backend rounds to fp16 (the CUDA backend's
    // tensor-core activations and KV cache, the CPU's f16 KV caches) and were clamped to
    // +-65504, since it was made; a backend that keeps float32 has none. bench and ppl report it.
    virtual uint64_t fp16_saturations() const { return 0; }
};

struct CpuBackendOptions {
    // Regions with fewer multiply-adds run on the calling thread: waking the workers and meeting
    // at the barrier costs a few microseconds, about this much work. (stories260K's 64x64
    // matrices in decode fall below it; TinyLlama's never do.) Tests set 0 to split everything.
    uint64_t min_parallel_work = 32 * 1024;
    // Activations multiplied with quantized matrices: int8 blocks (integer dot products, the
    // default) or float32 (exact; for measuring the int8 cost). kernels/cpu/qdot.hpp.
    bool int8_activations = true;
    // The kernels' instruction-set level (kernels/cpu/isa.hpp); unset: cpu_isa(). The tests run
    // every level the CPU has; a level above cpu_isa() is refused.
    std::optional<Isa> isa = std::nullopt;
    // Quantized matrices repacked at load for the avx512 kernels (kernels/cpu/qpack.hpp: the
    // same bits, decode and prefill faster, the packed copies' memory besides the file's pages).
    // QFORGE_NO_REPACK=1 in the environment turns it off too (to compare the two).
    bool repack = true;
    // bf16 matrices times activations rounded to bf16 (AVX-512 BF16's vdpbf16ps,
    // kernels/cpu/bf16_gemm.hpp): inexact, faster prefill; refused on a CPU without it. Other
    // matrices are unchanged.
    bool bf16_activations = false;
    // What the caches new_cache() makes store (runtime/kv_cache.hpp): f32 (exact) or f16 (half
    // the memory and the bytes attention reads; keys and values rounded once). forward reads a
    // cache of either type, whatever this says (a serve pool's blocks have their own).
    KvType kv_type = KvType::f32;
};

// The CPU backend; `pool` (shared by every backend of a process) runs its parallel loops.
std::unique_ptr<Backend> make_cpu_backend(const Model& model, ThreadPool& pool,
                                          CpuBackendOptions options = {});

}  // namespace qforge
