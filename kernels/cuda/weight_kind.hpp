// The kernel family a weight matrix is read with (gpu_format.hpp maps each qtype to one). Its own
// header because CUDA sources are C++17 and cannot include the C++20 qtype table.
#pragma once

#include <cstdint>

namespace qforge::cuda {

enum class WeightKind : uint8_t { f32, f16, bf16, q8, q4 };

}  // namespace qforge::cuda
