// Fused dequantize + tensor-core GEMM for prefill and batches: Y[t][n] = sum_k X[t][k] W[n][k]
// with mma.sync.m16n8k16 (fp16 inputs, fp32 accumulation).
//
// Supported configurations (the host refuses anything else before a launch, plans.hpp):
//   kinds     q4 (q4_g*, q4s_g*) and q8 (q8, q8_g*); group a multiple of 32, or one per row
//   arch      sm_80 and newer (m16n8k16 with fp32 accumulators); compiled for older
//             architectures as a trap that the host never launches
//   k, rows   any (< 2^31); tokens: any (tiles of 32; the fp16 activations are padded to 32 rows)
//
// Exactness: the B operand is (code - zero), an integer of at most 8 bits, exact in fp16, built
// from two bytes with one mask and one half2 subtraction (dequant.hpp); the group's fp32 scale is
// applied to the fp32 accumulator when the group ends. So the only rounding beyond fp32
// accumulation is the activations' rounding to fp16 (relative 2^-11).
//
// Tiling (plans.hpp: plan_mma): a block of 4 warps owns 32 weight rows x 32 tokens; warp w takes
// the w-th contiguous quarter of the block's chunk range, so each warp streams its own part of K
// with no block-level synchronisation in the main loop; the four partial tiles are summed in
// shared memory in warp order. When row and token tiles alone do not fill the GPU, K is split
// over gridDim.z blocks writing [split][m][rows] partials that splitk_reduce sums in split order.
// Fragment layouts are PTX's for m16n8k16 (groupID g = lane / 4, tq = lane % 4):
//   A (tokens x k, row-major): a0 (g, 2tq..+1), a1 (g+8, 2tq..+1), a2 (g, 2tq+8..+9), a3 (g+8, ..)
//   B (k x rows, "col"):       b0 (k = 2tq..+1, n = g), b1 (k = 2tq+8..+9, n = g)
//   C (tokens x rows):         c0,c1 (g, 2tq..+1), c2,c3 (g+8, 2tq..+1)
// A 4-bit chunk's byte i holds weights i and i + 16, so the two bytes at 2tq (and 2tq + 8) give a
// thread its B pairs for both k-steps of the chunk: low nibbles for k 0..15, high for 16..31.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/dequant.hpp"
#include "kernels/cuda/launchers.hpp"

