// RoPE with the fp16 KV-cache write, and causal grouped-query attention over that cache, for
// prefill (n tokens) and decode (one token) alike.
//
// Supported configurations (plans.hpp: check_attention_config refuses the rest on the host):
//   head_dim  even, at most 256 (a lane of a warp holds ceil(head_dim / 32) <= 8 dimensions;
//             compiled for 1, 2, 4, 8 per lane)
//   heads     num_heads a multiple of num_kv_heads (GQA; MHA when equal)
//   context   any length: an online softmax streams the cache once, no scores buffer;
//             a sliding window (AttentionParams::window) starts the keys at pos - window + 1
//   scores    times AttentionParams::scale (head_dim^-1/2 when 0; Gemma's
//             query_pre_attn_scalar^-1/2), then soft-capped when softcap > 0 (gemma2)
//   cache     fp16 keys and values, [position][kv_heads * head_dim] per layer; positions come
//             from a device integer (pos0), so a captured CUDA graph serves every decode step;
//             a position outside [0, capacity) touches nothing and raises the fault word.
//             A batched step's rows each name their own cache and position (CacheRow), so one
//             launch serves the decode tokens of many sequences
//
// RoPE computes exactly the CPU's products and differences (rounded separately, no fused
// multiply-add), so rotated q and k equal the CPU's before the fp16 rounding of the cache.
// Attention: one block of 4 warps per (token, query head); warp w takes keys w, w + 4, ...,
// keeping a running maximum, sum and weighted value sum; the four are merged at the end.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/f16_saturate.cuh"
#include "kernels/cuda/int8_rows.cuh"
#include "kernels/cuda/launchers.hpp"
#include "kernels/cuda/pdl.cuh"

