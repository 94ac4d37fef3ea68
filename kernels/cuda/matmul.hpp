// Matrix products of packed weights with float activations on the GPU, y = W x for m tokens, and
// the dispatcher that picks a path per shape (plans.hpp: gemv, fused mma, dequantize + cuBLAS).
//
// Conventions shared by every path:
//   W      rows x k weights in the GPU layout of gpu_format.hpp (device memory).
//   x      m rows of activations, fp32, row t at x + t * ldx; ldx >= fmt.kpad, a multiple of 4,
//          16-byte aligned; x[t][k .. kpad) must be finite (the backend keeps it zero).
//   out    y[t * ldo + r] for r < rows, t < m, fp32. `bias` (rows floats, or null) is added;
//          `accumulate` adds the product to what `out` holds (the residual add) instead of
//          overwriting it.
// Every launch is checked (QF_CUDA_CHECK_LAUNCH); unsupported shapes throw UnsupportedOnCuda.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "kernels/cuda/gpu_format.hpp"
#include "kernels/cuda/launchers.hpp"
#include "kernels/cuda/plans.hpp"

namespace qforge::cuda {

// A matrix in device memory.
struct DeviceMatrix {
    GpuMatrixFormat fmt;
    const uint8_t* data = nullptr;  // rows * fmt.row_bytes bytes
    uint64_t rows = 0;

