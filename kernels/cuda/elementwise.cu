// The small kernels of the forward pass: embedding lookup, RMSNorm (and the post-norm's residual
// add), SwiGLU and GeGLU, Gemma's embedding scale and logit soft-cap, residual and bias adds,
// fp32 -> fp16 activation rows (saturating, f16_saturate.cuh), greedy argmax. Each matches the
// CPU backend's formula (runtime/cpu_backend.cpp) operation for operation where that matters
// for the tests.
//
// Supported configurations: any n, d, width below 2^31 (grid-stride loops; one block per token
// row for the row reductions); every weight kind of gpu_format.hpp for the embedding.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/dequant.hpp"
#include "kernels/cuda/f16_saturate.cuh"
#include "kernels/cuda/int8_rows.cuh"
#include "kernels/cuda/launchers.hpp"
#include "kernels/cuda/pdl.cuh"

namespace qforge::cuda {

namespace {

constexpr unsigned kThreads = 256;

unsigned grid_for(uint64_t count) {
    return static_cast<unsigned>(std::clamp<uint64_t>((count + kThreads - 1) / kThreads, 1, 65535));
}

__global__ void f32_to_f16_rows_kernel(const float* x, uint64_t ldx, uint32_t m, uint32_t m_pad,
                                       uint32_t k, uint16_t* x16, uint64_t ldx16,
                                       unsigned long long* saturated) {
    const uint64_t total = static_cast<uint64_t>(m_pad) * ldx16;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t t = i / ldx16, j = i % ldx16;
        const float v = t < m && j < k ? x[t * ldx + j] : 0.0f;
        x16[i] = f16_saturate(v, saturated);
    }
}

// bf16 bits are the high half of the f32 with the same value: exact.
__global__ void bf16_rows_to_f32_kernel(const uint16_t* w, uint64_t ldw, uint32_t n, uint32_t kpad,
                                        float* out) {
    const uint64_t total = static_cast<uint64_t>(n) * kpad;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t r = i / kpad, j = i % kpad;
        out[i] = __uint_as_float(static_cast<uint32_t>(w[r * ldw + j]) << 16);
    }
}

__global__ void add_bias_kernel(float* y, uint64_t ldy, uint32_t m, uint32_t rows,
                                const float* bias) {
    const uint64_t total = static_cast<uint64_t>(m) * rows;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t t = i / rows, r = i % rows;
        y[t * ldy + r] += bias[r];
    }
}

// One block per token: chunk c of the row goes to thread c % blockDim.x.
__global__ void embed_rows_kernel(RowsParams e, const int32_t* tokens, uint32_t d, float* x,
                                  uint64_t ldx) {
    const uint32_t t = blockIdx.x;
    const uint8_t* row = e.w + static_cast<uint64_t>(tokens[t]) * e.row_bytes;
    float* out = x + t * ldx;
    for (uint32_t c = threadIdx.x; c < e.chunks; c += blockDim.x) {
        float w[32];
        switch (e.kind) {
            case WeightKind::q4:
            case WeightKind::q8:
                dequant_quant_chunk(row, e.kind == WeightKind::q4 ? 4 : 8, c, e.chunks_per_group,
                                    e.scales_offset, e.zeros_offset, e.has_zeros != 0, e.zero, w,
                                    e.mins_offset);
                break;
            case WeightKind::f32:
                for (int i = 0; i < 32; ++i) w[i] = reinterpret_cast<const float*>(row)[32 * c + i];
                break;
            case WeightKind::f16:
                for (int i = 0; i < 32; ++i)
                    w[i] = f16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[32 * c + i]);
                break;
            case WeightKind::bf16:
                for (int i = 0; i < 32; ++i)
                    w[i] = bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[32 * c + i]);
                break;
        }
        for (uint32_t i = 0; i < 32 && 32 * c + i < d; ++i) out[32 * c + i] = w[i];
    }
}

// One block per token row, up to 1024 threads, each holding a few elements (float4 loads when
// kVec: d, the strides and the pointers allow it), so a row costs one round of memory latency
// rather than one per element. The sum of squares is accumulated in double, as on the CPU (each
// square is exact in double), so the scale differs from the CPU's only by the order of a double
// sum. `accumulate`: out += instead of = (the CPU's rms_norm with accumulate: out + w * (x * s),
// each operation rounded).
__device__ __forceinline__ double block_sum(double v, double* smem) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? smem[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) smem[32] = v;
    }
    __syncthreads();
    return smem[32];
}

