// fp32 -> fp16 rounding for the activations the tensor-core products read and for the KV cache:
// round to nearest, but a finite value beyond fp16's range (|v| >= 65520, which would round to
// infinity) becomes +-65504, the largest finite half, and is counted. An outlier activation then
// costs one clamped value instead of an infinity that turns the whole attention row or product
// into NaN; the count (CudaEngine::fp16_saturations, reported by bench and ppl) says whether it
// happened at all. NaN stays NaN (it is not finite), so a NaN input is still visible.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace qforge::cuda {

__device__ __forceinline__ uint16_t f16_saturate(float v, unsigned long long* saturated) {
    const __half h = __float2half_rn(v);
    if (__hisinf(h) && isfinite(v)) {
        if (saturated) atomicAdd(saturated, 1ull);
        return v > 0.0f ? uint16_t{0x7bff} : uint16_t{0xfbff};  // +-65504
    }
    return __half_as_ushort(h);
}

}  // namespace qforge::cuda
