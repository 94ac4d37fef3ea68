// Matrix-vector products for decode (and batches of up to 8 tokens): weights read once with
// 16-byte coalesced loads and dequantized in registers; fp32 accumulation.
//
// Two activation modes (launchers.hpp: GemvParams), prepared by one small kernel per pass:
//   f32   the activations chunk-interleaved, so the threads of a warp, which walk consecutive
//         chunks, read them coalesced; a chunk of a quantized row is dequantized as exact
//         (code - zero) floats (dequant.hpp), dotted with the activations, and scaled once:
//         acc += scale * partial. Exact products (any kind).
//   int8  q4/q8 rows: the CPU's int8 activation blocks; a chunk is an exact integer dot product
//         (dp4a, 4 codes per instruction, no float operation per weight), acc += (scale * d) *
//         (isum - zero * sum): the same formula as the CPU's default (kernels/cpu/qdot.hpp).
//
// Supported configurations (anything else is refused on the host before a launch):
//   kinds     q4 (q4_g*, q4s_g*), q8 (q8, q8_g*), f16, bf16, f32 (gpu_format.hpp's table)
//   k         any (rows are walked in 32-weight chunks; weights past k are zero), k < 2^31
//   rows      any, < 2^31
//   tokens    1 .. 8 per launch (compiled tiles 1, 2, 4, 8; the host runs passes for more)
//   threads   a multiple of 32 up to 256 (plans.hpp: plan_gemv)
//
// Work split: a block owns R rows (q4: 4, q8: 2, floats: 1, so each thread loads 64 bytes of
// weights per chunk step and reuses each activation load R times); its threads take the row's
// chunks round-robin (thread i: chunks i, i + threads, ...), so a warp's loads of one row are 32
// consecutive 16-byte pieces. Partial sums are reduced with warp shuffles and then across warps
// in a fixed order: results are deterministic (no atomics).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/dequant.hpp"
#include "kernels/cuda/launchers.hpp"
#include "kernels/cuda/pdl.cuh"