__device__ __forceinline__ float norm_one(float w, float x, float scale, const float* o,
                                          bool accumulate) {
    const float y = __fmul_rn(w, __fmul_rn(x, scale));
    return accumulate ? __fadd_rn(*o, y) : y;
}

template <bool kVec>
__global__ void __launch_bounds__(1024)
    rms_norm_kernel(const float* x, uint64_t ldx, const float* w, double eps, uint32_t d,
                    float* out, uint64_t ldo, bool accumulate) {
    // block (t, g): group g (d elements at g * d) of token t's row
    const float* xi = x + blockIdx.x * ldx + static_cast<uint64_t>(blockIdx.y) * d;
    float* o = out + blockIdx.x * ldo + static_cast<uint64_t>(blockIdx.y) * d;
    __shared__ double smem[33];
    double ss = 0.0;
    if constexpr (kVec) {
        const float4* x4 = reinterpret_cast<const float4*>(xi);
#pragma unroll 4
        for (uint32_t i = threadIdx.x; i < d / 4; i += blockDim.x) {
            const float4 v = x4[i];
            ss += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y +
                  static_cast<double>(v.z) * v.z + static_cast<double>(v.w) * v.w;
        }
    } else {
#pragma unroll 4
        for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
            ss += static_cast<double>(xi[i]) * xi[i];
    }
    const double total = block_sum(ss, smem);
    const float scale = static_cast<float>(1.0 / sqrt(total / static_cast<double>(d) + eps));
    if constexpr (kVec) {
        const float4* x4 = reinterpret_cast<const float4*>(xi);
        const float4* w4 = reinterpret_cast<const float4*>(w);
        float4* o4 = reinterpret_cast<float4*>(o);
#pragma unroll 4
        for (uint32_t i = threadIdx.x; i < d / 4; i += blockDim.x) {
            const float4 v = x4[i], g = __ldg(w4 + i);
            float4 r;
            r.x = norm_one(g.x, v.x, scale, o + 4 * i, accumulate);
            r.y = norm_one(g.y, v.y, scale, o + 4 * i + 1, accumulate);
            r.z = norm_one(g.z, v.z, scale, o + 4 * i + 2, accumulate);
            r.w = norm_one(g.w, v.w, scale, o + 4 * i + 3, accumulate);
            o4[i] = r;
        }
    } else {
#pragma unroll 4
        for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
            o[i] = norm_one(__ldg(w + i), xi[i], scale, o + i, accumulate);
    }
}

__device__ __forceinline__ float silu_times(float v, float u) {
    return __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, expf(-v))), u);
}

// gate and up of token t at gate + t * ld, up + t * ld; the result at out + t * ldo (which may
// be gate itself).
__global__ void swiglu_kernel(const float* gate, const float* up, uint64_t ld, float* out,
                              uint64_t ldo, uint32_t n, uint32_t width) {
    const uint64_t total = static_cast<uint64_t>(n) * width;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t t = i / width, j = i % width, at = t * ld + j;
        out[t * ldo + j] = silu_times(gate[at], up[at]);
    }
}

// The CPU's gelu_tanh (runtime/transformer.hpp) operation for operation, each rounded (no
// fused multiply-add); tanhf is within 2 ulp of std::tanh.
__global__ void geglu_tanh_kernel(const float* gate, const float* up, uint64_t ld, float* out,
                                  uint64_t ldo, uint32_t n, uint32_t width) {
    const float kSqrt2OverPi = 0.7978845608028654f;
    const uint64_t total = static_cast<uint64_t>(n) * width;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t row = i / width, j = i % width, at = row * ld + j;
        const float v = gate[at];
        const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, v), v), v);
        const float t = tanhf(__fmul_rn(kSqrt2OverPi, __fadd_rn(v, cube)));
        const float g = __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, t));
        out[row * ldo + j] = __fmul_rn(g, up[at]);
    }
}

