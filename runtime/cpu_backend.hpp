// The CPU backend: float32 compute on f32/f16/bf16 weights read in place, with the persistent
// thread pool.
//
// The forward pass is runtime/transformer.hpp's; this backend implements its operations.
// Parallel regions per layer: RMSNorm (tokens), the fused q/k/v projection, RoPE+cache writes
// (tokens),
// attention ((token, KV head) pairs), the output projection, the fused gate/up projection with
// SwiGLU, the down projection. Matrix rows are split over threads; every output element is
// computed by one thread with one dot product in a fixed order (kernels/cpu/float_dot.hpp), and
// nothing is reduced across threads, so logits are bit-identical for any thread count. Prefill
// and decode run the same dot products on the same inputs, so a prompt run as one batch and the
// same prompt run token by token give the same logits too.
//
// Prefill tiles over tokens: each block of float weight rows is widened to f32 once per block of
// tokens and reused for all of them; quantized matrices go through the dequant-fused kernels
// (kernels/cpu/qdot.hpp), which tile over tokens themselves, with the input prepared once per
// projection (int8 blocks by default). Regions below CpuBackendOptions::min_parallel_work run on
// the calling thread. See runtime/README.md.
#pragma once

#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/float_gemm.hpp"
#include "kernels/cpu/qdot.hpp"
#include "kernels/cpu/qpack.hpp"
#include "runtime/backend.hpp"
#include "runtime/rope.hpp"
#include "runtime/thread_pool.hpp"
#include "runtime/transformer.hpp"

namespace qforge {

class CpuBackend final : public Backend, private ForwardOps {
  public:
    CpuBackend(const Model& model, ThreadPool& pool, CpuBackendOptions options = {});

    std::string_view name() const override { return "cpu"; }
    const Model& model() const override { return model_; }
    std::unique_ptr<KvCache> new_cache(uint64_t capacity) const override;
    // A KvBlockPool of the backend's KV type, its caches PagedKvCache (paged_kv_cache.hpp).
    std::unique_ptr<KvPool> new_kv_pool(uint64_t blocks) const override;
    void forward(std::span<const int32_t> tokens, KvCache& cache, uint64_t logits_from,
                 std::span<float> logits) override;
    void run_ops(std::span<const int32_t> tokens, KvCache& cache,
                 const std::function<void(OpsStep&)>& fn) override;
    // At most kMaxBatch tokens in all (runtime/batch_forward.cpp).
    void forward_batch(std::span<const BatchSequence> batch, std::span<float> logits) override;
    // Keys and values an f16 cache (KvType::f16) clamped to +-65504, since the backend was made.
    uint64_t fp16_saturations() const override {
        return fp16_saturations_.load(std::memory_order_relaxed);
    }

    // Tokens per internal step of a long batch (bounds the activation buffers).
    static constexpr uint64_t kMaxBatch = 256;

  private:
    // ForwardOps (runtime/transformer.hpp), on the current step's cache_ and pos0_.
    void embed(const int32_t* tokens, uint64_t n, Rows out) override;
    void norm(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) override;
    void norm_add(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) override;
    void scale(Rows rows, uint64_t n, uint64_t width, float s) override;
    void softcap(Rows rows, uint64_t n, uint64_t width, float cap) override;
    // out (=, or += when accumulate) norm(in) * weight.
    void rms_norm(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n, bool accumulate);
    void products(uint64_t layer, Rows in, std::span<const Product> products, uint64_t n) override;
    void attention(uint64_t layer, Rows q, Rows k, Rows v, Rows out, uint64_t n) override;
    void gated_products(uint64_t layer, Rows in, Activation act, Rows out, uint64_t n) override;
    // A run of a step's rows that belong to one sequence: `rows` rows from `row0`, at positions
    // pos0 .. of `cache`.
    struct BatchSegment {
        uint64_t row0;
        uint64_t rows;
        CpuKvCache* cache;
        uint64_t pos0;
    };
    // Attention of every segment's rows against its own cache, as two parallel regions for the
    // whole step whatever the number of sequences: RoPE and cache writes per token, then one
    // task per (token, KV head). attention() (runtime/batch_forward.cpp) calls it with one
    // segment (cache_ at pos0_) or with a batched step's segments_.
    void attend(uint64_t layer, Rows q, Rows k, Rows v, Rows out,
                std::span<const BatchSegment> segments);

