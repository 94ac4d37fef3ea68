// Random weights generated on the device, for benchmarks of model shapes too large to write to
// disk (an 8B-shape model in f16 is 16 GB). Deterministic: a splitmix64 hash of (seed, index).
//
// Supported configurations: every kind of gpu_format.hpp; any number of rows and row stride.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/launchers.hpp"

namespace qforge::cuda {

namespace {

__device__ __forceinline__ uint64_t mix(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [-1, 1).
__device__ __forceinline__ float uniform(uint64_t seed, uint64_t i) {
    return static_cast<float>(mix(seed, i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

unsigned blocks_for(uint64_t count) {
    return static_cast<unsigned>(std::clamp<uint64_t>((count + 255) / 256, 1, 65535 * 4));
}

__global__ void float_rows_kernel(RowsParams w, uint32_t k, float stddev, uint64_t seed) {
    const uint32_t elt = w.kind == WeightKind::f32 ? 4 : 2;
    const uint64_t per_row = w.row_bytes / elt;
    const uint64_t total = per_row * w.rows;
    const float amp = stddev * 1.7320508f;  // uniform [-a, a) has deviation a / sqrt(3)
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const float v = i % per_row < k ? amp * uniform(seed, i) : 0.0f;
        if (w.kind == WeightKind::f32)
            reinterpret_cast<float*>(const_cast<uint8_t*>(w.w))[i] = v;
        else if (w.kind == WeightKind::f16)
            reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(w.w))[i] =
                __half_as_ushort(__float2half_rn(v));
        else
            reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(w.w))[i] =
                __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
}

__global__ void quant_rows_kernel(RowsParams w, uint16_t scale_bits, uint64_t seed) {
    const uint64_t total = w.row_bytes * w.rows;
    const uint64_t groups =
        (static_cast<uint64_t>(w.chunks) + w.chunks_per_group - 1) / w.chunks_per_group;
    uint8_t* base = const_cast<uint8_t*>(w.w);
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t b = i % w.row_bytes;
        uint8_t v = 0;
        if (b < w.scales_offset) {
            v = static_cast<uint8_t>(mix(seed, i));
            if (w.kind == WeightKind::q8 && v == 0x80) v = 0x81;  // codes are -127 .. 127
        } else if (b < w.scales_offset + 2 * groups) {
            v = static_cast<uint8_t>((b - w.scales_offset) % 2 ? scale_bits >> 8
                                                               : scale_bits & 0xff);
        } else if (w.has_zeros && b >= w.zeros_offset && b < w.zeros_offset + groups) {
            v = 8;
        }
        base[i] = v;
    }
}

}  // namespace

void fill_random_float_rows_launch(const RowsParams& w, uint32_t k, float stddev, uint64_t seed,
                                   cudaStream_t stream) {
    const uint64_t count = w.row_bytes * w.rows / (w.kind == WeightKind::f32 ? 4 : 2);
    float_rows_kernel<<<blocks_for(count), 256, 0, stream>>>(w, k, stddev, seed);
    QF_CUDA_CHECK_LAUNCH();
}

void fill_random_quant_rows_launch(const RowsParams& w, float scale, uint64_t seed,
                                   cudaStream_t stream) {
    const uint16_t bits = __half_as_ushort(__float2half_rn(scale));
    quant_rows_kernel<<<blocks_for(w.row_bytes * w.rows), 256, 0, stream>>>(w, bits, seed);
    QF_CUDA_CHECK_LAUNCH();
}

}  // namespace qforge::cuda
