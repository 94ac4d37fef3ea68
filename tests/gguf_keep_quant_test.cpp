// `convert --keep-quant`: a hand-made GGUF whose linears are Q8_0 and Q4_0 blocks (random codes,
// -128 and both nibble extremes included; q and k permuted by the llama RoPE reordering) keeps
// them as q8_g32 / q4s_g32, and every kept row dequantizes (dequantize_row_ref) to exactly the
// bits the dequantizing conversion (formats/gguf_dequant.cpp) stores.
#include "sources/gguf_keep_quant.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "formats/qf.hpp"
#include "gguf_builder.hpp"
#include "kernels/cpu/qdot.hpp"
#include "test_support.hpp"

namespace gguf_keep_quant_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kGgmlF32 = 0, kGgmlQ4_0 = 2, kGgmlQ8_0 = 8;
constexpr uint64_t kHidden = 64, kFf = 96, kVocab = 8, kHeads = 4, kKvHeads = 2;

// Blocks of a [rows, k] tensor: fp16 scales of both signs, random codes.
std::vector<uint8_t> random_blocks(uint32_t type, uint64_t rows, uint64_t k, std::mt19937& rng) {
    std::vector<uint8_t> b;
    std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
    for (uint64_t i = 0; i < rows * k / 32; ++i) {
        const uint16_t d = f32_to_f16(scale(rng));
        b.push_back(static_cast<uint8_t>(d));
        b.push_back(static_cast<uint8_t>(d >> 8));
        const uint64_t code_bytes = type == kGgmlQ8_0 ? 32 : 16;
        for (uint64_t j = 0; j < code_bytes; ++j) b.push_back(static_cast<uint8_t>(rng()));
    }
    b[2] = 0x80;  // Q8_0 code -128 (or Q4_0 nibbles 0 and 8) in the first block
    b[3] = 0xff;  // Q8_0 code -1 (or Q4_0 nibbles 15 and 15)
    return b;
}

TestGguf quantized_model() {
    std::mt19937 rng(7);
    TestGguf g;
    g.kvs = {kv_str("general.architecture", "llama"),
             kv_u32("llama.embedding_length", kHidden),
             kv_u32("llama.feed_forward_length", kFf),
             kv_u32("llama.block_count", 1),
             kv_u32("llama.attention.head_count", kHeads),
             kv_u32("llama.attention.head_count_kv", kKvHeads),
             kv_u32("llama.context_length", 128),
             kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f)};
    std::vector<float> embed(kVocab * kHidden), norm(kHidden, 1.0f);
    for (size_t i = 0; i < embed.size(); ++i) embed[i] = static_cast<float>(i % 13) * 0.01f;
    const uint64_t head_dim = kHidden / kHeads;
    auto matrix = [&](std::string name, uint32_t type, uint64_t rows, uint64_t k) {
        g.tensors.push_back(
            {std::move(name), {k, rows}, type, random_blocks(type, rows, k, rng), {}});
    };
    g.tensors.push_back({"token_embd.weight", {kHidden, kVocab}, kGgmlF32, f32_bytes(embed), {}});
    g.tensors.push_back({"blk.0.attn_norm.weight", {kHidden}, kGgmlF32, f32_bytes(norm), {}});
    matrix("blk.0.attn_q.weight", kGgmlQ8_0, kHeads * head_dim, kHidden);
    matrix("blk.0.attn_k.weight", kGgmlQ4_0, kKvHeads * head_dim, kHidden);
    matrix("blk.0.attn_v.weight", kGgmlQ8_0, kKvHeads * head_dim, kHidden);
    matrix("blk.0.attn_output.weight", kGgmlQ4_0, kHidden, kHeads * head_dim);
    g.tensors.push_back({"blk.0.ffn_norm.weight", {kHidden}, kGgmlF32, f32_bytes(norm), {}});
    matrix("blk.0.ffn_gate.weight", kGgmlQ4_0, kFf, kHidden);
    matrix("blk.0.ffn_up.weight", kGgmlQ8_0, kFf, kHidden);
    matrix("blk.0.ffn_down.weight", kGgmlQ4_0, kHidden, kFf);
    g.tensors.push_back({"output_norm.weight", {kHidden}, kGgmlF32, f32_bytes(norm), {}});
    return g;
}