// rms_norm_kernel<true> (no accumulate, one group) that also writes the int8 blocks of its
// output: the threads walk q.chunks * 8 float4 (past d: zeros, as the output's zero padding), a
// warp's 32 float4 four whole chunks, every thread the same number of steps.
__global__ void __launch_bounds__(1024)
    rms_norm_int8_kernel(const float* x, uint64_t ldx, const float* w, double eps, uint32_t d,
                         float* out, uint64_t ldo, Int8Rows q) {
    pdl_trigger();  // the GEMV after this one may start loading its weights (pdl.cuh)
    const uint64_t t = blockIdx.x;
    const float4* x4 = reinterpret_cast<const float4*>(x + t * ldx);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    float4* o4 = reinterpret_cast<float4*>(out + t * ldo);
    __shared__ double smem[33];
    const uint32_t n4 = d / 4, total4 = q.chunks * 8;
    double ss = 0.0;
#pragma unroll 4
    for (uint32_t i = threadIdx.x; i < n4; i += blockDim.x) {
        const float4 v = x4[i];
        ss += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y +
              static_cast<double>(v.z) * v.z + static_cast<double>(v.w) * v.w;
    }
    const double total = block_sum(ss, smem);
    const float scale = static_cast<float>(1.0 / sqrt(total / static_cast<double>(d) + eps));
    for (uint32_t base = 0; base < total4; base += blockDim.x) {
        const uint32_t i = base + threadIdx.x;
        float4 r = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < n4) {
            const float4 v = x4[i], g = __ldg(w4 + i);
            r.x = __fmul_rn(g.x, __fmul_rn(v.x, scale));
            r.y = __fmul_rn(g.y, __fmul_rn(v.y, scale));
            r.z = __fmul_rn(g.z, __fmul_rn(v.z, scale));
            r.w = __fmul_rn(g.w, __fmul_rn(v.w, scale));
            o4[i] = r;
        }
        quantize_chunk_lanes(r, i < total4, q, t, i / 8);
    }
}

// swiglu_kernel that also writes the int8 blocks of its output: a thread per float4 of the
// output rows' q.chunks * 8 (past width: zeros), grid-stride with the whole block in step.
__global__ void swiglu_int8_kernel(const float* gate, const float* up, uint64_t ld, float* out,
                                   uint64_t ldo, uint32_t n, uint32_t width, Int8Rows q) {
    pdl_trigger();  // the GEMV after this one may start loading its weights (pdl.cuh)
    const uint64_t per = static_cast<uint64_t>(q.chunks) * 8, total = per * n;
    for (uint64_t base = static_cast<uint64_t>(blockIdx.x) * blockDim.x; base < total;
         base += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t i = base + threadIdx.x;
        const uint64_t t = i / per, f = i % per;
        float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (i < total) {
            for (int b = 0; b < 4; ++b) {
                const uint64_t j = 4 * f + b;
                if (j < width) {
                    e[b] = silu_times(gate[t * ld + j], up[t * ld + j]);
                    out[t * ldo + j] = e[b];
                }
            }
        }
        quantize_chunk_lanes(make_float4(e[0], e[1], e[2], e[3]), i < total, q, t,
                             static_cast<uint32_t>(f / 8));
    }
}

// xi[t][j][c] (float4 units) = x[t][32c + 4j .. 32c + 4j + 3]: the GEMV's chunk-interleaved
// activations (launchers.hpp). One thread per float4, written in order (reads 128 bytes apart).
__global__ void interleave_chunks_kernel(const float4* x, uint64_t ldx4, uint32_t m,
                                         uint32_t chunks, float4* xi) {
    pdl_trigger();  // the GEMV after this one may start loading its weights (pdl.cuh)
    const uint64_t per_token = static_cast<uint64_t>(chunks) * 8;
    const uint64_t total = static_cast<uint64_t>(m) * per_token;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t t = i / per_token, d = i % per_token;
        const uint64_t j = d / chunks, c = d % chunks;
        xi[i] = __ldg(x + t * ldx4 + c * 8 + j);
    }
}

// One thread per (token, chunk): the CPU's quantize_activation_block (kernels/cpu/qdot.cpp) in
// the same float operations (amax / 127, x / d rounded to nearest even, clamped to +-127).
__global__ void quantize_chunks_kernel(const float4* x, uint64_t ldx4, uint32_t m, uint32_t chunks,
                                       uint4* xq, float* xd, int32_t* xs) {
    pdl_trigger();  // the GEMV after this one may start loading its weights (pdl.cuh)
    const uint64_t total = static_cast<uint64_t>(m) * chunks;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t t = i / chunks, c = i % chunks;
        const float4* xc = x + t * ldx4 + c * 8;
        float v[32];
        for (int q = 0; q < 8; ++q) {
            const float4 f = __ldg(xc + q);
            v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
        }
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < 32; ++j) {
            finite = finite && isfinite(v[j]);
            amax = fmaxf(amax, fabsf(v[j]));
        }
        const float d = __fdiv_rn(amax, 127.0f);
        uint32_t words[8] = {};
        int32_t sum = 0;
        if (finite && d > 0.0f) {
            for (int j = 0; j < 32; ++j) {
                const int32_t q =
                    static_cast<int32_t>(fminf(fmaxf(rintf(__fdiv_rn(v[j], d)), -127.0f), 127.0f));
                sum += q;
                words[j / 4] |= (static_cast<uint32_t>(q) & 0xffu) << (8 * (j % 4));
            }
        }
        xq[(2 * t) * chunks + c] = make_uint4(words[0], words[1], words[2], words[3]);
        xq[(2 * t + 1) * chunks + c] = make_uint4(words[4], words[5], words[6], words[7]);
        xd[i] = !finite ? __int_as_float(0x7fc00000) : (d > 0.0f ? d : 0.0f);
        xs[i] = sum;
    }
}

