// The plain forward pass in float64, for tests: no cache, no threads, no SIMD, every formula
// written out once (the same equations as runtime/backend.hpp). The CPU backend is checked
// against it; it is checked against run.c's logits and transformers' logits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/model.hpp"

namespace qforge {

// Logits at every position of `tokens` (positions 0 .. n-1): n rows of vocab_size doubles.
// kv_f16: keys (after RoPE) and values rounded to binary16 (through float) before attention
// uses them, as an f16 KV cache stores them (runtime/kv_cache.hpp).
std::vector<std::vector<double>> reference_forward(const Model& model,
                                                   std::span<const int32_t> tokens,
                                                   bool kv_f16 = false);

}  // namespace qforge
