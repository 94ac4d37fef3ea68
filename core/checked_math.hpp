// Overflow-checked 64-bit arithmetic for sizes read from untrusted files.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace qforge {

inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}

inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
    return r;
}

// Product of all dimensions; nullopt on overflow. An empty shape (a scalar) has one element.
inline std::optional<uint64_t> checked_product(std::span<const uint64_t> dims) {
    uint64_t n = 1;
    for (uint64_t d : dims) {
        auto p = checked_mul(n, d);
        if (!p) return std::nullopt;
        n = *p;
    }
    return n;
}

inline uint64_t align_up(uint64_t x, uint64_t alignment) {
    return (x + alignment - 1) / alignment * alignment;
}

}  // namespace qforge
