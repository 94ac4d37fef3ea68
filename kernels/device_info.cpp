#include "kernels/device_info.hpp"

namespace qforge {

#ifndef QFORGE_HAVE_CUDA
bool built_with_cuda() { return false; }
std::string cuda_build_version() { return {}; }
std::vector<GpuDevice> list_gpus(std::string* why_none) {
    if (why_none) *why_none = "qforge was built without CUDA";
    return {};
}
#else
bool built_with_cuda() { return true; }
#endif

}  // namespace qforge
