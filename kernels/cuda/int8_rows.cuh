// The GEMV's int8 activation blocks written by the kernel that produces the activations
// (RMSNorm, SwiGLU, attention), so the GEMV needs no preparation launch (launchers.hpp:
// Int8Rows, GemvParams).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launchers.hpp"

namespace qforge::cuda {

// The int8 block of one 32-value chunk held by 8 consecutive lanes (lane j of the group holds
// values 4j .. 4j + 3), written where quantize_chunks_kernel writes it, with the same float
// operations (the maximum ignores order and NaN alike), so the same bits. Every lane of the warp
// calls it (shuffles); a group with `write` false (past the rows) writes nothing.
__device__ __forceinline__ void quantize_chunk_lanes(float4 v, bool write, const Int8Rows& q,
                                                     uint64_t t, uint32_t c) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    int finite = isfinite(v.x) && isfinite(v.y) && isfinite(v.z) && isfinite(v.w);
    for (int o = 1; o < 8; o <<= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        finite &= __shfl_xor_sync(0xffffffffu, finite, o);
    }
    const float d = __fdiv_rn(amax, 127.0f);
    uint32_t word = 0;
    int32_t sum = 0;
    if (finite && d > 0.0f) {
        const float e[4] = {v.x, v.y, v.z, v.w};
        for (int b = 0; b < 4; ++b) {
            const int32_t code =
                static_cast<int32_t>(fminf(fmaxf(rintf(__fdiv_rn(e[b], d)), -127.0f), 127.0f));
            sum += code;
            word |= (static_cast<uint32_t>(code) & 0xffu) << (8 * b);
        }
    }
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (!write) return;
    const uint32_t j = threadIdx.x % 8;
    reinterpret_cast<uint32_t*>(q.xq + (2 * t + j / 4) * q.chunks + c)[j % 4] = word;
    if (j == 0) {
        q.xd[t * q.chunks + c] = !finite ? __int_as_float(0x7fc00000) : (d > 0.0f ? d : 0.0f);
        q.xs[t * q.chunks + c] = sum;
    }
}

}  // namespace qforge::cuda