namespace qforge::cuda {

namespace {

constexpr int kTileRows = 32, kTileTokens = 32, kWarps = 4;

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();  // the host never launches this kernel below sm_80
#endif
}

__device__ __forceinline__ uint32_t hsub2_bits(uint32_t a, uint32_t b) {
    const __half2 r =
        __hsub2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t ld_u32(const uint16_t* p) {
    return __ldg(reinterpret_cast<const unsigned int*>(p));
}
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
}

template <WeightKind K>
__global__ void __launch_bounds__(128) mma_kernel(MmaParams p) {
    constexpr bool kEight = K == WeightKind::q8;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    const uint32_t n0 = blockIdx.x * kTileRows, t0 = blockIdx.y * kTileTokens;
    const uint32_t split = blockIdx.z;
    const uint32_t cb = split * p.chunks_per_split;
    const uint32_t ce = min(p.w.chunks, cb + p.chunks_per_split);
    const uint32_t len = ce - cb;
    const uint32_t wb = cb + (len * warp) / kWarps, we = cb + (len * (warp + 1)) / kWarps;

    // B fragment rows n0 + 8j + g; scale (C column) rows n0 + 8j + 2tq + e.
    const uint8_t* brow[4];
    bool bvalid[4];
    const uint8_t* srow[4][2];
    bool svalid[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint32_t n = n0 + 8 * j + g;
        bvalid[j] = n < p.w.rows;
        brow[j] = p.w.w + static_cast<uint64_t>(bvalid[j] ? n : n0) * p.w.row_bytes;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const uint32_t ns = n0 + 8 * j + 2 * tq + e;
            svalid[j][e] = ns < p.w.rows;
            srow[j][e] = p.w.w + static_cast<uint64_t>(svalid[j][e] ? ns : n0) * p.w.row_bytes;
        }
    }
    const uint16_t* xa[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            xa[mt][h] = p.x16 + static_cast<uint64_t>(t0 + 16 * mt + g + 8 * h) * p.ldx16 + 2 * tq;

    float acc[2][4][4], part[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = part[mt][j][e] = 0.0f;

    float sc[4][2];
    uint32_t zpair[4];
    uint32_t cur = 0xffffffffu;
    auto fold = [&]() {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[mt][j][e] = fmaf(sc[j][e & 1], part[mt][j][e], acc[mt][j][e]);
                    part[mt][j][e] = 0.0f;
                }
    };

    for (uint32_t c = wb; c < we; ++c) {
        const uint32_t grp = c / p.w.chunks_per_group;
        if (grp != cur) {
            if (cur != 0xffffffffu) fold();
            cur = grp;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    sc[j][e] = svalid[j][e] ? f16_bits_to_float(static_cast<uint16_t>(
                                                  ld_u16(srow[j][e] + p.w.scales_offset + 2 * grp)))
                                            : 0.0f;
                const int32_t z =
                    p.w.has_zeros ? static_cast<int32_t>(__ldg(brow[j] + p.w.zeros_offset + grp))
                                  : p.w.zero;
                const uint32_t zb = pair_zero_bits(kEight, z);
                zpair[j] = zb | (zb << 16);
            }
        }
        uint32_t a[2][2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                const uint16_t* r0 = xa[mt][0] + static_cast<uint64_t>(c) * 32 + 16 * ks;
                const uint16_t* r1 = xa[mt][1] + static_cast<uint64_t>(c) * 32 + 16 * ks;
                a[mt][ks][0] = ld_u32(r0);
                a[mt][ks][1] = ld_u32(r1);
                a[mt][ks][2] = ld_u32(r0 + 8);
                a[mt][ks][3] = ld_u32(r1 + 8);
            }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint32_t b[2][2] = {{0, 0}, {0, 0}};
            if (bvalid[j]) {
                if constexpr (kEight) {
                    const uint8_t* q = brow[j] + static_cast<uint64_t>(c) * 32 + 2 * tq;
                    b[0][0] = hsub2_bits(q8_pair(ld_u16(q)), zpair[j]);
                    b[0][1] = hsub2_bits(q8_pair(ld_u16(q + 8)), zpair[j]);
                    b[1][0] = hsub2_bits(q8_pair(ld_u16(q + 16)), zpair[j]);
                    b[1][1] = hsub2_bits(q8_pair(ld_u16(q + 24)), zpair[j]);
                } else {
                    const uint8_t* q = brow[j] + static_cast<uint64_t>(c) * 16 + 2 * tq;
                    const uint32_t ua = ld_u16(q), ub = ld_u16(q + 8);
                    b[0][0] = hsub2_bits(q4_pair_low(ua), zpair[j]);
                    b[0][1] = hsub2_bits(q4_pair_low(ub), zpair[j]);
                    b[1][0] = hsub2_bits(q4_pair_high(ua), zpair[j]);
                    b[1][1] = hsub2_bits(q4_pair_high(ub), zpair[j]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int ks = 0; ks < 2; ++ks) mma16816(part[mt][j], a[mt][ks], b[ks][0], b[ks][1]);
        }
    }
    if (cur != 0xffffffffu) fold();

    // Sum the four warps' tiles in warp order; [warp][token][row], rows padded against conflicts.
    __shared__ float red[kWarps][kTileTokens][kTileRows + 1];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                red[warp][16 * mt + g + 8 * (e >> 1)][8 * j + 2 * tq + (e & 1)] = acc[mt][j][e];
    __syncthreads();
    for (int i = threadIdx.x; i < kTileTokens * kTileRows; i += blockDim.x) {
        const int tl = i / kTileRows, rl = i % kTileRows;
        const uint32_t t = t0 + tl, n = n0 + rl;
        if (t >= p.m || n >= p.w.rows) continue;
        float s = red[0][tl][rl];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) s += red[w][tl][rl];
        if (p.splits > 1) {
            p.workspace[(static_cast<uint64_t>(split) * p.m + t) * p.w.rows + n] = s;
        } else {
            if (p.out.bias) s += p.out.bias[n];
            float* y = p.out.y + static_cast<uint64_t>(t) * p.out.ldo + n;
            *y = p.out.accumulate ? *y + s : s;
        }
    }
}

__global__ void splitk_reduce_kernel(const float* ws, uint32_t splits, uint32_t m, uint32_t rows,
                                     OutParams out) {
    const uint64_t total = static_cast<uint64_t>(m) * rows;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t t = i / rows, n = i % rows;
        float s = 0.0f;
        for (uint32_t k = 0; k < splits; ++k) s += ws[k * total + i];
        if (out.bias) s += out.bias[n];
        float* y = out.y + t * out.ldo + n;
        *y = out.accumulate ? *y + s : s;
    }
}

}  // namespace

void mma_gemm_launch(const MmaParams& p, uint32_t row_tiles, uint32_t token_tiles,
                     cudaStream_t stream) {
    const dim3 grid(row_tiles, token_tiles, p.splits), block(32 * kWarps);
    switch (p.w.kind) {
        case WeightKind::q4:
            mma_kernel<WeightKind::q4><<<grid, block, 0, stream>>>(p);
            break;
        case WeightKind::q8:
            mma_kernel<WeightKind::q8><<<grid, block, 0, stream>>>(p);
            break;
        default:
            throw_cuda_error(cudaErrorInvalidValue, "mma_gemm_launch: not a quantized kind",
                             __FILE__, __LINE__);
    }
    QF_CUDA_CHECK_LAUNCH();
}

void splitk_reduce_launch(const float* workspace, uint32_t splits, uint32_t m, uint32_t rows,
                          const OutParams& out, cudaStream_t stream) {
    const uint64_t total = static_cast<uint64_t>(m) * rows;
    const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>((total + 255) / 256, 65535));
    splitk_reduce_kernel<<<blocks, 256, 0, stream>>>(workspace, splits, m, rows, out);
    QF_CUDA_CHECK_LAUNCH();
}

}  // namespace qforge::cuda