__global__ void scale_rows_kernel(float* x, uint64_t ld, uint32_t n, uint32_t width, float s) {
    const uint64_t total = static_cast<uint64_t>(n) * width;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t at = (i / width) * ld + i % width;
        x[at] = __fmul_rn(x[at], s);
    }
}

__global__ void softcap_rows_kernel(float* x, uint64_t ld, uint32_t n, uint32_t width, float cap) {
    const uint64_t total = static_cast<uint64_t>(n) * width;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t at = (i / width) * ld + i % width;
        x[at] = __fmul_rn(tanhf(__fdiv_rn(x[at], cap)), cap);
    }
}

__global__ void add_inplace_kernel(float* y, const float* x, uint64_t count) {
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
        y[i] += x[i];
}

// Greedy argmax in two launches, so a 128K vocabulary is read by many blocks at once: blocks
// (b, t) each reduce a slice of row t to (value, index) in `part`; then one block per row reduces
// the slices. Ties go to the lowest index (std::max_element's choice); NaN never wins.
__device__ __forceinline__ void better(float& bv, int32_t& bi, float ov, int32_t oi) {
    if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
}

__device__ __forceinline__ void block_argmax(float& best, int32_t& idx) {
    __shared__ float bv[32];
    __shared__ int32_t bi[32];
    for (int o = 16; o > 0; o >>= 1)
        better(best, idx, __shfl_xor_sync(0xffffffffu, best, o),
               __shfl_xor_sync(0xffffffffu, idx, o));
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) bv[warp] = best, bi[warp] = idx;
    __syncthreads();
    if (warp == 0) {
        best = lane < blockDim.x / 32 ? bv[lane] : -FLT_MAX;
        idx = lane < blockDim.x / 32 ? bi[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1)
            better(best, idx, __shfl_xor_sync(0xffffffffu, best, o),
                   __shfl_xor_sync(0xffffffffu, idx, o));
    }
}

__global__ void argmax_part_kernel(const float* logits, uint64_t ld, uint32_t vocab, uint32_t slice,
                                   float2* part) {
    const float* row = logits + blockIdx.y * ld;
    const uint32_t begin = blockIdx.x * slice, end = min(vocab, begin + slice);
    float best = -FLT_MAX;
    int32_t idx = 0x7fffffff;
#pragma unroll 4
    for (uint32_t i = begin + threadIdx.x; i < end; i += blockDim.x)
        better(best, idx, __ldg(row + i), static_cast<int32_t>(i));
    block_argmax(best, idx);
    if (threadIdx.x == 0)
        part[blockIdx.y * gridDim.x + blockIdx.x] = make_float2(best, __int_as_float(idx));
}

__global__ void argmax_final_kernel(const float2* part, uint32_t parts, int32_t* out) {
    float best = -FLT_MAX;
    int32_t idx = 0x7fffffff;
    for (uint32_t i = threadIdx.x; i < parts; i += blockDim.x) {
        const float2 p = part[blockIdx.x * parts + i];
        better(best, idx, p.x, __float_as_int(p.y));
    }
    block_argmax(best, idx);
    if (threadIdx.x == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
}

__global__ void record_token_kernel(const int32_t* next, int32_t* pos, int32_t* history,
                                    uint32_t capacity, int32_t* fault) {
    if (*pos < 0 || static_cast<uint32_t>(*pos) >= capacity) {
        atomicOr(fault, kFaultPosition);
        return;
    }
    history[*pos] = *next;
    *pos += 1;
}

}  // namespace

