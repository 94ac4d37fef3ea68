// Host-side launch decisions of the CUDA kernels: which matmul path a shape takes, how a GEMV or
// a tensor-core GEMM is tiled over the GPU, which attention shapes are supported. Plain C++, so
// the decisions are unit-tested on the CPU; the launchers only read these plans.
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/cuda/attention_limits.hpp"
#include "kernels/cuda/gpu_format.hpp"

namespace qforge::cuda {

// ---------------------------------------------------------------------------------------------
// Matmul paths: y[t][r] = W[r] . x[t] for m tokens
// ---------------------------------------------------------------------------------------------

enum class MatmulPath : uint8_t {
    gemv,  // dequant in registers, fp32 activations; m <= kGemvMaxTokens per pass, any kind
    mma,   // fused dequant + mma.sync m16n8k16 (fp16 activations, fp32 accumulation); q4/q8, sm_80+
    cublas,  // dequantize to fp16 in slabs, then cuBLAS GemmEx (fp32 accumulation); q4/q8/f16;
             // bf16 (sm_80+): slabs widened to f32 (exact), TF32 tensor cores, f32 activations
};
std::string_view matmul_path_name(MatmulPath p);

// Tokens per GEMV pass: a pass reads the weights once for up to this many tokens.
inline constexpr uint64_t kGemvMaxTokens = 8;
// Up to this many tokens the fused tensor-core kernel is chosen over dequantize + cuBLAS (it reads
// 4-bit codes, cuBLAS reads 16-bit weights that were first written out). Measured on an H200
// (qforge_cuda_bench's GEMM table, kernels/README.md): at 16 tokens mma is faster at 3 of 4 Llama
// shapes (32.9 vs 39.3 us at 4096x4096 q4_g128), at 64 slower at all 4 (63.0 vs 39.1 us).
inline constexpr uint64_t kMmaMaxTokens = 16;
// bf16 weights take cuBLAS (TF32) from this many tokens: its slab reads the bf16 rows, writes
// them as f32 and cuBLAS reads those, about 10 bytes a weight, what 5 GEMV passes of 8 tokens
// read (2 bytes a weight each). An estimate from bytes moved, not yet measured.
inline constexpr uint64_t kBf16CublasMinTokens = 40;

// The path for m tokens through a matrix of this format on a GPU of compute capability cc_major.
// `forced` (tests, benchmarks) must apply to the shape, else UnsupportedOnCuda.
//   m <= 8: gemv. f32 weights: gemv (no tensor-core path keeps them exact). bf16: cublas on
//   sm_80+ from kBf16CublasMinTokens (TF32: the weights exact, each activation rounded to TF32's
//   10-bit fraction, as fp16's), else gemv. f16: cublas. q4/q8: mma up to kMmaMaxTokens on sm_80+,
//   cublas beyond (and below sm_80).
MatmulPath choose_matmul_path(const GpuMatrixFormat& fmt, uint64_t m, int cc_major);
bool matmul_path_applies(MatmulPath p, const GpuMatrixFormat& fmt, int cc_major);

// ---------------------------------------------------------------------------------------------
// GEMV tiling
// ---------------------------------------------------------------------------------------------

// Rows per block for a weight kind: each thread loads 64 bytes of codes per chunk step (one
// 16-byte load per row for q4, two for q8, four for f16/bf16; f32 loads 128 bytes from one row).
uint32_t gemv_rows_per_block(WeightKind kind);

// A block owns `rows_per_block` rows; its `threads` split the row's chunks (chunk c goes to
// thread c % threads), then reduce through shared memory in a fixed order (deterministic, no
// atomics). `token_tile` (1, 2, 4 or 8) is the compiled token count of a pass; `passes` passes
// cover m tokens.
struct GemvPlan {
    uint32_t threads = 0;         // a multiple of 32, 32 .. 256
    uint32_t rows_per_block = 0;  // 1, 2 or 4
    uint32_t token_tile = 0;      // 1, 2, 4 or 8
    uint64_t blocks = 0;          // ceil(rows / rows_per_block)
    uint64_t passes = 0;          // ceil(m / 8) (1 when m <= 8)
    uint32_t chunk_steps = 0;     // ceil(chunks / threads): chunk iterations per thread
};
// The fewest chunk steps per thread (the threads per row shrink to match). With two, each thread
// of a 1-2 token GEMV has two chunks' loads in flight at once (the kernel's decode prefetch),
// which measured faster for q4 and q8 rows on an H200 (8B-shape decode 354 -> 387 tok/s at q4,
// 350 -> 362 at q8; kernels/README.md) and slower for f16 rows (203 -> 191); 0: that default
// per kind (q4, q8: 2 at 1-2 tokens, else 1). The benchmark compares the choices;
// QFORGE_CUDA_GEMV selects one (cuda_backend.hpp).
// `q4_rows`: rows per block of q4 rows at 1-2 tokens (2: half the registers per thread, twice
// the blocks an SM holds; 4: gemv_rows_per_block's; 0: 2 for rows of 256 chunks or more, else
// 4). ncu on the H200 found Llama's down_proj GEMV (4096 x 14336) at 98 registers a thread,
// 2 blocks of 224 threads an SM, 3.9 waves: 2 rows per block took it from 51% to 59% of copy.
// `one_token_threads`: the threads per row (and so each output's order of additions: chunks
// round-robin over them, then the fixed reduction) as a lone token's, whatever the tokens of
// the pass. A batched decode step (CudaEngine::forward_batch) sets it, so each of its rows gets
// the bits that row's decode alone gets. (The order never depends on the tokens otherwise
// either, but the default threads do: 2 chunk steps at 1-2 tokens, 1 beyond.)
struct GemvTuning {
    uint32_t min_steps = 0;
    uint32_t q4_rows = 0;
    bool one_token_threads = false;
};
GemvPlan plan_gemv(const GpuMatrixFormat& fmt, uint64_t rows, uint64_t m,
                   const GemvTuning& tuning = {});
// Parses "steps=S", "rows=R" or both, comma-separated (S 1 .. 4, R 2 or 4); false when malformed.
bool parse_gemv_tuning(std::string_view s, GemvTuning& out);
inline constexpr uint32_t kGemvMaxThreads = 256;

// ---------------------------------------------------------------------------------------------
// Fused tensor-core GEMM tiling
// ---------------------------------------------------------------------------------------------

// A block computes a 32-row x 32-token tile with 4 warps; each warp takes a contiguous quarter of
// the block's chunk range (so a group's scale is loaded and applied once per warp) and the four
// partial tiles are summed in shared memory in a fixed order. When the tiles alone do not fill the
// GPU, K is split over `splits` blocks whose partial tiles go to a workspace and are summed by a
// second kernel in split order (deterministic).
inline constexpr uint32_t kMmaTileRows = 32, kMmaTileTokens = 32, kMmaWarps = 4;
struct MmaPlan {
    uint64_t row_tiles = 0, token_tiles = 0;
    uint32_t splits = 0;            // 1: no workspace
    uint64_t chunks_per_split = 0;  // the last split may hold fewer (never zero)
    uint64_t workspace_floats = 0;  // splits * m * rows when splits > 1
};
// `sm_count`: multiprocessors of the device (the target is about 8 blocks per multiprocessor).
MmaPlan plan_mma(const GpuMatrixFormat& fmt, uint64_t rows, uint64_t m, int sm_count);

// ---------------------------------------------------------------------------------------------
// Dequantize + cuBLAS slabs
// ---------------------------------------------------------------------------------------------

// Rows per dequantized slab so a slab holds at most `scratch_halves` halves (at least 1 row;
// callers size the scratch for one full row: kpad halves, bf16's f32 rows 2 kpad).
uint64_t cublas_slab_rows(const GpuMatrixFormat& fmt, uint64_t rows, uint64_t scratch_halves);

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

// Supported: head_dim even and at most 256 (each lane of a warp holds ceil(head_dim / 32) <= 8 of
// a head's dimensions), num_heads a multiple of num_kv_heads. Any context length (an online
// softmax over the cache, no scores buffer). Throws UnsupportedOnCuda otherwise.
inline constexpr uint64_t kMaxHeadDim = 256;
void check_attention_config(uint64_t head_dim, uint64_t num_heads, uint64_t num_kv_heads);
// Dimensions per lane compiled for a head_dim: 1, 2, 4 or 8.
uint32_t attention_dims_per_lane(uint64_t head_dim);
// The split (flash-decoding) attention of decode steps (launchers.hpp: AttentionParams):
// slices of attention_split_len(capacity) positions (a multiple of 32, at least 64), at most
// kAttnMaxSplits of them; the workspace holds 4 partials (one per warp) of head_dim + 2 floats
// per slice, query head and token.
uint32_t attention_split_len(uint32_t capacity);
uint64_t attention_workspace_floats(uint32_t n, uint32_t heads, uint32_t head_dim);
// Its merge counters: one per token and KV head (per tile of 8 query heads).
inline uint64_t attention_counters(uint32_t n, uint32_t heads, uint32_t kv_heads) {
    const uint32_t group = heads / kv_heads;
    return uint64_t{n} * kv_heads * (group <= 8 ? 1 : (group + 7) / 8);
}

}  // namespace qforge::cuda
