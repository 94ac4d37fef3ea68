// The CUDA backend's engine (private to runtime/cuda_*.cpp): the device-side model, the KV
// cache on the device, and the forward pass's operations (runtime/transformer.hpp) as launches
// on one stream. cuda_engine.cpp: set-up, weights and buffers; cuda_forward.cpp: the
// operations, CUDA graphs, forward and greedy decoding; cuda_backend.cpp: the Backend.
#pragma once

#ifdef QFORGE_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "core/checked_math.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/launchers.hpp"
#include "kernels/cuda/matmul.hpp"
#include "runtime/rope.hpp"

#include "core/error.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/paged_kv_cache.hpp"
#include "runtime/transformer.hpp"

namespace qforge {

using cuda::DeviceBuffer;
using cuda::DeviceMatrix;

inline uint32_t u32(uint64_t v) { return static_cast<uint32_t>(v); }
inline uint64_t pad32(uint64_t v) { return round_up(v, 32); }

class CudaKvPool;

// Device memory, fp16 (kernels/cuda/kv_layout.hpp). Contiguous: the cache's own allocation, per
// layer keys then values, each [capacity][kv_dim]; `id` keys the CUDA
// graphs captured against its buffers. Paged: blocks of a CudaKvPool (serve), its block table on
// the host, uploaded with each step's rows (CudaEngine: cache_rows_, tables_); no graphs.
class CudaKvCache final : public KvCache {
  public:
    CudaKvCache(const ModelConfig& c, uint64_t capacity, uint64_t id)
        : KvCache(capacity), kv_dim_(c.kv_dim()), id_(id) {
        const uint64_t dims[] = {c.num_layers, 2, capacity, kv_dim_};
        auto n = checked_product(dims);
        if (!n || *n > (uint64_t{1} << 40))
            throw Error("KV cache of " + std::to_string(capacity) + " positions is too large");
        data_ = DeviceBuffer<uint16_t>(*n);
    }
    // Paged: `blocks` (taken from `pool`) hold at least `capacity` positions.
    CudaKvCache(CudaKvPool& pool, std::vector<uint32_t> blocks, uint64_t capacity);
    ~CudaKvCache() override;
    CudaKvCache(const CudaKvCache&) = delete;
    CudaKvCache& operator=(const CudaKvCache&) = delete;

    bool paged() const { return pool_ != nullptr; }
    // Contiguous caches only.
    uint16_t* keys(uint64_t layer) const { return data_.get() + (layer * 2) * capacity_ * kv_dim_; }
    uint16_t* values(uint64_t layer) const {
        return data_.get() + (layer * 2 + 1) * capacity_ * kv_dim_;
    }
    uint64_t id() const { return id_; }
    // Halves from one layer's keys (values) to the next layer's.
    uint64_t layer_stride() const { return 2 * capacity_ * kv_dim_; }
    void set_size(uint64_t n) { size_ = n; }
    // Paged caches: the pool's ids of its blocks, in position order.
    const std::vector<uint32_t>& blocks() const { return blocks_; }
    // A step row at position `pos` of this cache; a paged cache's with its block table at the
    // device address `table`.
    cuda::CacheRow row(uint64_t pos, const uint32_t* table) const;
    // Paged caches: whether its pool's blocks have the layout of `c`'s layers (a pool made by
    // a backend of another model would be read out of its bounds).
    bool fits(const ModelConfig& c) const;

  private:
    friend class CudaKvPool;  // take() gives a cache its blocks once it exists

    uint64_t kv_dim_;
    uint64_t id_;
    DeviceBuffer<uint16_t> data_;
    CudaKvPool* pool_ = nullptr;
    std::vector<uint32_t> blocks_;
};

// The CUDA backend's Backend::new_kv_pool: `blocks` blocks of CpuKvCache::kBlockPositions
// positions in one device allocation (kv_layout.hpp's paged layout), their ids on the host.
class CudaKvPool final : public KvPool {
  public:
    CudaKvPool(const ModelConfig& c, uint64_t blocks);
    std::unique_ptr<KvCache> take(uint64_t positions) override;
    uint64_t free_blocks() const override { return ids_.free(); }
    uint64_t total_blocks() const override { return ids_.total(); }

    uint16_t* data() const { return data_.get(); }
    uint64_t block_halves() const { return block_halves_; }
    const ModelConfig& config() const { return c_; }

  private:
    friend class CudaKvCache;
    // A cache's blocks back (its destructor).
    void give_back(std::span<const uint32_t> ids) noexcept { ids_.give_back(ids); }

    ModelConfig c_;
    uint64_t block_halves_;
    DeviceBuffer<uint16_t> data_;
    BlockIds ids_;
};

inline CudaKvCache& cuda_cache(KvCache& cache) {
    auto* c = dynamic_cast<CudaKvCache*>(&cache);
    if (!c) throw Error("cuda backend: the KV cache was made by another backend");
    return *c;
}

class CudaEngine final : private ForwardOps {
  public:
    CudaEngine(const ModelConfig& config, std::string path, CudaBackendOptions options);
    ~CudaEngine();
    CudaEngine(const CudaEngine&) = delete;
    CudaEngine& operator=(const CudaEngine&) = delete;

