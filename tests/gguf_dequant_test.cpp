// Dequantization of ggml's block types: bit-exact against vectors that llama.cpp's `gguf`
// package (its numpy dequantizers) wrote into tests/data/gguf/dequant.gguf, and against blocks
// computed by hand here. The formulas are exact in float32 up to one rounding that ggml makes
// in the same order (formats/gguf_dequant.cpp), so no tolerance is allowed.
#include "formats/gguf_dequant.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.hpp"
#include "core/half.hpp"
#include "formats/gguf.hpp"
#include "test_support.hpp"

namespace gguf_dequant_test {

using namespace qforge;
namespace fs = std::filesystem;

namespace {

const fs::path kDequantFixture =
    fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "gguf" / "dequant.gguf";

uint32_t bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

template <class Block>
std::vector<float> dequant_block(GgmlType type, const Block& block) {
    std::vector<uint8_t> bytes(sizeof block);
    std::memcpy(bytes.data(), &block, sizeof block);
    std::vector<float> out(ggml_type_traits(type).block_elems);
    gguf_dequantize(type, bytes, out, "test", "block");
    return out;
}

}  // namespace

TEST_CASE("GGUF dequantization equals llama.cpp's gguf package, bit for bit", "[gguf]") {
    const GgufFile f(kDequantFixture.string());
    std::set<std::string> covered;
    for (const GgufTensorInfo& t : f.tensors()) {
        const std::string suffix = ".blocks";
        if (!t.name.ends_with(suffix)) continue;
        const std::string type = t.name.substr(0, t.name.size() - suffix.size());
        INFO("type " << type);
        const GgufTensorInfo* expected = f.find_tensor(type + ".expected");
        REQUIRE(expected);
        REQUIRE(expected->type == GgmlType::f32);
        REQUIRE(expected->elements == t.elements);
        CHECK(ggml_type_traits(t.type).name == type);
        std::vector<float> got(t.elements);
        gguf_dequantize(t.type, f.tensor_data(t), got, f.path(), t.name);
        const auto want = f.tensor_data(*expected);
        size_t mismatches = 0, first = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            uint32_t w;
            std::memcpy(&w, want.data() + 4 * i, 4);
            if (bits(got[i]) != w && mismatches++ == 0) first = i;
        }
        INFO("first mismatch at element " << first << " of " << got.size());
        CHECK(mismatches == 0);
        covered.insert(type);
    }
    // Every type qforge dequantizes has vectors.
    for (const auto& row : ggml_type_table())
        if (row.to_float) CHECK(covered.count(std::string(row.name)) == 1);
    CHECK(covered.size() >= 13);
}