// Every element of a tensor as float: f32 as stored, quantized through dequantize_row_ref.
std::vector<float> dequantized(const QfFile& qf, const QfTensorInfo& t) {
    std::vector<uint8_t> scratch;
    const auto bytes = qf.tensor_bytes(t, scratch);
    const uint64_t rows = t.shape[0], k = t.shape.size() == 2 ? t.shape[1] : 1;
    std::vector<float> out(rows * k);
    if (t.qtype == QType::f32) {
        std::memcpy(out.data(), bytes.data(), out.size() * 4);
        return out;
    }
    if (t.qtype == QType::f16 || t.qtype == QType::bf16) {
        for (size_t i = 0; i < out.size(); ++i) {
            uint16_t h;
            std::memcpy(&h, bytes.data() + 2 * i, 2);
            out[i] = t.qtype == QType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        return out;
    }
    const uint64_t row_bytes = *qtype_row_bytes(t.qtype, k);
    for (uint64_t r = 0; r < rows; ++r)
        dequantize_row_ref(t.qtype, bytes.data() + r * row_bytes, k, out.data() + r * k);
    return out;
}

// Converts `gguf` to `out`, keeping Q8_0/Q4_0 packed or not; returns the output path.
std::string convert_gguf(const fs::path& gguf, const fs::path& out, bool keep_quant) {
    ConvertOptions o;
    o.input = gguf.string();
    o.output = out.string();
    o.keep_quant = keep_quant;
    convert_checkpoint(o);
    return o.output;
}

}  // namespace

TEST_CASE("GGUF --keep-quant: Q8_0 and Q4_0 import as q8_g32 and q4s_g32, bit-exact",
          "[interop][gguf]") {
    ScratchDir dir("gguf-keep-quant");
    const fs::path gguf = dir / "m.gguf";
    write_file(gguf, quantized_model().bytes());
    auto convert = [&](bool keep, const std::string& out) {
        return convert_gguf(gguf, dir / out, keep);
    };
    const QfFile kept(convert(true, "kept.qf")), floats(convert(false, "float.qf"));
    CHECK(kept.header().at("provenance").at("recipe").at("keep_quant") == true);
    CHECK(floats.header().at("provenance").at("recipe").at("keep_quant") == false);

    const std::map<std::string, QType> expected = {
        {"layers.0.attn.q", QType::q8_g32},    {"layers.0.attn.k", QType::q4s_g32},
        {"layers.0.attn.v", QType::q8_g32},    {"layers.0.attn.o", QType::q4s_g32},
        {"layers.0.mlp.gate", QType::q4s_g32}, {"layers.0.mlp.up", QType::q8_g32},
        {"layers.0.mlp.down", QType::q4s_g32}};
    uint64_t compared = 0;
    for (const QfTensorInfo& t : kept.tensors()) {
        INFO(t.name);
        const auto it = expected.find(t.name);
        CHECK(t.qtype == (it == expected.end() ? QType::f32 : it->second));
        const QfTensorInfo& f = floats.at(t.name);
        REQUIRE(f.qtype == QType::f32);
        const std::vector<float> a = dequantized(kept, t), b = dequantized(floats, f);
        REQUIRE(a.size() == b.size());
        // Bit for bit: compare the representations, so -0.0 against 0.0 would fail too.
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        compared += a.size();
    }
    CHECK(compared == kVocab * kHidden + 3 * kHidden + 2 * kHidden * kHidden +
                          2 * kHidden * (kKvHeads * kHidden / kHeads) + 3 * kHidden * kFf);

    // Only rank-2 tensors with k a multiple of 32 have a kept type; others have none.
    const uint64_t ok[2] = {4, 64}, odd[2] = {4, 48}, vec[1] = {64};
    CHECK(gguf_kept_qtype(GgmlType::q8_0, ok) == QType::q8_g32);
    CHECK(gguf_kept_qtype(GgmlType::q4_0, ok) == QType::q4s_g32);
    CHECK_FALSE(gguf_kept_qtype(GgmlType::q4_1, ok));
    CHECK_FALSE(gguf_kept_qtype(GgmlType::q8_0, odd));
    CHECK_FALSE(gguf_kept_qtype(GgmlType::q8_0, vec));
}

TEST_CASE(
    "GGUF --keep-quant: a NaN block scale is refused by name, non-GGUF input refuses the flag",
    "[interop][gguf]") {
    ScratchDir dir("gguf-keep-quant-errors");
    TestGguf g = quantized_model();
    for (auto& t : g.tensors)
        if (t.name == "blk.0.ffn_up.weight") t.data[34 * 3] = 0x00, t.data[34 * 3 + 1] = 0x7e;
    const fs::path gguf = dir / "m.gguf";
    write_file(gguf, g.bytes());
    ConvertOptions o;
    o.input = gguf.string();
    o.output = (dir / "m.qf").string();
    o.keep_quant = true;
    CHECK_THROWS_WITH(convert_checkpoint(o),
                      Catch::Contains(gguf.string() + ": tensor 'blk.0.ffn_up.weight'") &&
                          Catch::Contains("block 3 has a NaN or infinite scale"));
    CHECK(files_containing(dir.path(), ".qf").empty());
    o.input = (fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "hf_models" / "mistral").string();
    CHECK_THROWS_WITH(convert_checkpoint(o), Catch::Contains("--keep-quant applies to GGUF input"));
}

