// What the Hugging Face exporters (convert/hf_export.cpp: GPTQ, AWQ;
// convert/compressed_tensors_export.cpp) share: one tensor of the checkpoint being written.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "formats/dtype.hpp"

namespace qforge::hf_export_detail {

struct Packed {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> bytes;
};

inline void put_word(std::vector<uint8_t>& b, uint64_t i, uint32_t v) {
    std::memcpy(&b[4 * i], &v, 4);
}
inline uint32_t get_word(const std::vector<uint8_t>& b, uint64_t i) {
    uint32_t v;
    std::memcpy(&v, &b[4 * i], 4);
    return v;
}
// ORs `value` into word `word` at bit `shift` (codes and zeros are packed into zeroed words).
inline void or_bits(std::vector<uint8_t>& b, uint64_t word, uint32_t value, uint32_t shift) {
    put_word(b, word, get_word(b, word) | (value << shift));
}

}  // namespace qforge::hf_export_detail