namespace qforge::cuda::gemv_detail {

template <WeightKind K>
struct Kind;
// R rows per block; V 16-byte loads per row per chunk.
template <>
struct Kind<WeightKind::q4> {
    static constexpr int R = 4, V = 1;
    static constexpr bool quant = true;
};
template <>
struct Kind<WeightKind::q8> {
    static constexpr int R = 2, V = 2;
    static constexpr bool quant = true;
};
template <>
struct Kind<WeightKind::f16> {
    static constexpr int R = 1, V = 4;
    static constexpr bool quant = false;
};
template <>
struct Kind<WeightKind::bf16> {
    static constexpr int R = 1, V = 4;
    static constexpr bool quant = false;
};
template <>
struct Kind<WeightKind::f32> {
    static constexpr int R = 1, V = 8;
    static constexpr bool quant = false;
};

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Slice j (0..3) of a chunk: 8 weights, the first four at chunk positions pa .. pa+3 and the
// last four at pb .. pb+3 (q4: 4j and 16 + 4j, the low and high nibbles of word j; others: 8j and
// 8j + 4). Quantized kinds give (code - zero); float kinds give the weights.
template <WeightKind K>
__device__ __forceinline__ void slice(const uint4 (&v)[Kind<K>::V], int j, float zm, float w[8]) {
    if constexpr (K == WeightKind::q4) {
        q4_word_codes(word(v[0], j), zm, w, w + 4);
    } else if constexpr (K == WeightKind::q8) {
        q8_word_codes(word(v[j / 2], (2 * j) % 4), zm, w);
        q8_word_codes(word(v[j / 2], (2 * j) % 4 + 1), zm, w + 4);
    } else if constexpr (K == WeightKind::f16 || K == WeightKind::bf16) {
        for (int i = 0; i < 4; ++i) {
            const uint32_t u = word(v[j], i);
            if constexpr (K == WeightKind::f16) {
                w[2 * i] = f16_bits_to_float(static_cast<uint16_t>(u & 0xffffu));
                w[2 * i + 1] = f16_bits_to_float(static_cast<uint16_t>(u >> 16));
            } else {
                w[2 * i] = u32_as_float(u << 16);
                w[2 * i + 1] = u32_as_float(u & 0xffff0000u);
            }
        }
    } else {
        for (int i = 0; i < 4; ++i) {
            w[i] = u32_as_float(word(v[2 * j], i));
            w[4 + i] = u32_as_float(word(v[2 * j + 1], i));
        }
    }
}

template <WeightKind K>
__device__ __forceinline__ int slice_offset_a(int j) {
    return K == WeightKind::q4 ? 4 * j : 8 * j;
}
template <WeightKind K>
__device__ __forceinline__ int slice_offset_b(int j) {
    return K == WeightKind::q4 ? 16 + 4 * j : 8 * j + 4;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One chunk of the block's R rows, loaded: codes (or float elements), scales and zero constants;
// with Mins (super rows, gpu_format.hpp: q4 codes, f32 scale and min per chunk) the mins too.
template <WeightKind K, int R, bool Mins>
struct Chunk {
    uint4 v[R][Kind<K>::V];
    float scale[R], zm[R];
    int32_t zero[R];  // quantized: the zero code (int8 mode)
    float min[Mins ? R : 1];
};

template <WeightKind K, int R, bool Mins>
__device__ __forceinline__ void load_chunk(const GemvParams& p, const uint8_t* const (&rowp)[R],
                                           const bool (&valid)[R], uint32_t c, bool present,
                                           Chunk<K, R, Mins>& d) {
    constexpr int V = Kind<K>::V;
    constexpr uint32_t kChunkBytes = 16 * V;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < V; ++i)
            d.v[r][i] = valid[r] && present
                            ? __ldcs(reinterpret_cast<const uint4*>(
                                         rowp[r] + static_cast<uint64_t>(c) * kChunkBytes) +
                                     i)
                            : make_uint4(0, 0, 0, 0);
    if constexpr (Mins) {  // super rows: a group is a chunk, its scale and min f32
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint32_t g = present ? c : 0;
            const auto* sc = reinterpret_cast<const float*>(rowp[r] + p.w.scales_offset);
            const auto* mn = reinterpret_cast<const float*>(rowp[r] + p.w.mins_offset);
            d.scale[r] = valid[r] ? __ldg(sc + g) : 0.0f;
            d.min[r] = valid[r] ? __ldg(mn + g) : 0.0f;
            d.zm[r] = zero_magic(false, 0);
            d.zero[r] = 0;
        }
    } else if constexpr (Kind<K>::quant) {
        const uint32_t g = present ? c / p.w.chunks_per_group : 0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint16_t s =
                __ldg(reinterpret_cast<const unsigned short*>(rowp[r] + p.w.scales_offset) + g);
            d.scale[r] = valid[r] ? f16_bits_to_float(s) : 0.0f;
            const int32_t z = p.w.has_zeros
                                  ? static_cast<int32_t>(__ldg(rowp[r] + p.w.zeros_offset + g))
                                  : p.w.zero;
            d.zm[r] = zero_magic(K == WeightKind::q8, z);
            d.zero[r] = z;
        }
    } else {
#pragma unroll
        for (int r = 0; r < R; ++r) d.scale[r] = 1.0f, d.zm[r] = 0.0f;
    }
}

