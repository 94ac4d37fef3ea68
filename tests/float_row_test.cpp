// formats/qtype.hpp's store_float_row, the one f32 -> f16/bf16 narrowing every writer uses
// (quantize_row_ref's float rows, convert's cast_tensor): the boundaries of the overflow rule
// from the formats' definitions, not from the code under test. f16's largest finite value is
// 65504 = (2 - 2^-10) 2^15; halfway to the next step, 65520, rounds (to even) to infinity.
// bf16's largest is (2 - 2^-7) 2^127; halfway above it, (2 - 2^-8) 2^127, rounds to infinity.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/half.hpp"
#include "formats/qtype.hpp"

namespace float_row_test {

using namespace qforge;

namespace {

uint64_t store(QType t, std::vector<float> x, std::vector<uint8_t>& out) {
    out.assign(x.size() * 4, 0xee);
    return store_float_row(t, x.data(), x.size(), out.data());
}

}  // namespace

TEST_CASE("store_float_row: one overflow rule for f16 and bf16", "[qtype][float_row]") {
    std::vector<uint8_t> out;
    const float f16_last_fit = std::nextafter(65520.0f, 0.0f);
    REQUIRE(store(QType::f16, {1.0f, -f16_last_fit, 65504.0f}, out) == 3);
    uint16_t h[3];
    std::memcpy(h, out.data(), 6);
    REQUIRE(f16_to_f32(h[0]) == 1.0f);
    REQUIRE(f16_to_f32(h[1]) == -65504.0f);
    REQUIRE(store(QType::f16, {1.0f, 2.0f, -65520.0f, 3.0f}, out) == 2);
    const float bf16_half_up = std::ldexp(2.0f - 0x1p-8f, 127);
    REQUIRE(store(QType::bf16, {std::nextafter(bf16_half_up, 0.0f), 1.0f}, out) == 2);
    REQUIRE(store(QType::bf16, {1.0f, bf16_half_up}, out) == 1);
    REQUIRE(store(QType::f32, {std::numeric_limits<float>::max(), 1.0f}, out) == 2);
    // Non-finite values never fit, in any float type; the first misfit is the one reported.
    for (QType t : {QType::f32, QType::f16, QType::bf16}) {
        INFO(qtype_traits(t).name);
        REQUIRE(store(t, {0.0f, std::nanf(""), 1e30f}, out) == 1);
        REQUIRE(store(t, {std::numeric_limits<float>::infinity()}, out) == 0);
        REQUIRE(store(t, {}, out) == 0);
    }
}

}  // namespace float_row_test