    void upload(const Model& model);
    void randomize(QType qtype, uint64_t seed);

    std::unique_ptr<KvCache> new_cache(uint64_t capacity);
    std::unique_ptr<KvPool> new_kv_pool(uint64_t blocks) const;
    void forward(std::span<const int32_t> tokens, CudaKvCache& cache, uint64_t logits_from,
                 std::span<float> logits);
    // Backend::forward_batch (backend.hpp): every sequence of one token runs with the others
    // whose caches take the same attention form as one batched step (each weight matrix read once
    // for all of them; attention through each row's own cache, launchers.hpp: CacheRow), the
    // products on the GEMV with one token's threads, so each row's logits are the bits its
    // forward() alone gives; a sequence of several tokens (a prompt) runs through forward() on its
    // own.
    void forward_batch(std::span<const BatchSequence> batch, std::span<float> logits);
    // Backend::run_ops: one step of tokens with op-level access (backend.hpp).
    void run_ops(std::span<const int32_t> tokens, CudaKvCache& cache,
                 const std::function<void(OpsStep&)>& fn);
    // Greedy steps on the device; `seconds` (if given) times the steps after `warmup` of them.
    std::vector<int32_t> greedy(CudaKvCache& cache, int32_t first, uint64_t steps,
                                uint64_t warmup = 0, double* seconds = nullptr);

    uint64_t decode_weight_bytes() const;
    // Values clamped to +-65504 when rounded to fp16 (f16_saturate.cuh), since construction.
    uint64_t fp16_saturations() const;
    uint64_t weight_bytes() const { return weight_bytes_; }
    uint64_t vocab_size() const { return c_.vocab_size; }
    std::string description() const { return description_; }

  private:
    struct Layer {
        DeviceMatrix q, k, v, o, gate, up, down;
        // q, k, v (and gate, up) as one matrix when their GPU formats are equal: the single
        // matrices are then views of its rows, and a step multiplies the group in one launch
        // (data null when the formats differ).
        DeviceMatrix qkv, gate_up;
        const float* attn_norm = nullptr;
        const float* mlp_norm = nullptr;
        const float* q_norm = nullptr;  // QK-norm architectures only
        const float* k_norm = nullptr;
        const float* attn_post_norm = nullptr;  // sandwich-norm architectures only (Gemma)
        const float* mlp_post_norm = nullptr;
        const float* qkv_bias = nullptr;  // q's, k's and v's biases, in that order
    };
    enum class Graph : int { decode_no_logits, decode_logits, greedy };

    // ForwardOps (runtime/transformer.hpp), enqueued on stream_ for the step's cache_: token ids
    // and the first position are read on the device (step_), so a graph replays for any step.
    void embed(const int32_t* tokens, uint64_t n, Rows out) override;
    void norm(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) override;
    // Gemma's: the post-norm's residual add, the embedding scale, the final logit soft-cap.
    void norm_add(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) override;
    void scale(Rows rows, uint64_t n, uint64_t width, float s) override;
    void softcap(Rows rows, uint64_t n, uint64_t width, float cap) override;
    void products(uint64_t layer, Rows in, std::span<const Product> products, uint64_t n) override;
    void attention(uint64_t layer, Rows q, Rows k, Rows v, Rows out, uint64_t n) override;
    void gated_products(uint64_t layer, Rows in, Activation act, Rows out, uint64_t n) override;
    const DeviceMatrix& weight(uint64_t layer, Weight w) const;
    // The matrix a norm's output is multiplied with next (attn: q|k|v, mlp: gate|up, final: the
    // head; none for the others).
    const DeviceMatrix* norm_consumer(uint64_t layer, Norm which) const;
    // Where a producer of n rows writes the int8 blocks for a GEMV of `consumer` (the matmul
    // scratch), or null when that GEMV takes no int8 blocks or the fusion is off.
    const cuda::Int8Rows* fused_int8(const DeviceMatrix* consumer, uint64_t n,
                                     cuda::Int8Rows& q) const;
    const float* norm_weight(uint64_t layer, Norm which) const;  // throws when not uploaded