void f32_to_f16_rows_launch(const float* x, uint64_t ldx, uint32_t m, uint32_t m_pad, uint32_t k,
                            uint16_t* x16, uint64_t ldx16, unsigned long long* saturated,
                            cudaStream_t stream) {
    f32_to_f16_rows_kernel<<<grid_for(static_cast<uint64_t>(m_pad) * ldx16), kThreads, 0, stream>>>(
        x, ldx, m, m_pad, k, x16, ldx16, saturated);
    QF_CUDA_CHECK_LAUNCH();
}

void bf16_rows_to_f32_launch(const uint16_t* w, uint64_t ldw, uint32_t n, uint32_t kpad, float* out,
                             cudaStream_t stream) {
    bf16_rows_to_f32_kernel<<<grid_for(static_cast<uint64_t>(n) * kpad), kThreads, 0, stream>>>(
        w, ldw, n, kpad, out);
    QF_CUDA_CHECK_LAUNCH();
}

void add_bias_launch(float* y, uint64_t ldy, uint32_t m, uint32_t rows, const float* bias,
                     cudaStream_t stream) {
    add_bias_kernel<<<grid_for(static_cast<uint64_t>(m) * rows), kThreads, 0, stream>>>(y, ldy, m,
                                                                                        rows, bias);
    QF_CUDA_CHECK_LAUNCH();
}

void embed_rows_launch(const RowsParams& e, const int32_t* tokens, uint32_t n, uint32_t d, float* x,
                       uint64_t ldx, cudaStream_t stream) {
    embed_rows_kernel<<<n, 128, 0, stream>>>(e, tokens, d, x, ldx);
    QF_CUDA_CHECK_LAUNCH();
}

namespace {
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void rms_norm(const float* x, uint64_t ldx, const float* w, double eps, uint32_t n, uint32_t d,
              uint32_t groups, float* out, uint64_t ldo, bool accumulate, cudaStream_t stream,
              const Int8Rows* q = nullptr) {
    if (n == 0 || groups == 0) return;
    if (q && (groups != 1 || accumulate || q->chunks != (d + 31) / 32))
        throw_cuda_error(cudaErrorInvalidValue, "rms_norm: int8 blocks of a grouped row", __FILE__,
                         __LINE__);
    if (groups > 65535)
        throw_cuda_error(cudaErrorInvalidValue, "rms_norm: more than 65535 groups", __FILE__,
                         __LINE__);
    const dim3 grid(n, groups);
    const bool vec = d % 4 == 0 && ldx % 4 == 0 && ldo % 4 == 0 && aligned16(x) && aligned16(w) &&
                     aligned16(out);
    if (q && vec) {
        const unsigned threads = static_cast<unsigned>(
            std::clamp<uint64_t>((uint64_t{q->chunks} * 8 + 31) / 32 * 32, 32, 1024));
        rms_norm_int8_kernel<<<n, threads, 0, stream>>>(x, ldx, w, eps, d, out, ldo, *q);
        QF_CUDA_CHECK_LAUNCH();
        return;
    }
    const uint32_t per_row = vec ? d / 4 : d;
    const unsigned threads = static_cast<unsigned>(
        std::clamp<uint64_t>((static_cast<uint64_t>(per_row) + 31) / 32 * 32, 32, 1024));
    if (vec)
        rms_norm_kernel<true>
            <<<grid, threads, 0, stream>>>(x, ldx, w, eps, d, out, ldo, accumulate);
    else
        rms_norm_kernel<false>
            <<<grid, threads, 0, stream>>>(x, ldx, w, eps, d, out, ldo, accumulate);
    QF_CUDA_CHECK_LAUNCH();
    if (q) quantize_chunks_launch(out, ldo, n, q->chunks, q->xq, q->xd, q->xs, stream);
}
}  // namespace

void rms_norm_launch(const float* x, uint64_t ldx, const float* w, double eps, uint32_t n,
                     uint32_t d, float* out, uint64_t ldo, cudaStream_t stream, uint32_t groups,
                     const Int8Rows* q) {
    rms_norm(x, ldx, w, eps, n, d, groups, out, ldo, false, stream, q);
}

void rms_norm_add_launch(const float* x, uint64_t ldx, const float* w, double eps, uint32_t n,
                         uint32_t d, float* out, uint64_t ldo, cudaStream_t stream,
                         uint32_t groups) {
    rms_norm(x, ldx, w, eps, n, d, groups, out, ldo, true, stream);
}