    uint64_t bytes() const { return rows * fmt.row_bytes; }
};

// The launchers' view of a matrix's rows.
RowsParams to_rows_params(const DeviceMatrix& w);

struct MatmulOut {
    float* y = nullptr;
    uint64_t ldo = 0;
    const float* bias = nullptr;
    bool accumulate = false;
};

// The GEMV path (gemv_*.cu), passes of up to kGemvMaxTokens tokens. Each pass first prepares its
// tokens in `scratch` (gemv_scratch_floats(kpad) floats, 16-byte aligned): int8 activation
// blocks when `int8` and the rows are quantized, else the floats chunk-interleaved
// (launchers.hpp: GemvParams). `prepared`: the scratch already holds this x's preparation (the
// same x, m <= kGemvMaxTokens, chunks and mode; a previous launch_gemv left it), so none is made.
// `overlap`: launched to overlap the kernel before it (pdl.cuh; sm_90+, not with
// QFORGE_CUDA_SYNC).
struct GemvOptions {
    bool int8 = true;
    GemvTuning tuning;
    bool prepared = false;
    bool overlap = false;
};
void launch_gemv(const DeviceMatrix& w, const float* x, uint64_t ldx, uint64_t m,
                 const MatmulOut& out, cudaStream_t stream, float* scratch,
                 const GemvOptions& options = {});
inline uint64_t gemv_scratch_floats(uint64_t kpad) { return kGemvMaxTokens * kpad; }
// Where the int8 blocks of rows of `chunks` chunks lie in that scratch (codes, scales, sums).
Int8Rows gemv_int8_scratch(float* scratch, uint64_t chunks);

// What a MatmulContext's scratch holds: the GEMV preparation of these rows (m <= kGemvMaxTokens
// tokens of x, stride ldx, `chunks` chunks, int8 blocks or interleaved floats). matmul() keeps
// it; a producer that writes the int8 blocks with its output (rms_norm_launch, swiglu_launch)
// sets it; whoever writes those rows otherwise must clear it.
struct PreparedRows {
    const float* x = nullptr;
    uint64_t ldx = 0, m = 0, chunks = 0;
    bool int8 = false;
    bool operator==(const PreparedRows&) const = default;
};

// The fused tensor-core path (gemm_mma.cu): x16 holds the activations in fp16, round_up(m, 32)
// rows of ldx16 >= kpad halves (pad rows and columns zero, as convert_rows_to_f16 leaves them);
// `workspace` holds plan.workspace_floats floats when plan.splits > 1. Requires sm_80+.
void launch_mma_gemm(const DeviceMatrix& w, const uint16_t* x16, uint64_t ldx16, uint64_t m,
                     const MmaPlan& plan, float* workspace, const MatmulOut& out,
                     cudaStream_t stream);

// x (fp32, m rows of k, stride ldx) to fp16 rows of ldx16 halves; columns k .. ldx16 and rows
// m .. round_up(m, 32) are written as zero; values beyond fp16's range saturate, counted in
// *saturated unless it is null (elementwise.cu).
void convert_rows_to_f16(const float* x, uint64_t ldx, uint64_t m, uint64_t k, uint16_t* x16,
                         uint64_t ldx16, unsigned long long* saturated, cudaStream_t stream);

// Rows [r0, r0 + n) of a quantized matrix dequantized to fp16, n rows of fmt.kpad halves
// (scale * (code - zero) rounded to nearest; dequant_f16.cu).
void dequantize_rows_to_f16(const DeviceMatrix& w, uint64_t r0, uint64_t n, uint16_t* out,
                            cudaStream_t stream);

// Buffers and handles the dispatcher uses; owned by the caller (the backend sizes them once for
// its largest matrix and batch, so nothing is allocated while a CUDA graph is captured).
struct MatmulContext {
    cudaStream_t stream = nullptr;
    cublasHandle_t cublas = nullptr;  // bound to `stream` by the owner
    int cc_major = 0;
    int sm_count = 1;
    uint16_t* x16 = nullptr;  // fp16 activations; the GEMV's interleaved fp32 activations
    uint64_t x16_halves = 0;
    uint16_t* w16 = nullptr;  // dequantized slab
    uint64_t w16_halves = 0;
    float* workspace = nullptr;  // split-K partial tiles
    uint64_t workspace_floats = 0;
    unsigned long long* saturated = nullptr;  // device: fp16 activations clamped (or null)
    std::optional<MatmulPath> forced;         // tests and benchmarks: this path for every product
    bool gemv_int8 = true;  // quantized GEMVs take int8 activation blocks (launch_gemv)
    GemvTuning gemv_tuning;
    bool gemv_overlap = false;  // GemvOptions::overlap (the owner sets it on sm_90+)
    PreparedRows prepared;      // what x16 holds for the GEMV (none: x null)
};

// Scratch a context needs for up to m_max tokens through matrices of at most `max_kpad` weights
// per row and `max_rows` rows (the cuBLAS slab is capped at `max_slab_halves`).
struct MatmulScratchSize {
    uint64_t x16_halves, w16_halves;
};
MatmulScratchSize matmul_scratch_size(uint64_t m_max, uint64_t max_kpad, uint64_t max_rows,
                                      uint64_t max_slab_halves = uint64_t{64} << 20);
// The split-K workspace (floats) the mma path needs for this matrix at any m in 1 .. m_max.
uint64_t mma_workspace_floats(const GpuMatrixFormat& fmt, uint64_t rows, uint64_t m_max,
                              int sm_count);

// y = W x through the path plans.hpp chooses (or ctx.forced). Returns the path taken.
MatmulPath matmul(MatmulContext& ctx, const DeviceMatrix& w, const float* x, uint64_t ldx,
                  uint64_t m, const MatmulOut& out);

// cuBLAS f32 product with TF32 tensor cores (the bf16 weights' path: w32 their slab widened to
// f32, so only the activations round, to TF32's 10-bit fraction), rows as cublas_f16_gemm's.
void cublas_tf32_gemm(cublasHandle_t h, const float* w32, uint64_t ldw, uint64_t rows,
                      uint64_t kpad, const float* x, uint64_t ldx, uint64_t m, float* y,
                      uint64_t ldo, bool accumulate);

// Plain cuBLAS half-precision product on fp16 weights (rows x kpad halves, row stride ldw):
// the baseline the benchmarks compare against, and the f16 path of the dispatcher.
void cublas_f16_gemm(cublasHandle_t h, const uint16_t* w16, uint64_t ldw, uint64_t rows,
                     uint64_t kpad, const uint16_t* x16, uint64_t ldx16, uint64_t m, float* y,
                     uint64_t ldo, bool accumulate);

}  // namespace qforge::cuda
