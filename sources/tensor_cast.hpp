// Converting a tensor between float storage types while checking every value: NaN or Inf in a
// weight, or a finite value that overflows the narrower type (bf16 -> f16), is an error naming
// the tensor, the element and the value.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/dtype.hpp"
#include "formats/qtype.hpp"

namespace qforge {

// Returns the tensor's bytes as `target`: the source bytes themselves when no conversion is
// needed (after the value check), else `buffer` filled with the converted values.
std::span<const uint8_t> cast_tensor(const TensorView& v, QType source, QType target,
                                     const std::string& file, std::vector<uint8_t>& buffer);

}  // namespace qforge