// acc[r][t] += scale_r * (chunk c of row r . chunk c of token t's activations) (super rows:
// less min_r * the sum of those activations).
template <WeightKind K, int M, int R, bool Mins>
__device__ __forceinline__ void accumulate_chunk(const GemvParams& p, const Chunk<K, R, Mins>& d,
                                                 uint32_t c, float (&acc)[R][M]) {
    float part[R][M], xsum[M];
#pragma unroll
    for (int t = 0; t < M; ++t) xsum[t] = 0.0f;

#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < M; ++t) part[r][t] = 0.0f;
    // Chunk c's float4 q of token t: xc4[t * ldx / 4 + q * chunks] (the interleaved layout).
    const float4* xc4 = reinterpret_cast<const float4*>(p.x) + c;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float w[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) slice<K>(d.v[r], j, d.zm[r], w[r]);
        const uint32_t qa = slice_offset_a<K>(j) / 4, qb = slice_offset_b<K>(j) / 4;
#pragma unroll
        for (int t = 0; t < M; ++t) {
            if (t < static_cast<int>(p.m)) {
                const float4* xt = xc4 + static_cast<uint64_t>(t) * (p.ldx / 4);
                const float4 a = __ldg(xt + qa * p.w.chunks);
                const float4 b = __ldg(xt + qb * p.w.chunks);
                if constexpr (Mins)
                    xsum[t] += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float s = part[r][t];
                    s = fmaf(w[r][0], a.x, s);
                    s = fmaf(w[r][1], a.y, s);
                    s = fmaf(w[r][2], a.z, s);
                    s = fmaf(w[r][3], a.w, s);
                    s = fmaf(w[r][4], b.x, s);
                    s = fmaf(w[r][5], b.y, s);
                    s = fmaf(w[r][6], b.z, s);
                    s = fmaf(w[r][7], b.w, s);
                    part[r][t] = s;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < M; ++t) {
            acc[r][t] = fmaf(d.scale[r], part[r][t], acc[r][t]);
            if constexpr (Mins) acc[r][t] = fmaf(-d.min[r], xsum[t], acc[r][t]);
        }
}

// int8 mode: acc[r][t] += (scale_r * d_t) * (codes of chunk c of row r . token t's int8 codes -
// zero_r * sum_t), the integer dot product exact (|isum| < 2^24, so its float is exact too).
// Super rows (Mins): then less min_r * (d_t * sum_t), the reference's order for its mins.
template <WeightKind K, int M, int R, bool Mins>
__device__ __forceinline__ void accumulate_chunk_i8(const GemvParams& p, const Chunk<K, R, Mins>& d,
                                                    uint32_t c, float (&acc)[R][M]) {
    static_assert(K == WeightKind::q4 || K == WeightKind::q8, "int8 mode reads quantized rows");
#pragma unroll
    for (int t = 0; t < M; ++t) {
        if (t >= static_cast<int>(p.m)) continue;
        const uint64_t at = static_cast<uint64_t>(t) * p.w.chunks + c;
        const uint4 lo = __ldg(p.xq + 2 * static_cast<uint64_t>(t) * p.w.chunks + c);
        const uint4 hi = __ldg(p.xq + (2 * static_cast<uint64_t>(t) + 1) * p.w.chunks + c);
        const float dx = __ldg(p.xd + at);
        const int32_t sx = __ldg(p.xs + at);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            int32_t isum = 0;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if constexpr (K == WeightKind::q4) {
                    // word j: weights 4j..4j+3 in the low nibbles, 16+4j..16+4j+3 in the high
                    const uint32_t w = word(d.v[r][0], j);
                    isum = __dp4a(static_cast<int>(w & 0x0F0F0F0Fu), static_cast<int>(word(lo, j)),
                                  isum);
                    isum = __dp4a(static_cast<int>((w >> 4) & 0x0F0F0F0Fu),
                                  static_cast<int>(word(hi, j)), isum);
                } else {
                    // signed codes, weights 4j.. in v[0], 16+4j.. in v[1]
                    isum = __dp4a(static_cast<int>(word(d.v[r][0], j)),
                                  static_cast<int>(word(lo, j)), isum);
                    isum = __dp4a(static_cast<int>(word(d.v[r][1], j)),
                                  static_cast<int>(word(hi, j)), isum);
                }
            }
            isum -= d.zero[r] * sx;
            acc[r][t] = fmaf(d.scale[r] * dx, static_cast<float>(isum), acc[r][t]);
            if constexpr (Mins) acc[r][t] -= d.min[r] * (dx * static_cast<float>(sx));
        }
    }
}