TEST_CASE("GGUF dequantization of hand-computed blocks", "[gguf]") {
    const uint16_t half_one = 0x3c00, half_half = 0x3800, half_two = 0x4000, half_quarter = 0x3400;
    const uint16_t half_minus_one = 0xbc00;

    SECTION("Q4_0: (q - 8) * d, low nibbles first") {
        BlockQ4_0 b{};
        b.d = half_half;
        b.qs[0] = 0x1f;  // element 0: 15, element 16: 1
        const auto y = dequant_block(GgmlType::q4_0, b);
        CHECK(y[0] == 3.5f);
        CHECK(y[16] == -3.5f);
        CHECK(y[1] == -4.0f);  // q = 0
    }
    SECTION("Q4_1: q * d + m") {
        BlockQ4_1 b{};
        b.d = half_two;
        b.m = half_minus_one;
        b.qs[0] = 0x0f;
        const auto y = dequant_block(GgmlType::q4_1, b);
        CHECK(y[0] == 29.0f);
        CHECK(y[16] == -1.0f);
    }
    SECTION("Q5_0: the fifth bit of element j is bit j of qh") {
        BlockQ5_0 b{};
        b.d = half_one;
        b.qh[2] = 0x01;  // bit 16: element 16's high bit
        b.qs[0] = 0x35;  // element 0: 5, element 16: 3
        const auto y = dequant_block(GgmlType::q5_0, b);
        CHECK(y[0] == 5.0f - 16.0f);
        CHECK(y[16] == 3.0f);  // (3 | 16) - 16
    }
    SECTION("Q5_1: q * d + m") {
        BlockQ5_1 b{};
        b.d = half_quarter;
        b.m = half_one;
        b.qh[0] = 0x01;
        b.qs[0] = 0x02;  // element 0: 2 | 16 = 18
        const auto y = dequant_block(GgmlType::q5_1, b);
        CHECK(y[0] == 18 * 0.25f + 1.0f);
        CHECK(y[1] == 1.0f);
    }
    SECTION("Q8_0: q * d") {
        BlockQ8_0 b{};
        b.d = half_quarter;
        b.qs[3] = -128;
        b.qs[31] = 127;
        const auto y = dequant_block(GgmlType::q8_0, b);
        CHECK(y[3] == -32.0f);
        CHECK(y[31] == 31.75f);
    }
    SECTION("Q4_K: six-bit scales and mins of the upper groups come from three bytes") {
        BlockQ4_K b{};
        b.d = half_one;
        b.dmin = half_half;
        // Group 5: scale = (scales[9] & 15) | (scales[1] >> 6) << 4 = 1 | 16 = 17,
        //          min   = (scales[9] >> 4) | (scales[5] >> 6) << 4 = 2 | 32 = 34.
        b.scales[9] = 0x21;
        b.scales[1] = 0x40;
        b.scales[5] = 0x80;
        b.qs[64] = 0x30;  // group 5 is the high nibbles of bytes 64..95: element 160 gets 3
        const auto y = dequant_block(GgmlType::q4_k, b);
        CHECK(y[160] == 17.0f * 3 - 0.5f * 34);
        CHECK(y[161] == -17.0f);
        CHECK(y[128] == 0.0f);  // group 4: scale and min 0
        CHECK(y[32] == 0.0f);   // group 1: scale 0 (scales[1] & 63), min 0 (scales[5] & 63)
    }
    SECTION("Q6_K: (q - 32) * scale * d with 2 high bits from qh") {
        BlockQ6_K b{};
        b.d = half_one;
        b.scales[0] = -2;
        b.scales[4] = 3;
        b.ql[0] = 0x05;  // element 0: low 4 bits 5; element 64: 0
        b.qh[0] = 0x02;  // element 0: high bits 2 -> q = 37
        const auto y = dequant_block(GgmlType::q6_k, b);
        CHECK(y[0] == -2.0f * 5);
        CHECK(y[64] == 3.0f * -32);
    }
    SECTION("BF16 and F16 widen exactly") {
        const std::vector<uint8_t> bf16 = {0x80, 0x3f, 0x00, 0x80};  // 1.0, -0.0
        std::vector<float> y(2);
        gguf_dequantize(GgmlType::bf16, bf16, y, "test", "t");
        CHECK(y[0] == 1.0f);
        CHECK(bits(y[1]) == 0x80000000u);
        const std::vector<uint8_t> f16 = {0x01, 0x00, 0x00, 0x7c};  // smallest subnormal, +inf
        gguf_dequantize(GgmlType::f16, f16, y, "test", "t");
        CHECK(y[0] == std::ldexp(1.0f, -24));
        CHECK(std::isinf(y[1]));
    }
}

TEST_CASE("GGUF dequantization refuses unsupported types and wrong sizes", "[gguf]") {
    std::vector<float> out(256);
    const std::vector<uint8_t> iq(136, 0);
    CHECK_THROWS_WITH(
        gguf_dequantize(GgmlType::iq4_xs, iq, out, "m.gguf", "blk.0.ffn_up.weight"),
        Catch::Contains("m.gguf: tensor 'blk.0.ffn_up.weight': ggml type IQ4_XS cannot "
                        "be dequantized by qforge (supported: F32, F16, Q4_0"));
    const std::vector<uint8_t> q4(18 * 2, 0);
    std::vector<float> short_out(63);
    CHECK_THROWS_WITH(gguf_dequantize(GgmlType::q4_0, q4, short_out, "m.gguf", "t"),
                      Catch::Contains("36 bytes of Q4_0 do not dequantize to 63 floats"));
}

}  // namespace gguf_dequant_test