void swiglu_launch(const float* gate, const float* up, uint64_t ld, float* out, uint64_t ldo,
                   uint32_t n, uint32_t width, cudaStream_t stream, const Int8Rows* q) {
    if (q) {
        if (q->chunks != (width + 31) / 32)
            throw_cuda_error(cudaErrorInvalidValue, "swiglu: int8 chunks do not match the width",
                             __FILE__, __LINE__);
        swiglu_int8_kernel<<<grid_for(uint64_t{q->chunks} * 8 * n), kThreads, 0, stream>>>(
            gate, up, ld, out, ldo, n, width, *q);
        QF_CUDA_CHECK_LAUNCH();
        return;
    }
    swiglu_kernel<<<grid_for(static_cast<uint64_t>(n) * width), kThreads, 0, stream>>>(
        gate, up, ld, out, ldo, n, width);
    QF_CUDA_CHECK_LAUNCH();
}

void geglu_tanh_launch(const float* gate, const float* up, uint64_t ld, float* out, uint64_t ldo,
                       uint32_t n, uint32_t width, cudaStream_t stream) {
    geglu_tanh_kernel<<<grid_for(static_cast<uint64_t>(n) * width), kThreads, 0, stream>>>(
        gate, up, ld, out, ldo, n, width);
    QF_CUDA_CHECK_LAUNCH();
}

void interleave_chunks_launch(const float* x, uint64_t ldx, uint32_t m, uint32_t chunks, float* xi,
                              cudaStream_t stream) {
    interleave_chunks_kernel<<<grid_for(static_cast<uint64_t>(m) * chunks * 8), kThreads, 0,
                               stream>>>(reinterpret_cast<const float4*>(x), ldx / 4, m, chunks,
                                         reinterpret_cast<float4*>(xi));
    QF_CUDA_CHECK_LAUNCH();
}

void quantize_chunks_launch(const float* x, uint64_t ldx, uint32_t m, uint32_t chunks, void* xq,
                            float* xd, int32_t* xs, cudaStream_t stream) {
    quantize_chunks_kernel<<<grid_for(static_cast<uint64_t>(m) * chunks), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(x), ldx / 4, m, chunks, static_cast<uint4*>(xq), xd, xs);
    QF_CUDA_CHECK_LAUNCH();
}

void scale_rows_launch(float* x, uint64_t ld, uint32_t n, uint32_t width, float s,
                       cudaStream_t stream) {
    scale_rows_kernel<<<grid_for(static_cast<uint64_t>(n) * width), kThreads, 0, stream>>>(
        x, ld, n, width, s);
    QF_CUDA_CHECK_LAUNCH();
}

void softcap_rows_launch(float* x, uint64_t ld, uint32_t n, uint32_t width, float cap,
                         cudaStream_t stream) {
    softcap_rows_kernel<<<grid_for(static_cast<uint64_t>(n) * width), kThreads, 0, stream>>>(
        x, ld, n, width, cap);
    QF_CUDA_CHECK_LAUNCH();
}

void add_inplace_launch(float* y, const float* x, uint64_t count, cudaStream_t stream) {
    add_inplace_kernel<<<grid_for(count), kThreads, 0, stream>>>(y, x, count);
    QF_CUDA_CHECK_LAUNCH();
}

uint32_t argmax_parts(uint32_t vocab) {
    return std::clamp<uint32_t>((vocab + kArgmaxSlice - 1) / kArgmaxSlice, 1, kArgmaxMaxParts);
}

void argmax_rows_launch(const float* logits, uint64_t ld, uint32_t n, uint32_t vocab, int32_t* out,
                        void* scratch, cudaStream_t stream) {
    if (n == 0) return;
    const uint32_t parts = argmax_parts(vocab);
    const uint32_t slice = (vocab + parts - 1) / parts;
    auto* part = static_cast<float2*>(scratch);
    argmax_part_kernel<<<dim3(parts, n), kThreads, 0, stream>>>(logits, ld, vocab, slice, part);
    QF_CUDA_CHECK_LAUNCH();
    argmax_final_kernel<<<n, 32 * ((std::min(parts, 1024u) + 31) / 32), 0, stream>>>(part, parts,
                                                                                     out);
    QF_CUDA_CHECK_LAUNCH();
}

void record_token_launch(const int32_t* next, int32_t* pos, int32_t* history, uint32_t capacity,
                         int32_t* fault, cudaStream_t stream) {
    record_token_kernel<<<1, 1, 0, stream>>>(next, pos, history, capacity, fault);
    QF_CUDA_CHECK_LAUNCH();
}

}  // namespace qforge::cuda
