// The CUDA backend: the forward pass of backend.hpp on one GPU, with the kernels of
// kernels/cuda/. Weights are uploaded once in their packed form (float rows repacked to whole
// 32-weight chunks, kernels/cuda/gpu_format.hpp); activations and the residual stream are fp32;
// the KV cache is fp16; single-token decode replays a CUDA graph captured on first use, so
// launch overhead does not dominate small models.
//
// Precision against the CPU backend: decode products (GEMV, up to 8 tokens) of quantized weights
// take int8 activation blocks by default, the CPU backend's default blocks and formula
// (int8_activations; false: exact dequantized weights times fp32 activations, as the CPU's
// --float-activations); float weights always take fp32 activations. Batched products of more
// than 8 tokens round the activations to fp16 for the tensor cores (and f16 / cuBLAS-path
// weights are fp16; bf16 weights, from 40 tokens, stay exact on TF32 tensor cores, their
// activations rounded to TF32's 10-bit fraction, sm_80+), and keys and values are stored in
// fp16. Logits agree with the float64
// reference within bounds derived from those roundings (tests/cuda_backend_test.cpp).
// Every architecture of the table runs, Gemma 2 and 3 too (post-norms, embedding scale, GeGLU,
// soft-caps, the sliding layers' RoPE table); their large activations are where fp16 rounding
// would clamp first, which fp16_saturations() counts.
//
// Built without CUDA, the constructors throw qforge::Error saying so; backend_factory.hpp picks
// the CPU then.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/plans.hpp"
#include "runtime/backend.hpp"

namespace qforge {

struct CudaBackendOptions {
    int device = 0;
    bool use_graphs = true;    // single-token decode replays a captured CUDA graph
    uint64_t max_batch = 512;  // tokens per internal step of a long batch (bounds activations)
    // Tests and benchmarks: run every product through this path (kernels/cuda/plans.hpp).
    std::optional<cuda::MatmulPath> forced_path;
    // Products of up to 8 tokens through quantized weights take int8 activation blocks, as the
    // CPU backend's default (kernels/cuda/gemv.cuh); false: float32 activations, exact products.
    bool int8_activations = true;
    // q, k, v (and gate, up) multiplied as one matrix in one launch when their formats agree,
    // and RMSNorm and SwiGLU writing the next GEMV's int8 blocks with their output (false: a
    // launch per matrix and per preparation, as before; the results are the same bits).
    bool fuse_products = true;
    // On sm_90+, each GEMV starts loading its weights while the kernel before it finishes
    // (programmatic dependent launch, kernels/cuda/pdl.cuh); false: strictly one after another.
    bool overlap_launches = true;
    // Attention of up to 8 tokens (decode) in caches of at least this many positions takes the
    // split form: slices of the cache on many blocks, each KV head read once for its query
    // heads, the last block merging them (kernels/cuda/launchers.hpp: AttentionParams::
    // split_len); below it, one block per (token, query head). On an H200 (Llama-3-8B shapes)
    // the split form decoded 7.4x faster at position 4096 and 5% slower over a 73-position
    // cache (kernels/README.md); 256 sits between the two measurements. 0: always split.
    uint64_t split_attention_from = 256;
    // GEMV tiling (kernels/cuda/plans.hpp); unset: the environment's QFORGE_CUDA_GEMV
    // ("steps=2"), else plans.hpp's default.
    std::optional<cuda::GemvTuning> gemv;
};

class CudaEngine;  // the device-side model and forward pass (cuda_backend.cpp)

class CudaBackend final : public Backend {
  public:
    // Uploads the model's weights. Throws qforge::Error without CUDA or device, and
    // cuda::UnsupportedOnCuda for a qtype or shape the kernels do not run.
    CudaBackend(const Model& model, CudaBackendOptions options = {});
    ~CudaBackend() override;

    std::string_view name() const override { return "cuda"; }
    const Model& model() const override { return model_; }
    std::unique_ptr<KvCache> new_cache(uint64_t capacity) const override;
    // Blocks in one device allocation; its caches are read through their block tables
    // (kernels/cuda/kv_layout.hpp) by forward and forward_batch (not greedy_decode, run_ops).
    std::unique_ptr<KvPool> new_kv_pool(uint64_t blocks) const override;
    void forward(std::span<const int32_t> tokens, KvCache& cache, uint64_t logits_from,
                 std::span<float> logits) override;
    // Sequences of one token (decode) as one batched step per cache capacity: every weight read
    // once for all of them, each row's logits the bits forward() gives it alone (GEMV products
    // with one token's threads, attention through each row's own cache); a sequence of several
    // tokens runs through forward() on its own (cuda_engine.hpp).
    void forward_batch(std::span<const BatchSequence> batch, std::span<float> logits) override;
    void run_ops(std::span<const int32_t> tokens, KvCache& cache,
                 const std::function<void(OpsStep&)>& fn) override;
    uint64_t fp16_saturations() const override;

    // Greedy decoding without a host round trip per token: runs `first` at cache.size(), then
    // feeds each argmax (lowest index on ties) back, `steps` tokens in all; returns the chosen
    // tokens. One CUDA graph per step: forward, argmax, bookkeeping.
    std::vector<int32_t> greedy_decode(KvCache& cache, int32_t first, uint64_t steps);

    // "NVIDIA H200 (sm_90, 132 SMs)".
    std::string device_description() const;

  private:
    const Model& model_;
    std::unique_ptr<CudaEngine> engine_;
};

std::unique_ptr<Backend> make_cuda_backend(const Model& model, CudaBackendOptions options = {});

// A model at `config`'s shapes whose weights are generated on the device (every matrix in
// `qtype`, norms 1): for benchmarks of shapes too large to write to disk, e.g. Llama-3-8B.
class CudaSyntheticModel {
  public:
    CudaSyntheticModel(const ModelConfig& config, QType qtype, uint64_t seed,
                       CudaBackendOptions options = {});
    ~CudaSyntheticModel();

    // Bytes of weights one decode step reads (every layer matrix and the LM head).
    uint64_t decode_weight_bytes() const;
    // Device memory the weights occupy.
    uint64_t weight_bytes() const;

    struct DecodeTiming {
        uint64_t steps = 0;
        double seconds = 0.0;
        double tokens_per_s = 0.0;
    };
    // Greedy decode from position `from` (after a prefill of that many tokens): `warmup`
    // untimed steps, then `steps` timed ones (CUDA events around graph replays).
    DecodeTiming time_greedy_decode(uint64_t warmup, uint64_t steps, uint64_t from = 0);
    // Batched decode (forward_batch, as `qforge serve` steps): `batch` sequences of one token
    // each per step, every sequence at position `from` first (after a prefill of that many
    // tokens), `warmup` untimed steps, then `steps` timed ones (host clock, each step's logits
    // copied to the host as serving needs them): tokens per second over all sequences.
    DecodeTiming time_batched_decode(uint64_t batch, uint64_t warmup, uint64_t steps,
                                     uint64_t from = 0);
    // Prefill of `tokens` tokens from position 0 (the last one's logits to the host), one
    // untimed run, then the best of `reps` timed ones (host clock: the forward waits for its
    // logits): tokens per second. The options' max_batch bounds the internal step.
    double time_prefill(uint64_t tokens, int reps);

  private:
    std::unique_ptr<CudaEngine> engine_;
};

}  // namespace qforge
