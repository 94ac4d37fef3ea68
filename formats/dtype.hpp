// Element types of tensors as stored by safetensors checkpoints. One row per type; the code
// that parses, sizes or converts a dtype consults this table and nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qforge {

enum class DType : uint8_t { f32, f16, bf16, i8, u8, i32, i64 };

struct DTypeInfo {
    DType type;
    std::string_view safetensors_name;  // as in a safetensors header: "F32", "BF16", ...
    std::string_view name;              // our lowercase name: "f32", "bf16", ...
    uint32_t size;                      // bytes per element
    bool is_float;
};

inline constexpr DTypeInfo kDTypes[] = {
    {DType::f32, "F32", "f32", 4, true},    {DType::f16, "F16", "f16", 2, true},
    {DType::bf16, "BF16", "bf16", 2, true}, {DType::i8, "I8", "i8", 1, false},
    {DType::u8, "U8", "u8", 1, false},      {DType::i32, "I32", "i32", 4, false},
    {DType::i64, "I64", "i64", 8, false},
};
static_assert(std::size(kDTypes) == static_cast<size_t>(DType::i64) + 1, "every DType needs a row");

constexpr const DTypeInfo& dtype_info(DType t) { return kDTypes[static_cast<size_t>(t)]; }

inline std::optional<DType> dtype_from_safetensors_name(std::string_view s) {
    for (const auto& row : kDTypes)
        if (row.safetensors_name == s) return row.type;
    return std::nullopt;
}

inline std::optional<DType> dtype_from_name(std::string_view s) {
    for (const auto& row : kDTypes)
        if (row.name == s) return row.type;
    return std::nullopt;
}

// "[32000, 4096]"
std::string shape_to_string(std::span<const uint64_t> shape);

// A tensor's bytes in place (in a mapping or a buffer owned elsewhere) with its type and shape.
struct TensorView {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
    std::span<const uint8_t> data;
};

}  // namespace qforge