    // Sizes the RoPE table, scratch and activation buffers for a step of up to `batch` tokens
    // in a cache of `capacity` positions; the step's rows.
    BlockActivations prepare_step(uint64_t capacity, uint64_t batch);
    // Prepares acts_ from x ([n][k]) when any of `matrices` is quantized, float_tokens_ when any
    // is a float matrix and n > 1.
    void prepare_activations(std::span<const Matrix* const> matrices, const float* x, uint64_t n);
    // w's product over an input of its own: x gathered by w.col_perm where w has one (into
    // gathered_), prepared, then rows [0, w.rows) into y. Only the products of a layer with a
    // column permutation (act-order imports) take this path; the rest share prepared inputs.
    void own_product(const Matrix& w, const float* x, uint64_t n, float* y, uint64_t ldy,
                     const float* bias, bool accumulate);
    // y[t * ldy + r] (=, or += when accumulate) W[r] . x[t * w.cols] (+ bias[r]) for rows
    // [r0, r1) and tokens [0, n): activations are packed with the matrix's input width; quantized
    // matrices read them from acts_ (prepare_activations).
    void rows_times_tokens(const Matrix& w, uint64_t r0, uint64_t r1, const float* x, uint64_t n,
                           float* y, uint64_t ldy, const float* bias, bool accumulate,
                           float* scratch);
    template <class F>
    void for_tokens(uint64_t n, F&& fn);
    // Parts of a parallel region per thread, each claimed by whichever thread is free
    // (ThreadPool::run_chunks), so a thread the OS set aside on a loaded machine leaves its parts
    // to the others. Matrix rows all cost the same: one contiguous part per thread, each
    // streaming its rows in one run. Four parts per thread made SmolLM2-135M decode slower (every
    // claim and completion moves a cache line between cores, and each part restarts the row
    // stream; runtime/README.md "Threading"). Attention tasks grow with their position (causal
    // prefill), so their regions keep four parts per thread to balance.
    static constexpr size_t kRowPartsPerThread = 1;
    static constexpr size_t kAttentionPartsPerThread = 4;
    // fn(begin, end, thread) over parts of [0, n) on the pool (parts_per_thread for each thread,
    // each a whole number of `grain` items but the last), or all of it on the calling thread when
    // `work` (multiply-adds) is too small to pay for waking the workers.
    template <class F>
    void split(uint64_t n, uint64_t work, F&& fn, uint64_t grain = 1,
               size_t parts_per_thread = kRowPartsPerThread);

    // Repacks every quantized layer matrix and the LM head that the level has a packed kernel
    // for (options_.repack) into packed_, and with options_.bf16_activations every bf16 one
    // into bf16_packed_.
    void pack_matrices();
    // w's packed rows, or null.
    const QPackedRows* packed(const Matrix& w) const;
    const Bf16PackedRows* bf16_packed(const Matrix& w) const;

    const Model& model_;
    const ModelConfig& c_;
    const BlockDesc desc_;
    ThreadPool& pool_;
    CpuBackendOptions options_;
    Isa isa_;               // the kernels' level: options_.isa or cpu_isa()
    RopeTable rope_;        // grown to the largest cache made
    RopeTable rope_local_;  // the sliding layers' (ModelConfig::local_rope), when they differ
    uint64_t rope_positions_ = 0;
    CpuKvCache* cache_ = nullptr;         // the cache of the step being run
    uint64_t pos0_ = 0;                   // the position of its first token
    std::vector<BatchSegment> segments_;  // a batched step's sequences (empty otherwise)

    // Activations for up to kMaxBatch tokens, row-major [token][...].
    std::vector<float> x_, h_, qkv_, att_, gate_, up_;
    std::vector<float> gathered_;  // permuted_product's input, gathered by a column permutation
    QActivations acts_;            // the current product input, prepared for quantized matrices
    FloatTokens float_tokens_;     // and for float matrices (prefill)
    std::unordered_map<const Matrix*, QPackedRows> packed_;  // pack_matrices
    // options_.bf16_activations: the bf16 matrices packed, and the product input rounded.
    std::unordered_map<const Matrix*, Bf16PackedRows> bf16_packed_;
    // Float matrices of 2 MiB or more (options_.repack) copied at load into memory advised for
    // huge pages, their file pages dropped: the same bytes, one TLB entry per 2 MiB (a file
    // mapping takes 4 KiB pages). TinyLlama-shape f16 decode, Zen 4: 13.0 -> 14.8-15.3 tok/s.
    std::unordered_map<const Matrix*, AlignedBytes> float_rows_;
    // w's rows: float_rows_'s copy, or the model's.
    const uint8_t* rows_of(const Matrix& w) const;
    Bf16Tokens bf16_tokens_;
    // Per thread: weight rows widened to f32, and attention scores.
    std::vector<std::vector<float>> row_scratch_, score_scratch_;
    std::atomic<uint64_t> fp16_saturations_{0};  // f16 caches' clamped keys and values
};

}  // namespace qforge