template <WeightKind K, int M, bool I8, int R, bool Mins = false>
__global__ void __launch_bounds__(256) gemv_kernel(GemvParams p) {
    // Decode (1-2 tokens): two chunks' loads in flight per thread before either is used, so a
    // thread with two chunk steps waits for memory once.
    constexpr int D = M <= 2 ? 2 : 1;
    const uint32_t row0 = blockIdx.x * R;

    const uint8_t* rowp[R];
    bool valid[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        valid[r] = row0 + r < p.w.rows;
        rowp[r] = p.w.w + static_cast<uint64_t>(valid[r] ? row0 + r : row0) * p.w.row_bytes;
    }
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < M; ++t) acc[r][t] = 0.0f;

    pdl_trigger();  // a GEMV after this one (q, k, v unfused) may start loading its weights
    // The first step's weights are loaded before waiting for the kernels this one depends on
    // (pdl.cuh): no kernel writes weights, and their loads overlap the end of the previous one.
    Chunk<K, R, Mins> ch[D];
    auto load = [&](uint32_t c) {
#pragma unroll
        for (int u = 0; u < D; ++u) {
            const uint32_t cu = c + u * blockDim.x;
            load_chunk<K, R, Mins>(p, rowp, valid, cu, cu < p.w.chunks, ch[u]);
        }
    };
    load(threadIdx.x);
    pdl_wait();
    for (uint32_t c = threadIdx.x; c < p.w.chunks; c += D * blockDim.x) {
#pragma unroll
        for (int u = 0; u < D; ++u) {
            const uint32_t cu = c + u * blockDim.x;
            if (cu < p.w.chunks) {
                if constexpr (I8)
                    accumulate_chunk_i8<K, M, R, Mins>(p, ch[u], cu, acc);
                else
                    accumulate_chunk<K, M, R, Mins>(p, ch[u], cu, acc);
            }
        }
        if (c + D * blockDim.x < p.w.chunks) load(c + D * blockDim.x);
    }

    __shared__ float red[256 / 32][R * M];
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < M; ++t) {
            const float s = warp_sum(acc[r][t]);
            if (lane == 0) red[warp][r * M + t] = s;
        }
    __syncthreads();
    if (threadIdx.x < R * M) {
        const uint32_t r = threadIdx.x / M, t = threadIdx.x % M;
        const uint32_t row = row0 + r;
        if (row < p.w.rows && t < p.m) {
            float s = 0.0f;
            for (uint32_t w = 0; w < blockDim.x / 32; ++w) s += red[w][threadIdx.x];
            if (p.out.bias) s += p.out.bias[row];
            float* y = p.out.y + static_cast<uint64_t>(t) * p.out.ldo + row;
            *y = p.out.accumulate ? *y + s : s;
        }
    }
}

// With p.overlap (sm_90+), a programmatic dependent launch (pdl.cuh).
template <WeightKind K, int M, int R>
void launch_tile(const GemvParams& p, uint32_t threads, uint64_t blocks, cudaStream_t stream) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(threads);
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = p.overlap ? 1 : 0;
    if constexpr (K == WeightKind::q4) {
        if (p.w.mins_offset) {  // super rows
            if (p.xq)
                QF_CUDA_CHECK(cudaLaunchKernelEx(&config, gemv_kernel<K, M, true, R, true>, p));
            else
                QF_CUDA_CHECK(cudaLaunchKernelEx(&config, gemv_kernel<K, M, false, R, true>, p));
            return;
        }
    }
    if constexpr (K == WeightKind::q4 || K == WeightKind::q8) {
        if (p.xq) {
            QF_CUDA_CHECK(cudaLaunchKernelEx(&config, gemv_kernel<K, M, true, R>, p));
            return;
        }
    }
    QF_CUDA_CHECK(cudaLaunchKernelEx(&config, gemv_kernel<K, M, false, R>, p));
}

// `rows`: rows per block, Kind<K>::R, or 2 for q4 at 1-2 tokens (half the registers a thread
// holds, so twice the blocks fit an SM).
template <WeightKind K>
void launch_kind(const GemvParams& p, uint32_t threads, uint32_t token_tile, uint64_t blocks,
                 uint32_t rows, cudaStream_t stream) {
    constexpr int R = Kind<K>::R;
    if constexpr (K == WeightKind::q4) {
        if (rows == 2 && token_tile <= 2) {
            if (token_tile == 1)
                launch_tile<K, 1, 2>(p, threads, blocks, stream);
            else
                launch_tile<K, 2, 2>(p, threads, blocks, stream);
            QF_CUDA_CHECK_LAUNCH();
            return;
        }
    }
    if (rows != R)
        throw_cuda_error(cudaErrorInvalidValue, "gemv: rows per block not compiled", __FILE__,
                         __LINE__);
    switch (token_tile) {
        case 1:
            launch_tile<K, 1, R>(p, threads, blocks, stream);
            break;
        case 2:
            launch_tile<K, 2, R>(p, threads, blocks, stream);
            break;
        case 4:
            launch_tile<K, 4, R>(p, threads, blocks, stream);
            break;
        default:
            launch_tile<K, 8, R>(p, threads, blocks, stream);
            break;
    }
    QF_CUDA_CHECK_LAUNCH();
}

}  // namespace qforge::cuda::gemv_detail
