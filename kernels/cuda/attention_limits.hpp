// Limits shared by the attention kernels (C++17, attention.cu) and their host-side planning
// (plans.hpp): the split attention's most slices a cache is cut into.
#pragma once

#include <cstdint>

namespace qforge::cuda {

inline constexpr uint32_t kAttnMaxSplits = 32;

}  // namespace qforge::cuda
