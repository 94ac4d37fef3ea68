// IEEE binary16 (f16) and bfloat16 (bf16) conversions, scalar and bit-exact: round to nearest
// even, NaN stays NaN (quiet), overflow becomes infinity. The tests check them against the
// CPU's F16C instructions over every half value and many floats.
#pragma once

#include <bit>
#include <cstdint>

namespace qforge {

inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);  // inf / quiet NaN
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        // Subnormal half: normalise. value = mant * 2^-24.
        int e = -1;
        do {
            ++e;
            mant <<= 1;
        } while ((mant & 0x400u) == 0);
        bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
    return std::bit_cast<float>(bits);
}

inline uint16_t f32_to_f16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u)  // NaN: keep the top mantissa bits, force quiet
        return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    if (abs >= 0x477ff000u)  // >= 65520 rounds to infinity (65504 is the largest half)
        return static_cast<uint16_t>(sign | 0x7c00u);
    if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
        if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero (2^-25 itself ties to 0)
        const uint32_t exp = abs >> 23;
        const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - exp;  // value = mant * 2^(exp-150); units of 2^-24
        uint32_t half_mant = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u);
        const uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
        return static_cast<uint16_t>(sign | half_mant);
    }
    // Normal: rebias exponent 127 -> 15 and round 23 -> 10 mantissa bits to nearest even.
    uint32_t r = abs - 0x38000000u;  // exponent - 112
    r += 0x0fffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
}

inline float bf16_to_f32(uint16_t b) {
    return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t f32_to_bf16(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
}

// True when a finite float becomes +-inf in f16 (the bf16 -> f16 overflow a converter reports).
inline bool f16_overflows(float f) {
    const uint32_t abs = std::bit_cast<uint32_t>(f) & 0x7fffffffu;
    return abs >= 0x477ff000u && abs < 0x7f800000u;
}

}  // namespace qforge