TEST_CASE("int8 kernels run q8 code -128 (Q8_0, GPTQ 8-bit code 0) exactly", "[interop][qdot]") {
    // Scale 1 and integer activations with |x| <= 127 and a 127 in every block of 32, so the
    // activation scale is 1 and every product and sum is an exact integer in float32.
    constexpr uint64_t n = 3, k = 128;
    std::vector<float> x(k);
    for (uint64_t j = 0; j < k; ++j)
        x[j] = j % 32 == 5 ? 127.0f : static_cast<float>(int(j * 37 % 255) - 127);
    for (QType t : {QType::q8, QType::q8_g32, QType::q8_g128}) {
        INFO(qtype_traits(t).name);
        const QRowLayout l = *qtype_row_layout(t, k);
        std::vector<uint8_t> rows(n * l.row_bytes);
        std::vector<double> expected(n, 0.0);
        for (uint64_t r = 0; r < n; ++r) {
            std::vector<int32_t> codes(k);
            for (uint64_t j = 0; j < k; ++j) codes[j] = (j + r) % 3 == 0 ? 127 : -128;
            std::vector<QGroupParams> groups(l.groups, QGroupParams{0x3c00, 1.0f, 0});
            pack_row(t, codes.data(), groups.data(), k, rows.data() + r * l.row_bytes);
            for (uint64_t j = 0; j < k; ++j) expected[r] += double(codes[j]) * x[j];
        }
        QActivations a;
        a.prepare(QActivations::Mode::int8, x.data(), 1, k);
        for (auto* f : {&qmatmul, &qmatmul_scalar}) {
            std::vector<float> out(n, std::nanf(""));
            f(t, rows.data(), l.row_bytes, 0, n, a, 0, 1, out.data(), n);
            for (uint64_t r = 0; r < n; ++r) CHECK(double(out[r]) == expected[r]);
        }
    }
}

TEST_CASE(
    "GGUF --keep-quant: llama.cpp's own file (q permuted, mixed types) keeps Q8_0/Q4_0 exactly "
    "and runs",
    "[interop][gguf]") {
    // tests/data/gguf/tiny_llama.gguf: written by the gguf package with q/k permuted as
    // convert_hf_to_gguf.py does, one ggml type per tensor (Q8_0 and Q4_0 among them).
    const fs::path gguf =
        fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "gguf" / "tiny_llama.gguf";
    ScratchDir dir("gguf-keep-quant-tiny");
    auto convert = [&](bool keep, const std::string& out) {
        return convert_gguf(gguf, dir / out, keep);
    };
    const std::string kept_path = convert(true, "kept.qf");
    const QfFile kept(kept_path), floats(convert(false, "float.qf"));
    std::map<QType, uint64_t> kept_types;
    for (const QfTensorInfo& t : kept.tensors()) {
        INFO(t.name);
        ++kept_types[t.qtype];
        const std::vector<float> a = dequantized(kept, t),
                                 b = dequantized(floats, floats.at(t.name));
        REQUIRE(a.size() == b.size());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
    // The file's 4 Q8_0 and 2 Q4_0 tensors (the q projections among them, so the RoPE
    // reordering ran on packed rows), its F16 and BF16 tensor as stored; everything else is f32.
    CHECK(kept_types[QType::q8_g32] == 4);
    CHECK(kept_types[QType::q4s_g32] == 2);
    CHECK(kept_types[QType::f16] == 1);
    CHECK(kept_types[QType::bf16] == 1);
    CHECK(kept.at("layers.1.attn.v").qtype == QType::bf16);
    CHECK(kept.at("layers.0.attn.q").qtype == QType::q4s_g32);

    std::string text;
    for (int i = 0; i < 8; ++i) text += "The quick brown fox jumps over the lazy dog. ";
    write_file(dir / "text.txt", text);
    const auto r = run_qforge("ppl '" + kept_path + "' -f '" + (dir / "text.txt").string() +
                              "' --ctx 32 --json -q");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.output);
    CHECK(std::isfinite(j.at("ppl").get<double>()));
}

}  // namespace gguf_keep_quant_test
