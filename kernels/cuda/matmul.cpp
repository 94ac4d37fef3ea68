// The matmul dispatcher: validates a product, picks its path (plans.hpp) and calls the launchers.
#include "kernels/cuda/matmul.hpp"

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/launchers.hpp"

namespace qforge::cuda {

namespace {

uint32_t u32(uint64_t v) { return static_cast<uint32_t>(v); }

OutParams out_params(const MatmulOut& o) { return {o.y, o.ldo, o.bias, o.accumulate ? 1 : 0}; }

// The kernels load weights as 16-byte uint4 and activations as float4: a misaligned pointer
// would be a device fault far from its cause, so it is refused here, naming it.
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_product(const DeviceMatrix& w, const float* x, uint64_t ldx, uint64_t m,
                   const MatmulOut& out) {
    if (w.rows == 0 || w.rows > kMaxGpuDim || !w.data)
        throw UnsupportedOnCuda("a matrix of " + std::to_string(w.rows) + " rows");
    if (!aligned16(w.data) || w.fmt.row_bytes % 16 != 0)
        throw UnsupportedOnCuda("weights not 16-byte aligned (rows of " +
                                std::to_string(w.fmt.row_bytes) + " bytes)");
    if (!aligned16(x)) throw UnsupportedOnCuda("activations not 16-byte aligned");
    if (m == 0 || m > kMaxGpuDim)
        throw UnsupportedOnCuda("a product over " + std::to_string(m) + " tokens");
    if (ldx < w.fmt.kpad || ldx % 4 != 0)
        throw UnsupportedOnCuda("activation stride " + std::to_string(ldx) +
                                " (a multiple of 4, at least " + std::to_string(w.fmt.kpad) + ")");
    if (out.ldo < w.rows && m > 1)
        throw UnsupportedOnCuda("output stride " + std::to_string(out.ldo) + " below " +
                                std::to_string(w.rows) + " rows");
}

}  // namespace

RowsParams to_rows_params(const DeviceMatrix& w) {
    RowsParams p;
    p.w = w.data;
    p.row_bytes = w.fmt.row_bytes;
    p.rows = u32(w.rows);
    p.chunks = u32(w.fmt.chunks);
    p.chunks_per_group = u32(w.fmt.chunks_per_group);
    p.scales_offset = u32(w.fmt.scales_offset);
    p.zeros_offset = u32(w.fmt.zeros_offset);
    p.zero = w.fmt.zero;
    p.has_zeros = w.fmt.has_zeros ? 1 : 0;
    p.kind = w.fmt.kind;
    p.mins_offset = w.fmt.super_rows ? u32(w.fmt.mins_offset) : 0;
    return p;
}

Int8Rows gemv_int8_scratch(float* scratch, uint64_t chunks) {
    // codes (32 bytes per chunk and token), then scales, then sums
    Int8Rows q;
    q.xq = reinterpret_cast<uint4*>(scratch);
    q.xd = reinterpret_cast<float*>(q.xq + 2 * kGemvMaxTokens * chunks);
    q.xs = reinterpret_cast<int32_t*>(q.xd + kGemvMaxTokens * chunks);
    q.chunks = u32(chunks);
    return q;
}

void launch_gemv(const DeviceMatrix& w, const float* x, uint64_t ldx, uint64_t m,
                 const MatmulOut& out, cudaStream_t stream, float* scratch,
                 const GemvOptions& options) {
    check_product(w, x, ldx, m, out);
    if (!scratch || !aligned16(scratch))
        throw UnsupportedOnCuda("a GEMV without a 16-byte aligned activation scratch");
    const bool int8 = options.int8 && w.fmt.quantized();
    if (options.prepared && m > kGemvMaxTokens)
        throw UnsupportedOnCuda("a prepared GEMV of more than one pass of tokens");
    const GemvPlan plan = plan_gemv(w.fmt, w.rows, m, options.tuning);
    const uint32_t chunks = u32(w.fmt.chunks);
    for (uint64_t t0 = 0; t0 < m; t0 += kGemvMaxTokens) {
        GemvParams p;
        p.w = to_rows_params(w);
        p.m = u32(std::min(kGemvMaxTokens, m - t0));
        if (int8) {
            const Int8Rows q = gemv_int8_scratch(scratch, chunks);
            if (!options.prepared)
                quantize_chunks_launch(x + t0 * ldx, ldx, p.m, chunks, q.xq, q.xd, q.xs, stream);
            p.xq = q.xq, p.xd = q.xd, p.xs = q.xs;
        } else {
            if (!options.prepared)
                interleave_chunks_launch(x + t0 * ldx, ldx, p.m, chunks, scratch, stream);
            p.x = scratch;
            p.ldx = w.fmt.kpad;
        }
        p.out = out_params(out);
        p.out.y = out.y + t0 * out.ldo;
        p.overlap = options.overlap && !sync_launches() ? 1 : 0;
        switch (w.fmt.kind) {
            case WeightKind::q4:
                gemv_q4_launch(p, plan.threads, plan.token_tile, plan.blocks, plan.rows_per_block,
                               stream);
                break;
            case WeightKind::q8:
                gemv_q8_launch(p, plan.threads, plan.token_tile, plan.blocks, plan.rows_per_block,
                               stream);
                break;
            default:
                gemv_float_launch(p, plan.threads, plan.token_tile, plan.blocks, stream);
        }
    }
}

void launch_mma_gemm(const DeviceMatrix& w, const uint16_t* x16, uint64_t ldx16, uint64_t m,
                     const MmaPlan& plan, float* workspace, const MatmulOut& out,
                     cudaStream_t stream) {
    if (!w.fmt.quantized())
        throw UnsupportedOnCuda("the fused tensor-core GEMM on " +
                                std::string(qtype_traits(w.fmt.qtype).name) + " weights");
    if (ldx16 < w.fmt.kpad || ldx16 % 2 != 0)
        throw UnsupportedOnCuda("fp16 activation stride " + std::to_string(ldx16));
    if (plan.splits > 1 && !workspace)
        throw UnsupportedOnCuda("a split-K GEMM without a workspace");
    MmaParams p;
    p.w = to_rows_params(w);
    p.x16 = x16;
    p.ldx16 = ldx16;
    p.m = u32(m);
    p.chunks_per_split = u32(plan.chunks_per_split);
    p.splits = plan.splits;
    p.workspace = workspace;
    p.out = out_params(out);
    mma_gemm_launch(p, u32(plan.row_tiles), u32(plan.token_tiles), stream);
    if (plan.splits > 1)
        splitk_reduce_launch(workspace, plan.splits, u32(m), u32(w.rows), p.out, stream);
}

void convert_rows_to_f16(const float* x, uint64_t ldx, uint64_t m, uint64_t k, uint16_t* x16,
                         uint64_t ldx16, unsigned long long* saturated, cudaStream_t stream) {
    f32_to_f16_rows_launch(x, ldx, u32(m), u32(round_up(m, kMmaTileTokens)), u32(k), x16, ldx16,
                           saturated, stream);
}

void dequantize_rows_to_f16(const DeviceMatrix& w, uint64_t r0, uint64_t n, uint16_t* out,
                            cudaStream_t stream) {
    if (!w.fmt.quantized())
        throw UnsupportedOnCuda("dequantizing " + std::string(qtype_traits(w.fmt.qtype).name) +
                                " rows to fp16");
    dequantize_f16_launch(to_rows_params(w), u32(r0), u32(n), out, stream);
}

MatmulScratchSize matmul_scratch_size(uint64_t m_max, uint64_t max_kpad, uint64_t max_rows,
                                      uint64_t max_slab_halves) {
    MatmulScratchSize s;
    // At least 32 rows of halves: also the GEMV's interleaved fp32 scratch (8 rows of floats).
    s.x16_halves = round_up(m_max, kMmaTileTokens) * max_kpad;
    static_assert(2 * kGemvMaxTokens <= kMmaTileTokens);
    s.w16_halves = std::max(2 * max_kpad, std::min(max_slab_halves, max_rows * max_kpad));
    return s;
}

uint64_t mma_workspace_floats(const GpuMatrixFormat& fmt, uint64_t rows, uint64_t m_max,
                              int sm_count) {
    uint64_t most = 0;
    for (uint64_t m = 1; m <= m_max; ++m)
        most = std::max(most, plan_mma(fmt, rows, m, sm_count).workspace_floats);
    return most;
}

namespace {
// Row-major out[m][ldo] is column-major (rows x m) with leading dimension ldo:
// out^T = W x^T, with W row-major = column-major (kpad x rows), transposed.
void gemm_rows(cublasHandle_t h, const void* w, cudaDataType type, uint64_t ldw, uint64_t rows,
               uint64_t kpad, const void* x, uint64_t ldx, uint64_t m, float* y, uint64_t ldo,
               bool accumulate, cublasComputeType_t compute, const char* what) {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const cublasStatus_t st =
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(m),
                     static_cast<int>(kpad), &alpha, w, type, static_cast<int>(ldw), x, type,
                     static_cast<int>(ldx), &beta, y, CUDA_R_32F, static_cast<int>(ldo), compute,
                     CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        throw Error(std::string("cuBLAS GemmEx (") + what +
                    ") failed: " + cublasGetStatusString(st) + " (rows " + std::to_string(rows) +
                    ", tokens " + std::to_string(m) + ", k " + std::to_string(kpad) + ")");
}
}  // namespace

void cublas_tf32_gemm(cublasHandle_t h, const float* w32, uint64_t ldw, uint64_t rows,
                      uint64_t kpad, const float* x, uint64_t ldx, uint64_t m, float* y,
                      uint64_t ldo, bool accumulate) {
    gemm_rows(h, w32, CUDA_R_32F, ldw, rows, kpad, x, ldx, m, y, ldo, accumulate,
              CUBLAS_COMPUTE_32F_FAST_TF32, "TF32");
}

void cublas_f16_gemm(cublasHandle_t h, const uint16_t* w16, uint64_t ldw, uint64_t rows,
                     uint64_t kpad, const uint16_t* x16, uint64_t ldx16, uint64_t m, float* y,
                     uint64_t ldo, bool accumulate) {
    gemm_rows(h, w16, CUDA_R_16F, ldw, rows, kpad, x16, ldx16, m, y, ldo, accumulate,
              CUBLAS_COMPUTE_32F, "fp16");
}

MatmulPath matmul(MatmulContext& ctx, const DeviceMatrix& w, const float* x, uint64_t ldx,
                  uint64_t m, const MatmulOut& out) {
    check_product(w, x, ldx, m, out);
    MatmulPath path = choose_matmul_path(w.fmt, m, ctx.cc_major);
    if (ctx.forced) {
        if (!matmul_path_applies(*ctx.forced, w.fmt, ctx.cc_major))
            throw UnsupportedOnCuda("the " + std::string(matmul_path_name(*ctx.forced)) +
                                    " path for " + std::string(qtype_traits(w.fmt.qtype).name) +
                                    " weights on sm_" + std::to_string(ctx.cc_major) + "x");
        path = *ctx.forced;
    }
    if (path == MatmulPath::gemv) {
        if (gemv_scratch_floats(w.fmt.kpad) * 2 > ctx.x16_halves)
            throw UnsupportedOnCuda("a GEMV of rows of " + std::to_string(w.fmt.kpad) +
                                    " beyond the activation scratch");
        // The scratch may already hold these rows' preparation (q, k and v from one input; a
        // producer's fused int8 blocks); after the launch it holds them (one pass) in any case.
        // Not when the product writes over its own input rows (the scratch is then of old rows).
        const PreparedRows rows{x, ldx, m, w.fmt.chunks, ctx.gemv_int8 && w.fmt.quantized()};
        const bool prepared = m <= kGemvMaxTokens && ctx.prepared == rows;
        ctx.prepared = {};  // until the launch has been enqueued
        launch_gemv(w, x, ldx, m, out, ctx.stream, reinterpret_cast<float*>(ctx.x16),
                    {ctx.gemv_int8, ctx.gemv_tuning, prepared, ctx.gemv_overlap});
        const auto* x_end = x + (m - 1) * ldx + w.fmt.kpad;
        const auto* y_end = out.y + (m - 1) * out.ldo + w.rows;
        const bool overlaps = out.y < x_end && x < y_end;
        if (m <= kGemvMaxTokens && !overlaps) ctx.prepared = rows;
        return path;
    }
    ctx.prepared = {};  // the fp16 activations go where the GEMV's preparation was
    const uint64_t kpad = w.fmt.kpad;
    if (w.fmt.kind == WeightKind::bf16) {  // TF32 on f32 slabs of the rows, f32 activations
        if (!ctx.cublas) throw UnsupportedOnCuda("the cuBLAS path without a cuBLAS handle");
        if (ctx.w16_halves < 2 * kpad) throw UnsupportedOnCuda("an f32 slab below one row");
        const uint64_t slab = cublas_slab_rows(w.fmt, w.rows, ctx.w16_halves);
        auto* w32 = reinterpret_cast<float*>(ctx.w16);
        const auto* rows16 = reinterpret_cast<const uint16_t*>(w.data);
        for (uint64_t r0 = 0; r0 < w.rows; r0 += slab) {
            const uint64_t n = std::min(slab, w.rows - r0);
            bf16_rows_to_f32_launch(rows16 + r0 * (w.fmt.row_bytes / 2), w.fmt.row_bytes / 2,
                                    u32(n), u32(kpad), w32, ctx.stream);
            cublas_tf32_gemm(ctx.cublas, w32, kpad, n, kpad, x, ldx, m, out.y + r0, out.ldo,
                             out.accumulate);
        }
        if (out.bias) add_bias_launch(out.y, out.ldo, u32(m), u32(w.rows), out.bias, ctx.stream);
        return path;
    }
    if (round_up(m, kMmaTileTokens) * kpad > ctx.x16_halves)
        throw UnsupportedOnCuda("a batch of " + std::to_string(m) + " tokens of " +
                                std::to_string(kpad) + " beyond the fp16 activation scratch");
    convert_rows_to_f16(x, ldx, m, w.fmt.k, ctx.x16, kpad, ctx.saturated, ctx.stream);
    if (path == MatmulPath::mma) {
        const MmaPlan plan = plan_mma(w.fmt, w.rows, m, ctx.sm_count);
        if (plan.workspace_floats > ctx.workspace_floats)
            throw UnsupportedOnCuda(
                "a split-K workspace of " + std::to_string(plan.workspace_floats) +
                " floats (the context holds " + std::to_string(ctx.workspace_floats) + ")");
        launch_mma_gemm(w, ctx.x16, kpad, m, plan, ctx.workspace, out, ctx.stream);
        return path;
    }
    if (!ctx.cublas) throw UnsupportedOnCuda("the cuBLAS path without a cuBLAS handle");
    if (w.fmt.kind == WeightKind::f16) {
        cublas_f16_gemm(ctx.cublas, reinterpret_cast<const uint16_t*>(w.data), w.fmt.row_bytes / 2,
                        w.rows, kpad, ctx.x16, kpad, m, out.y, out.ldo, out.accumulate);
    } else {
        if (ctx.w16_halves < kpad) throw UnsupportedOnCuda("a dequantization slab below one row");
        const uint64_t slab = cublas_slab_rows(w.fmt, w.rows, ctx.w16_halves);
        for (uint64_t r0 = 0; r0 < w.rows; r0 += slab) {
            const uint64_t n = std::min(slab, w.rows - r0);
            dequantize_rows_to_f16(w, r0, n, ctx.w16, ctx.stream);
            cublas_f16_gemm(ctx.cublas, ctx.w16, kpad, n, kpad, ctx.x16, kpad, m, out.y + r0,
                            out.ldo, out.accumulate);
        }
    }
    if (out.bias) add_bias_launch(out.y, out.ldo, u32(m), u32(w.rows), out.bias, ctx.stream);
    return path;
}

}  // namespace qforge::cuda
