#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/device_info.hpp"

namespace qforge {

std::string cuda_build_version() {
    return std::to_string(CUDART_VERSION / 1000) + "." +
           std::to_string((CUDART_VERSION % 1000) / 10);
}

std::vector<GpuDevice> list_gpus(std::string* why_none) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        // No driver or no device is a normal state on CPU machines, not an error.
        (void)cudaGetLastError();
        if (why_none) *why_none = std::string("no usable CUDA device: ") + cudaGetErrorString(err);
        return {};
    }
    std::vector<GpuDevice> out;
    for (int i = 0; i < count; ++i) {
        cudaDeviceProp p{};
        QF_CUDA_CHECK(cudaGetDeviceProperties(&p, i));
        out.push_back({i, p.name, p.major, p.minor, static_cast<uint64_t>(p.totalGlobalMem),
                       p.multiProcessorCount});
    }
    if (out.empty() && why_none) *why_none = "the CUDA runtime reports no devices";
    return out;
}

}  // namespace qforge
