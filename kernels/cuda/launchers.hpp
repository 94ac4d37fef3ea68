// The boundary between the C++20 host code and the CUDA translation units (C++17): plain
// parameter structs and one launch function per kernel family. Callers build the parameters from
// the validated formats and plans (matmul.cpp, the backend); the launchers check every launch.
// Pointers are device pointers; fp16 buffers are uint16_t here (bits of IEEE binary16).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/attention_limits.hpp"
#include "kernels/cuda/kv_layout.hpp"
#include "kernels/cuda/weight_kind.hpp"

namespace qforge::cuda {

// How to read the rows of a weight matrix (gpu_format.hpp's layout).
struct RowsParams {
    const uint8_t* w = nullptr;
    uint64_t row_bytes = 0;
    uint32_t rows = 0;
    uint32_t chunks = 0;            // 32-weight chunks per row
    uint32_t chunks_per_group = 1;  // quantized: chunks sharing one scale
    uint32_t scales_offset = 0;     // quantized: bytes into the row
    uint32_t zeros_offset = 0;
    int32_t zero = 0;       // symmetric: the implicit zero code
    int32_t has_zeros = 0;  // asymmetric: a stored zero per group
    WeightKind kind = WeightKind::f32;
    // Super rows (gpu_format.hpp): f32 scales at scales_offset and f32 mins here, one per
    // 32-weight group, w = scale * code - min; 0 for every other layout.
    uint32_t mins_offset = 0;
};

// Where a product goes: y[t * ldo + r] (=, or += when accumulate) value (+ bias[r]).
struct OutParams {
    float* y = nullptr;
    uint64_t ldo = 0;
    const float* bias = nullptr;
    int32_t accumulate = 0;
};

// ---- GEMV (gemv_q4.cu, gemv_q8.cu, gemv_float.cu) -------------------------------------------
// x is the activations chunk-interleaved (interleave_chunks_launch): token t's float4 j (0..7)
// of chunk c at xi[t * ldx + 4 * (j * chunks + c)], so the threads that walk consecutive chunks
// read consecutive 16 bytes (coalesced: the row-major x put each thread's 128 bytes at a stride
// of 128, and the L1 bandwidth that cost capped every GEMV at a third of the device's).
// int8 activations (q4/q8 rows, when xq is set; quantize_chunks_launch): per token and chunk the
// CPU's int8 block (kernels/cpu/qdot.hpp: d = amax / 127, codes round(x / d), their sum), codes
// interleaved as two 16-byte halves: half h of chunk c of token t at xq[(2t + h) * chunks + c];
// d and the sum at xd / xs[t * chunks + c]. A chunk's product is then an exact integer dot product
// (dp4a) scaled once: acc += (scale * d) * (isum - zero * sum), the CPU's int8 formula.
struct GemvParams {
    RowsParams w;
    const float* x = nullptr;  // m tokens, chunk-interleaved, stride ldx (>= chunks * 32)
    uint64_t ldx = 0;
    const uint4* xq = nullptr;  // int8 mode: codes (x unused)
    const float* xd = nullptr;
    const int32_t* xs = nullptr;
    uint32_t m = 0;  // tokens in this pass, <= token_tile
    OutParams out;
    // Launched to overlap the kernel before it (sm_90+: pdl.cuh): its first weight loads start
    // while that one finishes.
    int32_t overlap = 0;
};
// Where a producer writes the GEMV's int8 activation blocks (GemvParams' xq, xd, xs) for rows
// of `chunks` chunks: the fused preparations of rms_norm_launch and swiglu_launch.
struct Int8Rows {
    uint4* xq = nullptr;
    float* xd = nullptr;
    int32_t* xs = nullptr;
    uint32_t chunks = 0;
};
// Whether the GEMV was compiled with pdl.cuh's instructions for this GPU (PTX of sm_90 or newer):
// GemvParams::overlap is allowed only then.
bool gemv_overlap_compiled();
// rows_per_block: plans.hpp's GemvPlan (q4: 4, or 2 at 1-2 tokens; q8: 2).
void gemv_q4_launch(const GemvParams& p, uint32_t threads, uint32_t token_tile, uint64_t blocks,
                    uint32_t rows_per_block, cudaStream_t stream);
void gemv_q8_launch(const GemvParams& p, uint32_t threads, uint32_t token_tile, uint64_t blocks,
                    uint32_t rows_per_block, cudaStream_t stream);
void gemv_float_launch(const GemvParams& p, uint32_t threads, uint32_t token_tile, uint64_t blocks,
                       cudaStream_t stream);

// ---- Fused tensor-core GEMM (gemm_mma.cu) ---------------------------------------------------
struct MmaParams {
    RowsParams w;                   // q4 or q8
    const uint16_t* x16 = nullptr;  // round_up(m, 32) rows of ldx16 halves
    uint64_t ldx16 = 0;
    uint32_t m = 0;
    uint32_t chunks_per_split = 0;
    uint32_t splits = 1;
    float* workspace = nullptr;  // splits > 1: [split][m][rows]
    OutParams out;
};
void mma_gemm_launch(const MmaParams& p, uint32_t row_tiles, uint32_t token_tiles,
                     cudaStream_t stream);

// ---- Dequantize to fp16 (dequant_f16.cu) ----------------------------------------------------
// Rows [r0, r0 + n) of a quantized matrix into n rows of chunks * 32 halves.
void dequantize_f16_launch(const RowsParams& w, uint32_t r0, uint32_t n, uint16_t* out,
                           cudaStream_t stream);

// ---- Elementwise (elementwise.cu) -----------------------------------------------------------
// x[t][0 .. k) (stride ldx) to fp16 rows of ldx16; zero past k and for rows m .. m_pad. Values
// beyond fp16's range saturate and are added to *saturated (f16_saturate.cuh; null: not counted).
void f32_to_f16_rows_launch(const float* x, uint64_t ldx, uint32_t m, uint32_t m_pad, uint32_t k,
                            uint16_t* x16, uint64_t ldx16, unsigned long long* saturated,
                            cudaStream_t stream);
// n rows of bf16 weights (kpad halves each, rows ldw halves apart) as f32 rows of kpad floats,
// packed: exact (the cuBLAS path's slab for bf16 weights, matmul.cpp).
void bf16_rows_to_f32_launch(const uint16_t* w, uint64_t ldw, uint32_t n, uint32_t kpad, float* out,
                             cudaStream_t stream);
// xi[t * chunks * 32 + 4 * (j * chunks + c) + e] = x[t * ldx + 32 * c + 4 * j + e] for t < m,
// c < chunks, j < 8, e < 4: the GEMV's activation layout (GemvParams). x 16-byte aligned,
// ldx a multiple of 4 and at least chunks * 32.
void interleave_chunks_launch(const float* x, uint64_t ldx, uint32_t m, uint32_t chunks, float* xi,
                              cudaStream_t stream);
// The GEMV's int8 activations (GemvParams) of m tokens of x (chunks * 32 floats each, padding
// included, stride ldx): codes (2 * m * chunks 16-byte halves) into xq, scales and sums
// (m * chunks each) into xd and xs. The same values as the CPU's QActivations::prepare, bit for
// bit: a block with NaN or infinity gets d = NaN, an all-zero block d = 0.
void quantize_chunks_launch(const float* x, uint64_t ldx, uint32_t m, uint32_t chunks, void* xq,
                            float* xd, int32_t* xs, cudaStream_t stream);
// y[t][r] (+)= bias[r] for t < m, r < rows (the cuBLAS path's bias).
void add_bias_launch(float* y, uint64_t ldy, uint32_t m, uint32_t rows, const float* bias,
                     cudaStream_t stream);
// Sum of split-K partial tiles in split order, then bias and accumulate (gemm_mma.cu).
void splitk_reduce_launch(const float* workspace, uint32_t splits, uint32_t m, uint32_t rows,
                          const OutParams& out, cudaStream_t stream);
// Row tokens[t] of the embedding matrix, dequantized exactly, into x[t][0 .. d).
void embed_rows_launch(const RowsParams& e, const int32_t* tokens, uint32_t n, uint32_t d, float* x,
                       uint64_t ldx, cudaStream_t stream);
// out[t][i] = w[i] * (x[t][i] * s_t), s_t = 1 / sqrt(mean(x[t]^2) + eps) summed in double (as
// the CPU backend does), for t < n, i < d. With groups > 1 each row holds `groups` consecutive
// vectors of d (QK-norm: one per head), each normalised on its own with the same w.
// With `q` (groups 1, q->chunks = ceil(d / 32)), the output rows' int8 blocks too, the bits
// quantize_chunks_launch would write for them (one launch when d and the pointers allow float4
// access, else the two).
void rms_norm_launch(const float* x, uint64_t ldx, const float* w, double eps, uint32_t n,
                     uint32_t d, float* out, uint64_t ldo, cudaStream_t stream, uint32_t groups = 1,
                     const Int8Rows* q = nullptr);
// out[t][i] += w[i] * (x[t][i] * s_t), the same s_t: a post-norm's residual add (Gemma's
// sandwich norms); out must not overlap x.
void rms_norm_add_launch(const float* x, uint64_t ldx, const float* w, double eps, uint32_t n,
                         uint32_t d, float* out, uint64_t ldo, cudaStream_t stream,
                         uint32_t groups = 1);
// out[t][i] = silu(gate[t][i]) * up[t][i] for t < n, i < width; gate and up rows ld apart, out
// rows ldo apart (out may be gate). With `q` (q->chunks = ceil(width / 32)), the output rows'
// int8 blocks too, in the same launch (as rms_norm_launch's).
void swiglu_launch(const float* gate, const float* up, uint64_t ld, float* out, uint64_t ldo,
                   uint32_t n, uint32_t width, cudaStream_t stream, const Int8Rows* q = nullptr);
// out[t][i] = gelu_tanh(gate[t][i]) * up[t][i] (GeGLU, runtime/transformer.hpp's gelu_tanh:
// 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3)))), the same layout as swiglu_launch.
void geglu_tanh_launch(const float* gate, const float* up, uint64_t ld, float* out, uint64_t ldo,
                       uint32_t n, uint32_t width, cudaStream_t stream);
// x[t][i] *= s for t < n, i < width (Gemma's embedding scale).
void scale_rows_launch(float* x, uint64_t ld, uint32_t n, uint32_t width, float s,
                       cudaStream_t stream);
// x[t][i] = tanh(x[t][i] / cap) * cap for t < n, i < width (gemma2's final logit soft-cap).
void softcap_rows_launch(float* x, uint64_t ld, uint32_t n, uint32_t width, float cap,
                         cudaStream_t stream);
// y[i] += x[i] for i < count.
void add_inplace_launch(float* y, const float* x, uint64_t count, cudaStream_t stream);
// Index of the largest value of each row (the first on ties), for greedy sampling on the device.
// `scratch` holds n * argmax_parts(vocab) * 8 bytes (at most n * kArgmaxMaxParts * 8).
constexpr uint32_t kArgmaxSlice = 2048, kArgmaxMaxParts = 256;
uint32_t argmax_parts(uint32_t vocab);
void argmax_rows_launch(const float* logits, uint64_t ld, uint32_t n, uint32_t vocab, int32_t* out,
                        void* scratch, cudaStream_t stream);
// Greedy decode bookkeeping after argmax: history[*pos] = *next; *pos += 1 (one thread).
void record_token_launch(const int32_t* next, int32_t* pos, int32_t* history, uint32_t capacity,
                         int32_t* fault, cudaStream_t stream);

// ---- RoPE and the KV cache (attention.cu) ---------------------------------------------------
// Positions are read on the device (a captured graph replays every decode step), so the host's
// checks cannot see the value a kernel uses. A kernel given a position at or past its buffer's
// capacity writes and reads nothing there: it or-s this bit into the engine's fault word, which
// the host reads after each step and turns into an error (runtime/cuda_forward.cpp).
constexpr int32_t kFaultPosition = 1;

// A step's rows each with their own cache (CudaEngine::forward_batch, several sequences in one
// launch; or every row of a step on a paged cache): row t's cache and position, in place of the
// params' single cache and pos0. The two layouts are kv_layout.hpp's.
struct CacheRow {
    // Contiguous: layer 0's keys and values ([capacity][kv_heads * head_dim] fp16 each), layer
    // L's at k (v) + L * layer_stride halves. Paged: k is the pool's first block, v unused.
    uint16_t* k = nullptr;
    uint16_t* v = nullptr;
    uint64_t layer_stride = 0;
    // Paged: the sequence's block table (device; entry i holds positions i << block_shift ..);
    // null for a contiguous cache.
    const uint32_t* blocks = nullptr;
    uint64_t block_halves = 0;
    uint32_t block_shift = 0;
    int32_t pos = 0;        // row t's position
    uint32_t capacity = 0;  // positions its cache holds (a paged cache: its table's, or fewer)
};

struct RopeParams {
    float* qkv = nullptr;  // n rows: q heads, then k heads, then v heads
    uint64_t ld = 0;
    uint32_t n = 0, heads = 0, kv_heads = 0, head_dim = 0;
    const float* cos = nullptr;  // [position][head_dim / 2]
    const float* sin = nullptr;
    const int32_t* pos0 = nullptr;  // device: position of token 0
    uint16_t* k_cache = nullptr;    // this layer: [capacity][kv_heads * head_dim] fp16
    uint16_t* v_cache = nullptr;
    uint32_t capacity = 0;     // positions the cache holds
    int32_t* fault = nullptr;  // device: kFaultPosition is or-ed in for a position >= capacity
    unsigned long long* saturated = nullptr;  // device: k, v values clamped to fp16 (or null)
    // Device, n entries: row t's cache and position (CacheRow, `layer` of it) instead of
    // k_cache, v_cache, pos0 + t and capacity (which then bounds the rows' capacities).
    const CacheRow* rows = nullptr;
    uint32_t layer = 0;
};
// Rotates q and k in place (rotate-half layout) and stores k, v as fp16 at positions pos0 + t.
void rope_store_kv_launch(const RopeParams& p, cudaStream_t stream);

struct AttentionParams {
    const float* qkv = nullptr;  // q of token t at qkv + t * ld
    uint64_t ld = 0;
    uint32_t n = 0, heads = 0, kv_heads = 0, head_dim = 0;
    const uint16_t* k_cache = nullptr;
    const uint16_t* v_cache = nullptr;
    const int32_t* pos0 = nullptr;  // device: token t attends to positions 0 .. pos0 + t
    float* out = nullptr;           // [t][heads * head_dim], stride ldo
    uint64_t ldo = 0;
    uint32_t window = 0;    // > 0: only the last `window` positions up to pos (sliding window)
    float scale = 0.0f;     // the query scale; 0: head_dim^-1/2 (Gemma: query_pre_attn_scalar's)
    float softcap = 0.0f;   // > 0: scores tanh(s / softcap) * softcap before the softmax (gemma2)
    uint32_t capacity = 0;  // positions the cache holds
    int32_t* fault = nullptr;  // device: kFaultPosition is or-ed in for a position >= capacity
    // With q8.chunks = heads * head_dim / 32 (head_dim a multiple of 32, 4 dimensions per lane):
    // the output rows' int8 blocks for the GEMV after it, as rms_norm_launch's.
    Int8Rows q8;
    // Split (flash-decoding) form when split_len > 0: the cache's positions in slices of
    // split_len (plans.hpp: attention_split_len); block (slice, KV head, token) reads its slice
    // of keys and values once for all the query heads that share them and writes their partial
    // softmaxes (m, l, o per warp) to `workspace` (attention_workspace_floats); the last block
    // of a (token, KV head) to finish merges them, counted in `counters` (n * kv_heads *
    // ceil(group / 8) zeroed words, left zeroed). For few tokens (decode): one block per
    // (token, head) leaves most of the GPU idle and reads each KV head once per query head.
    uint32_t split_len = 0;
    float* workspace = nullptr;
    unsigned* counters = nullptr;
    // As RopeParams::rows: row t's cache and position. The split form's slices are then those
    // of `capacity`, the largest of the rows' (the engine batches rows whose own capacities give
    // the same split_len; a smaller cache's extra slices are empty, and the merge skips them).
    const CacheRow* rows = nullptr;
    uint32_t layer = 0;
};
// (plans.hpp: attention_split_len, attention_workspace_floats)
// Causal GQA attention with an online softmax; dims_per_lane from attention_dims_per_lane.
void attention_launch(const AttentionParams& p, uint32_t dims_per_lane, cudaStream_t stream);

// ---- Random weights on the device (random_fill.cu) ------------------------------------------
// Values come from a counter-based hash of (seed, index): the same seed gives the same matrix.
// Float rows (f32/f16/bf16): elements below k uniform with standard deviation `stddev`, the
// padding up to the row stride zero.
void fill_random_float_rows_launch(const RowsParams& w, uint32_t k, float stddev, uint64_t seed,
                                   cudaStream_t stream);
// Quantized rows: codes uniform over the type's range (codes_bytes = scales_offset bytes), every
// scale `scale`, zeros mid-range (8), padding zero.
void fill_random_quant_rows_launch(const RowsParams& w, float scale, uint64_t seed,
                                   cudaStream_t stream);
void fill_f32_launch(float* p, uint64_t count, float value, cudaStream_t stream);

}  // namespace qforge::cuda
