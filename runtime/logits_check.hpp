// Logits are results: a NaN or an infinity in them (from NaN/Inf weights, or activations that
// overflow) would print as "PPL = nan" or sample garbage. Every consumer checks each row it
// uses, once: vocab_size floats per token, nothing beside the matmuls that made them.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace qforge {

// Whether every value is finite (one vectorized pass).
bool all_finite(std::span<const float> logits);

// The error for a row that is not: names `model_file`, `where` ("token 37 of the text (chunk 0,
// position 37)") and the first bad id.
[[noreturn]] void throw_non_finite_logits(std::span<const float> logits,
                                          const std::string& model_file, const std::string& where);

}  // namespace qforge
