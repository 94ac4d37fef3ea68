// The table of tensor types a .qf file can hold. Every code path that sizes, names or converts a
// stored tensor consults this table. Quantized rows (q8, q4_g128, ...) join it with the
// quantization issue; a static check makes sure every enum value has its row.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "core/checked_math.hpp"
#include "formats/dtype.hpp"

namespace qforge {

enum class QType : uint8_t { f32, f16, bf16 };

struct QTypeTraits {
    QType type;
    std::string_view name;  // the name used verbatim by the CLI and the .qf header
    uint32_t bits;          // storage bits per weight, scales included
    bool is_float;          // plain float storage: no blocks, no scales
    DType dtype;            // the element type of float rows
};

inline constexpr QTypeTraits kQTypes[] = {
    {QType::f32, "f32", 32, true, DType::f32},
    {QType::f16, "f16", 16, true, DType::f16},
    {QType::bf16, "bf16", 16, true, DType::bf16},
};

constexpr bool qtype_table_in_enum_order() {
    for (size_t i = 0; i < std::size(kQTypes); ++i)
        if (static_cast<size_t>(kQTypes[i].type) != i) return false;
    return true;
}
static_assert(std::size(kQTypes) == static_cast<size_t>(QType::bf16) + 1, "every QType needs a row");
static_assert(qtype_table_in_enum_order(), "kQTypes rows must follow the enum order");

constexpr const QTypeTraits& qtype_traits(QType t) { return kQTypes[static_cast<size_t>(t)]; }

inline std::optional<QType> qtype_from_name(std::string_view s) {
    for (const auto& row : kQTypes)
        if (row.name == s) return row.type;
    return std::nullopt;
}

inline std::optional<QType> qtype_from_dtype(DType d) {
    for (const auto& row : kQTypes)
        if (row.is_float && row.dtype == d) return row.type;
    return std::nullopt;
}

// Bytes a tensor of this type and shape occupies; nullopt when the size overflows 64 bits.
inline std::optional<uint64_t> qtype_tensor_bytes(QType t, std::span<const uint64_t> shape) {
    auto n = checked_product(shape);
    if (!n) return std::nullopt;
    return checked_mul(*n, dtype_info(qtype_traits(t).dtype).size);
}

}  // namespace qforge