namespace qforge::cuda {

namespace {

constexpr int kAttnWarps = 4;

// Row t's cache of this layer and its position: the params' one cache at pos0 + t, or the row's
// own (CacheRow), contiguous or paged (kv_layout.hpp). key(pos) and value(pos) are the position's
// rows of kv_dim halves.
template <class H>
struct RowCache {
    H* k;                    // contiguous: this layer's keys; paged: the pool
    H* v;                    // contiguous: this layer's values
    const uint32_t* blocks;  // paged: the block table; null when contiguous
    uint64_t block_halves, kvd;
    uint32_t block_shift, layer;
    int64_t at;
    uint32_t capacity;
    __device__ __forceinline__ H* row(uint32_t which, uint64_t pos) const {
        if (blocks)
            return k + paged_row_offset(blocks[pos >> block_shift], block_halves, layer, which, pos,
                                        block_shift, kvd);
        return (which ? v : k) + pos * kvd;
    }
    __device__ __forceinline__ H* key(uint64_t pos) const { return row(0, pos); }
    __device__ __forceinline__ H* value(uint64_t pos) const { return row(1, pos); }
};
template <class H, class P>
__device__ __forceinline__ RowCache<H> row_cache(const P& p, uint32_t t) {
    const uint64_t kvd = static_cast<uint64_t>(p.kv_heads) * p.head_dim;
    if (p.rows) {
        const CacheRow r = p.rows[t];
        const int64_t at = static_cast<int64_t>(r.pos);
        const uint32_t capacity = min(r.capacity, p.capacity);
        if (r.blocks)
            return {r.k,           nullptr, r.blocks, r.block_halves, kvd,
                    r.block_shift, p.layer, at,       capacity};
        const uint64_t off = static_cast<uint64_t>(p.layer) * r.layer_stride;
        return {r.k + off, r.v + off, nullptr, 0, kvd, 0, 0, at, capacity};
    }
    return {p.k_cache, p.v_cache, nullptr, 0, kvd, 0, 0, static_cast<int64_t>(*p.pos0) + t,
            p.capacity};
}

// Block (t, h): head h of token t, one thread per rotated pair (i, i + head_dim / 2). Heads
// [0, heads) are q, [heads, heads + kv_heads) k (rotated, then stored), the rest v (stored).
__global__ void rope_store_kv_kernel(RopeParams p) {
    const uint32_t t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
    const RowCache<uint16_t> rc = row_cache<uint16_t>(p, t);
    const int64_t at = rc.at;
    if (at < 0 || at >= rc.capacity) {
        if (i == 0 && h == 0) atomicOr(p.fault, kFaultPosition);
        return;
    }
    const uint64_t pos = static_cast<uint64_t>(at);
    const uint32_t half = p.head_dim / 2;
    float* x = p.qkv + t * p.ld + static_cast<uint64_t>(h) * p.head_dim;  // k follows q, v k
    if (h >= p.heads + p.kv_heads) {
        uint16_t* vc = rc.value(pos) + (h - p.heads - p.kv_heads) * p.head_dim;
        vc[i] = f16_saturate(x[i], p.saturated);
        vc[i + half] = f16_saturate(x[i + half], p.saturated);
        return;
    }
    const float cs = p.cos[pos * half + i], sn = p.sin[pos * half + i];
    const float a = x[i], b = x[i + half];
    const float ra = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
    const float rb = __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
    x[i] = ra;
    x[i + half] = rb;
    if (h >= p.heads) {
        uint16_t* kc = rc.key(pos) + (h - p.heads) * p.head_dim;
        kc[i] = f16_saturate(ra, p.saturated);
        kc[i + half] = f16_saturate(rb, p.saturated);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Head h of token t's result, lane l's dimensions [l * D, l * D + D) (those below head_dim), to
// the output; with p.q8 (4 dimensions per lane: 8 lanes a chunk, int8_rows.cuh) also their int8
// blocks. Every lane of the warp calls it.
template <int D>
__device__ __forceinline__ void store_head(const AttentionParams& p, uint32_t t, uint32_t h,
                                           const float (&res)[D], uint32_t lane) {
    const uint32_t hd = p.head_dim;
    float* out = p.out + t * p.ldo + static_cast<uint64_t>(h) * hd;
#pragma unroll
    for (int i = 0; i < D; ++i)
        if (lane * D + i < hd) out[lane * D + i] = res[i];
    if constexpr (D == 4) {
        if (p.q8.chunks)
            quantize_chunk_lanes(make_float4(res[0], res[1], res[2], res[3]), lane * 4 < hd, p.q8,
                                 t, (h * hd) / 32 + lane / 8);
    }
}

// Lane l holds dimensions [l * D, l * D + D) of the head (those below head_dim).
template <int D>
__global__ void __launch_bounds__(32 * kAttnWarps) attention_kernel(AttentionParams p) {
    pdl_trigger();  // the GEMV after this one may start loading its weights (pdl.cuh)
    const uint32_t t = blockIdx.x, h = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t hd = p.head_dim;
    const uint32_t kvh = h / (p.heads / p.kv_heads);
    const RowCache<const uint16_t> rc = row_cache<const uint16_t>(p, t);
    const int64_t at = rc.at;
    if (at < 0 || at >= rc.capacity) {  // out is left as it was: the step is reported invalid
        if (threadIdx.x == 0) atomicOr(p.fault, kFaultPosition);
        return;
    }
    const uint64_t len = static_cast<uint64_t>(at) + 1;  // causal: keys 0 .. pos
    const uint64_t first = p.window && len > p.window ? len - p.window : 0;  // sliding window
    const float scale =
        p.scale > 0.0f ? p.scale : static_cast<float>(1.0 / sqrt(static_cast<double>(hd)));

    const float* q = p.qkv + t * p.ld + static_cast<uint64_t>(h) * hd;
    float qv[D], o[D];
#pragma unroll
    for (int i = 0; i < D; ++i) {
        const uint32_t d = lane * D + i;
        qv[i] = d < hd ? q[d] : 0.0f;
        o[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (uint64_t j = first + warp; j < len; j += kAttnWarps) {
        const uint16_t* kr = rc.key(j) + static_cast<uint64_t>(kvh) * hd;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const uint32_t d = lane * D + i;
            if (d < hd) s = fmaf(qv[i], __half2float(__ushort_as_half(kr[d])), s);
        }
        s = warp_sum(s) * scale;
        // gemma2: the CPU's tanh(s / cap) * cap, before the softmax (every lane holds s).
        if (p.softcap > 0.0f) s = __fmul_rn(tanhf(__fdiv_rn(s, p.softcap)), p.softcap);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), e = expf(s - m_new);
        l = l * corr + e;
        const uint16_t* vr = rc.value(j) + static_cast<uint64_t>(kvh) * hd;
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const uint32_t d = lane * D + i;
            const float vv = d < hd ? __half2float(__ushort_as_half(vr[d])) : 0.0f;
            o[i] = fmaf(e, vv, o[i] * corr);
        }
        m = m_new;
    }

    __shared__ float sm[kAttnWarps], sl[kAttnWarps];
    __shared__ float so[kAttnWarps][32 * D];
    if (lane == 0) sm[warp] = m, sl[warp] = l;
#pragma unroll
    for (int i = 0; i < D; ++i) so[warp][lane * D + i] = o[i];
    __syncthreads();
    if (warp == 0) {
        float mx = sm[0];
        for (int w = 1; w < kAttnWarps; ++w) mx = fmaxf(mx, sm[w]);
        float f[kAttnWarps], total = 0.0f;
        for (int w = 0; w < kAttnWarps; ++w) {
            f[w] = sl[w] > 0.0f ? expf(sm[w] - mx) : 0.0f;
            total += sl[w] * f[w];
        }
        const float inv = 1.0f / total;
        float res[D];
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const uint32_t d = lane * D + i;
            res[i] = 0.0f;
            if (d >= hd) continue;
            float acc = 0.0f;
            for (int w = 0; w < kAttnWarps; ++w) acc = fmaf(f[w], so[w][d], acc);
            res[i] = acc * inv;
        }
        store_head<D>(p, t, h, res, lane);
    }
}

// ---- split (flash-decoding) attention ------------------------------------------------------
// Block (slice, KV head x tile, token): G query heads of one KV head (tile `tile` of its group),
// keys and values of positions [slice * split_len, + split_len) within the causal window; warp w
// takes keys w, w + 4, ... of the slice, each key and value loaded once for the G heads. Every
// warp writes its partial (m, l, o[head_dim]) per head to the workspace: partial
// (slice * 4 + warp) of (token, head), kAttnMaxSplits * 4 partials apart.
static_assert(kAttnWarps == 4, "plans.cpp: attention_workspace_floats counts 4 partials a slice");
constexpr uint32_t kPartials = kAttnMaxSplits * kAttnWarps;

__device__ __forceinline__ float* partial_at(const AttentionParams& p, uint32_t t, uint32_t h,
                                             uint32_t i) {
    return p.workspace +
           ((static_cast<uint64_t>(t) * p.heads + h) * kPartials + i) * (p.head_dim + 2);
}

// One warp merges the partials of (token t, head h) as attention_kernel merges its warps (an
// empty partial, l = 0, weighs nothing), in partial order: the result does not depend on which
// block merges. Partials are read through L2 (__ldcg): other blocks wrote them. The lanes read the
// (m, l) of 32 partials at once and pass each one's weight f = exp(m - max) by shuffle, so the
// loop over partials waits on no load before issuing the next values' loads (one dependent L2
// round trip per partial made the merge most of a 4K-context layer's 86 us); the sums are the
// same operations in the same order as one lane walking the partials, so the same bits.
template <int D>
__device__ void merge_partials(const AttentionParams& p, uint32_t t, uint32_t h, uint32_t parts,
                               uint32_t lane) {
    const uint32_t hd = p.head_dim;
    float mx = -INFINITY;
    for (uint32_t i = lane; i < parts; i += 32) {
        const float* part = partial_at(p, t, h, i);
        if (__ldcg(part + 1) > 0.0f) mx = fmaxf(mx, __ldcg(part));
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float total = 0.0f, acc[D];
#pragma unroll
    for (int i = 0; i < D; ++i) acc[i] = 0.0f;
    for (uint32_t base = 0; base < parts; base += 32) {
        // Lane j holds partial base + j's weight and l (both 0 when it is empty or past the end).
        float f = 0.0f, lw = 0.0f;
        if (base + lane < parts) {
            const float* part = partial_at(p, t, h, base + lane);
            const float l = __ldcg(part + 1);
            // An empty partial (a slice past the position; l = 0, o = 0) would add exact zeros:
            // its values are not read (a short context in a large cache has mostly empty slices).
            if (l > 0.0f) {
                f = expf(__ldcg(part) - mx);
                lw = l;
            }
        }
        const uint32_t n = min(32u, parts - base);
        for (uint32_t j = 0; j < n; ++j) {
            const float fj = __shfl_sync(0xffffffffu, f, static_cast<int>(j));
            const float lj = __shfl_sync(0xffffffffu, lw, static_cast<int>(j));
            if (!(lj > 0.0f)) continue;  // the same for every lane
            total += lj * fj;
            const float* part = partial_at(p, t, h, base + j);
#pragma unroll
            for (int k = 0; k < D; ++k) {
                const uint32_t d = lane * D + k;
                if (d < hd) acc[k] = fmaf(fj, __ldcg(part + 2 + d), acc[k]);
            }
        }
    }
    const float inv = 1.0f / total;
    float res[D];
#pragma unroll
    for (int k = 0; k < D; ++k) res[k] = lane * D + k < hd ? acc[k] * inv : 0.0f;
    store_head<D>(p, t, h, res, lane);
}

template <int D, int G>
__global__ void __launch_bounds__(32 * kAttnWarps) attention_split_kernel(AttentionParams p) {
    pdl_trigger();  // the GEMV after this one may start loading its weights (pdl.cuh)
    const uint32_t slice = blockIdx.x, t = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t hd = p.head_dim, group = p.heads / p.kv_heads;
    const uint32_t tiles = (group + G - 1) / G;
    const uint32_t kvh = blockIdx.y / tiles, h0 = kvh * group + (blockIdx.y % tiles) * G;
    const uint32_t hn = min(static_cast<uint32_t>(G), kvh * group + group - h0);
    const RowCache<const uint16_t> rc = row_cache<const uint16_t>(p, t);
    const int64_t at = rc.at;
    if (at < 0 || at >= rc.capacity) {
        if (threadIdx.x == 0 && slice == 0) atomicOr(p.fault, kFaultPosition);
        return;
    }
    const uint64_t len = static_cast<uint64_t>(at) + 1;
    const uint64_t first = p.window && len > p.window ? len - p.window : 0;
    const uint64_t begin = max(first, static_cast<uint64_t>(slice) * p.split_len);
    const uint64_t end = min(len, static_cast<uint64_t>(slice + 1) * p.split_len);
    const float scale =
        p.scale > 0.0f ? p.scale : static_cast<float>(1.0 / sqrt(static_cast<double>(hd)));

    float qv[G][D], o[G][D], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float* q = p.qkv + t * p.ld + static_cast<uint64_t>(h0 + g) * hd;
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const uint32_t d = lane * D + i;
            qv[g][i] = g < static_cast<int>(hn) && d < hd ? q[d] : 0.0f;
            o[g][i] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    for (uint64_t j = begin + warp; j < end; j += kAttnWarps) {
        const uint16_t* kr = rc.key(j) + static_cast<uint64_t>(kvh) * hd;
        const uint16_t* vr = rc.value(j) + static_cast<uint64_t>(kvh) * hd;
        float kv[D], vv[D];
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const uint32_t d = lane * D + i;
            kv[i] = d < hd ? __half2float(__ushort_as_half(kr[d])) : 0.0f;
            vv[i] = d < hd ? __half2float(__ushort_as_half(vr[d])) : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float sc = 0.0f;
#pragma unroll
            for (int i = 0; i < D; ++i) sc = fmaf(qv[g][i], kv[i], sc);
            sc = warp_sum(sc) * scale;
            if (p.softcap > 0.0f) sc = __fmul_rn(tanhf(__fdiv_rn(sc, p.softcap)), p.softcap);
            const float m_new = fmaxf(m[g], sc);
            const float corr = expf(m[g] - m_new), e = expf(sc - m_new);
            l[g] = l[g] * corr + e;
#pragma unroll
            for (int i = 0; i < D; ++i) o[g][i] = fmaf(e, vv[i], o[g][i] * corr);
            m[g] = m_new;
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
        if (g >= static_cast<int>(hn)) break;
        float* part = partial_at(p, t, h0 + g, slice * kAttnWarps + warp);
        if (lane == 0) part[0] = m[g], part[1] = l[g];
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const uint32_t d = lane * D + i;
            if (d < hd) part[2 + d] = o[g][i];
        }
    }
    // The last block of (token, KV head, tile) to finish merges its heads (CUDA's
    // threadFenceReduction pattern): partials made visible, then counted; the last one resets
    // the counter for the next launch (a captured graph replays this one).
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    unsigned* counter = p.counters + static_cast<uint64_t>(t) * gridDim.y + blockIdx.y;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    if (threadIdx.x == 0) *counter = 0;
    __threadfence();
    for (uint32_t g = warp; g < hn; g += kAttnWarps)
        merge_partials<D>(p, t, h0 + g, gridDim.x * kAttnWarps, lane);
}

template <int D>
void launch_split(const AttentionParams& p, cudaStream_t stream) {
    const uint32_t slices = (p.capacity + p.split_len - 1) / p.split_len;
    const uint32_t group = p.heads / p.kv_heads;
    const dim3 block(32 * kAttnWarps);
    if (group == 1) {
        attention_split_kernel<D, 1><<<dim3(slices, p.kv_heads, p.n), block, 0, stream>>>(p);
    } else if (group <= 4) {
        attention_split_kernel<D, 4><<<dim3(slices, p.kv_heads, p.n), block, 0, stream>>>(p);
    } else {
        attention_split_kernel<D, 8>
            <<<dim3(slices, p.kv_heads * ((group + 7) / 8), p.n), block, 0, stream>>>(p);
    }
    QF_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_store_kv_launch(const RopeParams& p, cudaStream_t stream) {
    if (p.capacity == 0 || !p.fault || !(p.rows || (p.pos0 && p.k_cache && p.v_cache)))
        throw_cuda_error(cudaErrorInvalidValue,
                         "rope_store_kv_launch: no capacity, fault word, cache or position",
                         __FILE__, __LINE__);
    if (p.n == 0) return;
    // one block per (token, head of q, k and v), a thread per pair (check_attention_config:
    // head_dim even, at most 256)
    rope_store_kv_kernel<<<dim3(p.n, p.heads + 2 * p.kv_heads), p.head_dim / 2, 0, stream>>>(p);
    QF_CUDA_CHECK_LAUNCH();
}

void attention_launch(const AttentionParams& p, uint32_t dims_per_lane, cudaStream_t stream) {
    if (p.capacity == 0 || !p.fault || !(p.rows || (p.pos0 && p.k_cache && p.v_cache)))
        throw_cuda_error(cudaErrorInvalidValue,
                         "attention_launch: no capacity, fault word, cache or position", __FILE__,
                         __LINE__);
    if (p.q8.chunks &&
        (dims_per_lane != 4 || p.head_dim % 32 != 0 || p.q8.chunks != p.heads * p.head_dim / 32))
        throw_cuda_error(cudaErrorInvalidValue,
                         "attention_launch: int8 blocks need head_dim a multiple of 32 with 4 "
                         "dimensions per lane",
                         __FILE__, __LINE__);
    if (p.split_len) {
        if (!p.workspace || !p.counters ||
            (p.capacity + p.split_len - 1) / p.split_len > kAttnMaxSplits)
            throw_cuda_error(cudaErrorInvalidValue,
                             "attention_launch: a split without workspace or with too many slices",
                             __FILE__, __LINE__);
        switch (dims_per_lane) {
            case 1:
                launch_split<1>(p, stream);
                return;
            case 2:
                launch_split<2>(p, stream);
                return;
            case 4:
                launch_split<4>(p, stream);
                return;
            case 8:
                launch_split<8>(p, stream);
                return;
            default:
                throw_cuda_error(cudaErrorInvalidValue,
                                 "attention_launch: dims_per_lane not 1/2/4/8", __FILE__, __LINE__);
        }
    }
    const dim3 grid(p.n, p.heads), block(32 * kAttnWarps);
    switch (dims_per_lane) {
        case 1:
            attention_kernel<1><<<grid, block, 0, stream>>>(p);
            break;
        case 2:
            attention_kernel<2><<<grid, block, 0, stream>>>(p);
            break;
        case 4:
            attention_kernel<4><<<grid, block, 0, stream>>>(p);
            break;
        case 8:
            attention_kernel<8><<<grid, block, 0, stream>>>(p);
            break;
        default:
            throw_cuda_error(cudaErrorInvalidValue, "attention_launch: dims_per_lane not 1/2/4/8",
                             __FILE__, __LINE__);
    }
    QF_CUDA_CHECK_LAUNCH();
}

}  // namespace qforge::cuda
