// Which GPUs this build can use. An empty list when qforge was built without CUDA or when no
// device (or no driver) is present; the CPU backend is used then.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qforge {

struct GpuDevice {
    int index;
    std::string name;
    int cc_major;
    int cc_minor;
    uint64_t memory_bytes;
    int sm_count;
};

bool built_with_cuda();
// "13.0" for the toolkit the binary was compiled with; empty without CUDA.
std::string cuda_build_version();
// Devices visible to the CUDA runtime; `why_none` says why the list is empty (no driver, ...).
std::vector<GpuDevice> list_gpus(std::string* why_none = nullptr);

}  // namespace qforge
