// f16/bf16 conversions against the CPU's F16C instructions (an independent implementation)
// and against exact float64 reasoning for bf16.
#include <cpuid.h>
#include <immintrin.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>

#include "core/half.hpp"

namespace half_test {

using namespace qforge;

// Through the vector form: clang's _cvtss_sh is a macro with a compound literal (-Wpedantic).
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
    const __m128i h = _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return static_cast<uint16_t>(_mm_extract_epi16(h, 0));
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

// CPUID leaf 1, ECX bit 29: clang before 15 rejects "f16c" in __builtin_cpu_supports.
static bool cpu_has_f16c() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
}

TEST_CASE("f16 -> f32 matches F16C for every half value", "[core][half]") {
    if (!cpu_has_f16c()) {
        std::printf("SKIPPED: this CPU has no F16C\n");
        return;
    }
    for (uint32_t h = 0; h < 65536; ++h) {
        const float a = f16_to_f32(static_cast<uint16_t>(h));
        const float b = hw_f16_to_f32(static_cast<uint16_t>(h));
        if (std::isnan(b)) {
            REQUIRE(std::isnan(a));
        } else {
            REQUIRE(std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b));
        }
    }
}

TEST_CASE("f32 -> f16 rounds like F16C (nearest even) on edge and random values", "[core][half]") {
    if (!cpu_has_f16c()) {
        std::printf("SKIPPED: this CPU has no F16C\n");
        return;
    }
    std::vector<float> values = {0.0f,          -0.0f,         65504.0f,      65519.99f,
                                 65520.0f,      -65520.0f,     1e-8f,         5.9604645e-8f,
                                 2.9802322e-8f, 2.9802326e-8f, 6.1035156e-5f, 6.1035152e-5f,
                                 INFINITY,      -INFINITY,     1.0f / 3.0f};
    // Every half value and the midpoints between neighbours (ties), plus random bit patterns.
    for (uint32_t h = 0; h < 0x7c00; ++h) {
        const float v = f16_to_f32(static_cast<uint16_t>(h));
        const float next = f16_to_f32(static_cast<uint16_t>(h + 1));
        values.push_back(v);
        values.push_back(-v);
        values.push_back(static_cast<float>((static_cast<double>(v) + next) / 2));
    }
    std::mt19937 rng(1234);
    for (int i = 0; i < 200000; ++i)
        values.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
    for (float f : values) {
        if (std::isnan(f)) {
            REQUIRE(std::isnan(f16_to_f32(f32_to_f16(f))));
            continue;
        }
        INFO("value " << f);
        REQUIRE(f32_to_f16(f) == hw_f32_to_f16(f));
    }
}

TEST_CASE("bf16 round trip and rounding to nearest even", "[core][half]") {
    std::mt19937 rng(99);
    for (int i = 0; i < 100000; ++i) {
        const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
        if (std::isnan(f) || std::isinf(f)) continue;
        const uint16_t b = f32_to_bf16(f);
        const double down = bf16_to_f32(static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16));
        const double up_bits_base = down;
        (void)up_bits_base;
        // The result is one of the two neighbours and no farther from f than the other one.
        const float r = bf16_to_f32(b);
        const uint16_t lo = static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);
        const float other = bf16_to_f32(b == lo ? static_cast<uint16_t>(lo + 1) : lo);
        if (std::isinf(r)) continue;  // rounding past the largest finite bf16
        REQUIRE(std::abs(static_cast<double>(r) - f) <= std::abs(static_cast<double>(other) - f));
        REQUIRE(f32_to_bf16(r) == b);
    }
    REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST_CASE("f16 overflow detection", "[core][half]") {
    REQUIRE_FALSE(f16_overflows(65504.0f));
    REQUIRE_FALSE(f16_overflows(65519.0f));
    REQUIRE(f16_overflows(65520.0f));
    REQUIRE(f16_overflows(-1e10f));
    REQUIRE_FALSE(f16_overflows(INFINITY));  // already infinite: not an overflow of conversion
}

}  // namespace half_test