    DeviceMatrix upload_matrix(const Matrix& m);
    // The matrices as views of one allocation when their GPU formats are equal (returned as the
    // fused matrix, else one with null data, each then uploaded on its own).
    DeviceMatrix upload_group(std::span<const Matrix* const> ms, std::span<DeviceMatrix> out);
    DeviceMatrix random_matrix(QType qtype, uint64_t rows, uint64_t cols, uint64_t seed);
    // Random matrices of `rows` rows each, as views of one allocation (returned fused).
    DeviceMatrix random_group(QType qtype, std::span<const uint64_t> rows, uint64_t cols,
                              uint64_t& seed, std::span<DeviceMatrix> out);
    void upload_rows(const Matrix& m, const DeviceMatrix& d, DeviceBuffer<uint8_t>& buf,
                     uint64_t offset);
    const float* upload_vector(const std::vector<float>& v);
    void allocate_activations();
    void ensure_rope(uint64_t positions);
    void check_tokens(std::span<const int32_t> tokens) const;
    // The device-side position bound (kernels/cuda/launchers.hpp, kFaultPosition): the fault
    // word's copy to the host is enqueued before a step's synchronize, and check_fault, after
    // it, throws (clearing the word) if a kernel met a position outside `cache`.
    void enqueue_fault_copy();
    void check_fault(const CudaKvCache& cache);
    void check_fault(const std::string& bound);  // `bound`: what the positions lie outside
    // The activation rows of a step ([q | k | v] in one buffer, as attention needs).
    BlockActivations step_rows() const;
    // Copies tokens (at most batch_) and their first position into step_ for the kernels.
    void upload_step(const int32_t* tokens, uint64_t m, uint64_t pos0);
    // A step whose rows each name their cache: row i at position pos[i] of *caches[i] (a paged
    // cache's block table copied once into tables_ however many rows it has) into cache_rows_,
    // and batch_rows_ pointed at them; batch_capacity_ the largest capacity.
    void upload_rows(std::span<const CudaKvCache* const> caches, std::span<const uint64_t> pos);
    // One batched step of single-token sequences of one attention form (forward_batch): their
    // logits rows to out[slot[i]] (slot -1: none wanted).
    void batched_step(std::span<const BatchSequence* const> seqs, std::span<const int64_t> slots,
                      std::span<float> out);
    // Enqueues one step of m tokens; logits of rows [lf, m) go to logits_ (none when lf == m).
    void enqueue(uint64_t m, const CudaKvCache& cache, uint64_t lf);
    void enqueue_greedy_step(const CudaKvCache& cache);
    void mm(const DeviceMatrix& w, const float* x, uint64_t ldx, uint64_t m, float* y, uint64_t ldo,
            const float* bias, bool accumulate);
    void launch_graph(const CudaKvCache& cache, Graph kind);
    void clear_graphs();

    ModelConfig c_;
    BlockDesc desc_;
    std::string path_;
    CudaBackendOptions o_;
    const CudaKvCache* cache_ = nullptr;  // the cache of the step being enqueued
    // A batched step being enqueued: its rows' caches and positions (device, one per row) and
    // the largest of their capacities; null otherwise.
    const cuda::CacheRow* batch_rows_ = nullptr;
    uint64_t batch_capacity_ = 0;
    // A batched decode step (batched_step): attention launches of at most kGemvMaxTokens rows,
    // so each row takes the form its decode alone takes. A paged cache's prompt (forward) runs
    // its rows in one launch, as a contiguous cache's does.
    bool decode_rows_ = false;
    std::string description_;
    int cc_major_ = 0, sm_count_ = 1;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    DeviceBuffer<uint8_t> cublas_workspace_;

    std::vector<DeviceBuffer<uint8_t>> weights_;  // every matrix
    std::vector<DeviceBuffer<float>> vectors_;    // norms and biases
    uint64_t weight_bytes_ = 0;
    DeviceMatrix embed_, lm_head_;
    std::vector<Layer> layers_;
    const float* final_norm_ = nullptr;

    uint64_t batch_ = 0, ld_d_ = 0, ld_qkv_ = 0, ld_q_ = 0, ld_i_ = 0, ld_gu_ = 0;
    uint32_t dims_per_lane_ = 1;
    DeviceBuffer<float> x_, h_, qkv_, att_, gate_, gate_up_, logits_;
    DeviceBuffer<uint8_t> argmax_scratch_;
    DeviceBuffer<float> attention_ws_;           // the split attention's partials (decode steps)
    DeviceBuffer<unsigned> attention_counters_;  // and its merge counters (kept zeroed)
    DeviceBuffer<uint16_t> x16_, w16_;
    DeviceBuffer<float> workspace_;
    DeviceBuffer<int32_t> step_;                 // [0] position of token 0, [1 ..] token ids
    DeviceBuffer<int32_t> history_;              // greedy: the token chosen after each position
    int32_t* staging_ = nullptr;                 // pinned host copy of step_
    DeviceBuffer<cuda::CacheRow> cache_rows_;    // a batched step's rows (batch_rows_)
    cuda::CacheRow* cache_rows_host_ = nullptr;  // pinned host copy
    DeviceBuffer<uint32_t> tables_;              // the paged caches' block tables of a step
    uint32_t* tables_host_ = nullptr;            // pinned host copy
    uint64_t tables_size_ = 0;                   // entries each holds
    DeviceBuffer<int32_t> fault_;    // kFaultPosition when a kernel met a position out of range
    int32_t* fault_host_ = nullptr;  // pinned host copy of fault_
    DeviceBuffer<unsigned long long> saturated_;  // fp16 saturations (f16_saturate.cuh)
    DeviceBuffer<float> cos_, sin_;
    DeviceBuffer<float> cos_local_, sin_local_;  // the sliding layers' (ModelConfig::local_rope)
    uint64_t rope_positions_ = 0;
    cuda::MatmulContext mctx_;
    std::map<std::pair<uint64_t, int>, cudaGraphExec_t> graphs_;
    uint64_t next_cache_id_ = 1;
};

}  // namespace qforge

#endif  // QFORGE_HAVE_CUDA
