// `qforge export` writes GPTQ v1 / AWQ GEMM checkpoints that are the exact inverse of the import
// (sources/hf_quantized.cpp): a model quantized with RTN, exported and imported again has the
// same tensor bytes; the exported parts, dequantized here by the published formulas in plain
// scalar code, equal dequantize_row_ref bit for bit; types a format cannot express are refused
// by name, leaving nothing behind.
#include "convert/hf_export.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <tuple>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "core/half.hpp"
#include "formats/architectures.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "formats/safetensors.hpp"
#include "test_support.hpp"
#include "tokenizer/hf_writer.hpp"
#include "tokenizer/source.hpp"

namespace hf_export_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "quant_checkpoints";

// A float F16 checkpoint in `dir`/float: the fixtures' one-layer Llama widened (hidden 128,
// intermediate 256: every linear packs into 8-code words) with deterministic pseudo-random weights,
// and tok512.bin beside it so every .qf carries the same tokenizer. Returns the converted .qf.
fs::path make_float_model(const ScratchDir& dir, bool non_negative_q = false,
                          uint64_t hidden = 128) {
    const fs::path src = dir / ("float" + std::to_string(hidden));
    fs::create_directories(src);
    nlohmann::json cfg =
        nlohmann::json::parse(read_file(kFixtures / "gptq_4bit_asym_g32" / "config.json"));
    cfg.erase("quantization_config");
    // Rows of 128 and 256 weights: narrower ones would pack no smaller than f16, and the recipe
    // keeps those float.
    cfg["hidden_size"] = hidden;
    cfg["head_dim"] = hidden / 4;
    cfg["intermediate_size"] = 256;
    write_file(src / "config.json", cfg.dump(2));
    fs::copy_file(kFixtures / "tok512.bin", dir / "tok512.bin", fs::copy_options::skip_existing);

    const ModelConfig config = parse_model_config(cfg, "config.json");
    uint64_t state = 0x9e3779b97f4a7c15ull;
    auto next = [&]() {  // xorshift64*: uniform in [-1, 1)
        state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
        return static_cast<float>((state * 0x2545f4914f6cdd1dull) >> 40) / float(1 << 23) - 1.0f;
    };
    std::vector<std::vector<uint8_t>> data;
    std::vector<TensorView> views;
    for (const TensorSpec& s : expected_tensors(config)) {
        uint64_t count = 1;
        for (uint64_t d : s.shape) count *= d;
        std::vector<float> v(count);
        for (float& x : v) x = s.is_matrix ? 0.1f * next() : 1.0f + 0.1f * next();
        if (non_negative_q && s.name == "layers.0.attn.q")
            for (float& x : v) x = std::abs(x);  // every group's zero point is 0
        data.push_back(float_bytes(QType::f16, v));
    }
    size_t i = 0;
    for (const TensorSpec& s : expected_tensors(config))
        views.push_back({s.hf_name, DType::f16, s.shape, data[i++]});
    write_safetensors((src / "model.safetensors").string(), views);

    ConvertOptions o;
    o.input = src.string();
    o.output = (dir / ("float" + std::to_string(hidden) + ".qf")).string();
    convert_checkpoint(o);
    return o.output;
}

fs::path quantize(const fs::path& in, const ScratchDir& dir, const std::string& qtype,
                  const std::string& extra = "") {
    const fs::path out = dir / (qtype + ".qf");
    // HF GPTQ/AWQ keep the embedding float: keep ours f16 so the round trip is byte for byte.
    const auto r = run_qforge("quantize " + q(in) + " -o " + q(out) + " --qtype " + qtype +
                              " --method rtn --tensor-type '^embed$=f16' " + extra);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return out;
}

CommandResult run_export(const fs::path& in, const fs::path& out, const std::string& format) {
    return run_qforge("export " + q(in) + " --format " + format + " -o " + q(out));
}

// W[o][i] of one exported linear by the published formulas (docs/FORMAT.md, "Importing
// quantized checkpoints"), read straight from the safetensors parts.
std::vector<float> dequantize_exported(const SafetensorsCheckpoint& ck, const std::string& base,
                                       bool gptq, uint32_t bits, uint64_t n, uint64_t k) {
    auto word = [&](const std::string& part, uint64_t i) {
        uint32_t v;
        std::memcpy(&v, ck.tensor(base + part).data.data() + 4 * i, 4);
        return v;
    };
    auto scale = [&](uint64_t g, uint64_t o) {
        uint16_t h;
        std::memcpy(&h, ck.tensor(base + ".scales").data.data() + 2 * (g * n + o), 2);
        return f16_to_f32(h);
    };
    const uint32_t p = 32 / bits, mask = (1u << bits) - 1;
    const uint32_t awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    uint32_t awq_nibble[8];
    for (uint32_t s = 0; s < 8; ++s) awq_nibble[awq_order[s]] = s;
    const uint64_t groups = ck.find(base + ".scales")->shape[0];
    const uint64_t group = (k + groups - 1) / groups;
    std::vector<float> w(n * k);
    for (uint64_t o = 0; o < n; ++o)
        for (uint64_t i = 0; i < k; ++i) {
            int32_t code, zero;
            uint64_t g;
            if (gptq) {
                g = word(".g_idx", i);
                code = static_cast<int32_t>((word(".qweight", i / p * n + o) >> (bits * (i % p))) &
                                            mask);
                zero = static_cast<int32_t>(
                           (word(".qzeros", g * (n / p) + o / p) >> (bits * (o % p))) & mask) +
                       1;
            } else {
                g = i / group;
                code = static_cast<int32_t>(
                    (word(".qweight", i * (n / 8) + o / 8) >> (4 * awq_nibble[o % 8])) & mask);
                zero = static_cast<int32_t>(
                    (word(".qzeros", g * (n / 8) + o / 8) >> (4 * awq_nibble[o % 8])) & mask);
            }
            w[o * k + i] = scale(g, o) * static_cast<float>(code - zero);
        }
    return w;
}

// W[o][i] of one compressed-tensors linear by its published layout (pack_to_int32: code i of a
// row at bits [b i, +b) of the row's words, signed codes and zeros stored + 2^(b-1), zeros packed
// along the output), read straight from the safetensors parts.
std::vector<float> dequantize_ct_exported(const SafetensorsCheckpoint& ck, const std::string& base,
                                          uint32_t bits, bool sym, uint64_t n, uint64_t k) {
    const auto packed = ck.tensor(base + ".weight_packed").data,
               scales = ck.tensor(base + ".weight_scale").data,
               zeros = sym ? packed : ck.tensor(base + ".weight_zero_point").data;
    auto word = [&](std::span<const uint8_t> part, uint64_t i) {
        uint32_t v;
        std::memcpy(&v, part.data() + 4 * i, 4);
        return v;
    };
    const uint64_t groups = ck.find(base + ".weight_scale")->shape[1], group = k / groups;
    const uint64_t bit_row = ck.find(base + ".weight_packed")->shape[1] * 32;
    const int32_t offset = 1 << (bits - 1), mask = (1 << bits) - 1;
    std::vector<float> w(n * k);
    for (uint64_t o = 0; o < n; ++o)
        for (uint64_t i = 0; i < k; ++i) {
            const uint64_t bit = o * bit_row + bits * i, g = i / group;
            const int32_t q = static_cast<int32_t>(word(packed, bit / 32) >> (bit % 32)) & mask;
            int32_t zero = offset;
            if (!sym) {
                const uint64_t zbit = bits * o;
                zero =
                    static_cast<int32_t>(word(zeros, zbit / 32 * groups + g) >> (zbit % 32)) & mask;
            }
            uint16_t h;
            std::memcpy(&h, scales.data() + 2 * (o * groups + g), 2);
            w[o * k + i] = f16_to_f32(h) * static_cast<float>((q - offset) - (zero - offset));
        }
    return w;
}

// Every quantized linear of `qf` (X.weight -> the base name X given to `dequantized`) dequantizes
// with dequantize_row_ref to exactly `dequantized`'s weights; returns how many were compared.
uint64_t require_linears_equal(
    const fs::path& qf,
    const std::function<std::vector<float>(const std::string&, const QfTensorInfo&)>& dequantized) {
    const QfFile f(qf.string());
    const ModelConfig config = model_config_from_json(f.model(), qf.string());
    std::vector<uint8_t> scratch;
    uint64_t linears = 0;
    for (const TensorSpec& s : expected_tensors(config)) {
        const QfTensorInfo& t = f.at(s.name);
        if (!qtype_is_quantized(t.qtype) || s.name == "embed") continue;
        INFO(s.name);
        const uint64_t n = t.shape[0], k = t.shape[1];
        const auto got = dequantized(s.hf_name.substr(0, s.hf_name.size() - 7), t);
        const auto bytes = f.tensor_bytes(t, scratch);
        const uint64_t row_bytes = *qtype_row_bytes(t.qtype, k);
        std::vector<float> ref(k);
        for (uint64_t o = 0; o < n; ++o) {
            dequantize_row_ref(t.qtype, bytes.data() + o * row_bytes, k, ref.data());
            REQUIRE(std::memcmp(ref.data(), &got[o * k], 4 * k) == 0);
        }
        ++linears;
    }
    return linears;
}

void require_same_tensors(const fs::path& a, const fs::path& b) {
    const QfFile fa(a.string()), fb(b.string());
    CHECK(fa.model() == fb.model());
    CHECK(fa.header().at("tokenizer") == fb.header().at("tokenizer"));
    REQUIRE(fa.tensors().size() == fb.tensors().size());
    std::vector<uint8_t> sa, sb;
    for (size_t i = 0; i < fa.tensors().size(); ++i) {
        const QfTensorInfo &ta = fa.tensors()[i], &tb = fb.tensors()[i];
        INFO(ta.name);
        REQUIRE(ta.name == tb.name);
        REQUIRE(ta.qtype == tb.qtype);
        REQUIRE(ta.shape == tb.shape);
        const auto ba = fa.tensor_bytes(ta, sa), bb = fb.tensor_bytes(tb, sb);
        REQUIRE(std::equal(ba.begin(), ba.end(), bb.begin(), bb.end()));
    }
}

}  // namespace

TEST_CASE("export then import gives back the same tensor bytes", "[interop][export]") {
    ScratchDir dir("hf_export_roundtrip");
    const fs::path base = make_float_model(dir);
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"q4_g32", "gptq"}, {"q4_g32", "awq"}, {"q4s_g128", "gptq"}, {"q8_g32", "gptq"}};
    for (const auto& [qtype, format] : cases) {
        DYNAMIC_SECTION(qtype << " as " << format) {
            const fs::path qf = quantize(base, dir, qtype);
            const fs::path out = dir / (qtype + "_" + format);
            const auto r = run_export(qf, out, format);
            INFO(r.output);
            REQUIRE(r.exit_code == 0);
            const auto cfg = nlohmann::json::parse(read_file(out / "config.json"));
            const auto& qc = cfg.at("quantization_config");
            CHECK(qc.at("quant_method") == format);
            CHECK(qc.at("group_size") == qtype_traits(*qtype_from_name(qtype)).group);
            CHECK(qc.at("bits") == qtype_traits(*qtype_from_name(qtype)).bits);

            const auto imp = run_qforge("convert " + q(out) + " -o " + q(dir / "re.qf"));
            INFO(imp.output);
            REQUIRE(imp.exit_code == 0);
            require_same_tensors(qf, dir / "re.qf");

            // (2) every exported linear, dequantized by the formulas, equals our reference.
            const SafetensorsCheckpoint ck(out.string());
            const bool gptq = format == "gptq";  // the lambda captures this, not the binding
            require_linears_equal(qf, [&](const std::string& hf, const QfTensorInfo& t) {
                return dequantize_exported(ck, hf, gptq, qtype_traits(t.qtype).bits, t.shape[0],
                                           t.shape[1]);
            });
        }
    }
}

TEST_CASE("compressed-tensors export then import gives back the same tensor bytes",
          "[interop][export]") {
    ScratchDir dir("ct_export_roundtrip");
    // hidden 192: k = 192 is not a whole number of 128-groups, so q4_g128 is written in groups
    // of 64 (each scale twice) and merged back on import.
    const std::vector<std::tuple<std::string, uint64_t, int64_t>> cases = {
        {"q4_g32", 128, 32},   {"q4_g64", 128, 64},    {"q4_g128", 128, 128}, {"q4s_g32", 128, 32},
        {"q4s_g64", 128, 64},  {"q4s_g128", 128, 128}, {"q8", 128, -1},       {"q8_g32", 128, 32},
        {"q8_g128", 128, 128}, {"q4_g128", 192, 64},   {"q4s_g128", 192, 64}};
    const std::map<uint64_t, fs::path> models = {{128, make_float_model(dir, false, 128)},
                                                 {192, make_float_model(dir, false, 192)}};
    for (const auto& [qtype, hidden, group] : cases) {
        {
            INFO(qtype << " at hidden " << hidden);
            const fs::path qf = quantize(models.at(hidden), dir, qtype);
            const fs::path out = dir / (qtype + "_" + std::to_string(hidden) + "_ct");
            ExportOptions o;
            o.input = qf.string();
            o.output_dir = out.string();
            o.format = HfQuantMethod::compressed_tensors;
            export_hf_quantized(o);
            const auto cfg = nlohmann::json::parse(read_file(out / "config.json"));
            const auto& qc = cfg.at("quantization_config");
            const QTypeTraits& tr = qtype_traits(*qtype_from_name(qtype));
            CHECK(qc.at("quant_method") == "compressed-tensors");
            CHECK(qc.at("format") == "pack-quantized");
            CHECK(qc.at("quantization_status") == "compressed");
            CHECK(qc.at("ignore") == nlohmann::json::array({"lm_head"}));
            const auto& w = qc.at("config_groups").at("group_0").at("weights");
            CHECK(w.at("num_bits") == tr.bits);
            CHECK(w.at("symmetric") == tr.symmetric);
            CHECK(w.at("strategy") == (group == -1 ? "channel" : "group"));
            CHECK(w.at("group_size") == (group == -1 ? nlohmann::json() : nlohmann::json(group)));

            ConvertOptions c;
            c.input = out.string();
            c.output = (dir / "re.qf").string();
            fs::remove(c.output);
            convert_checkpoint(c);
            require_same_tensors(qf, c.output);

            // Every exported linear, dequantized by the published layout, equals our reference.
            const SafetensorsCheckpoint ck(out.string());
            const uint64_t linears =
                require_linears_equal(qf, [&](const std::string& hf, const QfTensorInfo& t) {
                    return dequantize_ct_exported(ck, hf, tr.bits, tr.symmetric, t.shape[0],
                                                  t.shape[1]);
                });
            CHECK(linears == 7);
        }
    }
}

TEST_CASE("compressed-tensors export refuses the types it cannot hold, naming the nearest",
          "[interop][export]") {
    ScratchDir dir("ct_export_refusals");
    const fs::path base = make_float_model(dir);
    const auto r = run_export(quantize(base, dir, "q3_g128"), dir / "out", "compressed-tensors");
    CHECK(r.exit_code == 1);
    CHECK(!fs::exists(dir / "out"));
    CHECK_THAT(r.output, Catch::Contains("layers.0.attn.q") && Catch::Contains("q3_g128") &&
                             Catch::Contains("cannot be exported to compressed-tensors") &&
                             Catch::Contains("--qtype q4_g128 instead"));
}

TEST_CASE("export refuses what GPTQ and AWQ cannot express", "[interop][export]") {
    ScratchDir dir("hf_export_refusals");
    const fs::path base = make_float_model(dir);
    auto refused = [&](const fs::path& qf, const std::string& format) {
        const auto r = run_export(qf, dir / "out", format);
        CHECK(r.exit_code == 1);
        CHECK(!fs::exists(dir / "out"));
        CHECK(files_containing(dir.path(), "qforge-tmp").empty());
        return r.output;
    };
    SECTION("3-bit") {
        const auto out = refused(quantize(base, dir, "q3_g32"), "gptq");
        CHECK_THAT(out, Catch::Contains("layers.0.attn.q") && Catch::Contains("q3_g32") &&
                            Catch::Contains("cannot be exported to gptq"));
    }
    SECTION("non-uniform 4-bit levels") {
        for (const std::string format : {"gptq", "awq", "compressed-tensors"}) {
            INFO(format);
            const auto out = refused(quantize(base, dir, "q4nl_g32"), format);
            CHECK_THAT(out, Catch::Contains("layers.0.attn.q") && Catch::Contains("q4nl_g32") &&
                                Catch::Contains("cannot be exported to " + format));
        }
    }
    SECTION("symmetric 4-bit as AWQ") {
        const auto out = refused(quantize(base, dir, "q4s_g128"), "awq");
        CHECK_THAT(out,
                   Catch::Contains("q4s_g128") && Catch::Contains("AWQ holds 4-bit asymmetric"));
    }
    SECTION("mixed group sizes") {
        const auto out =
            refused(quantize(base, dir, "q4_g32", "--tensor-type 'mlp\\.down=q4_g128'"), "gptq");
        CHECK_THAT(out, Catch::Contains("layers.0.mlp.down") && Catch::Contains("q4_g128") &&
                            Catch::Contains("mixed group sizes"));
    }
    SECTION("mixed sym and asym") {
        const auto out =
            refused(quantize(base, dir, "q4_g32", "--tensor-type 'mlp\\.down=q4s_g32'"), "gptq");
        CHECK_THAT(out, Catch::Contains("mixed sym/asym"));
    }
    SECTION("a float .qf") {
        CHECK_THAT(refused(base, "gptq"), Catch::Contains("no quantized linear"));
    }
}

TEST_CASE("tokenizer files written from the schema read back to the same schema",
          "[interop][export]") {
    ScratchDir dir("hf_export_tokenizers");
    const fs::path fixtures = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "tokenizers";
    for (const char* name : {"gpt2", "llama2", "llama2-metaspace", "llama3", "qwen2", "smollm2"}) {
        INFO(name);
        const nlohmann::json schema =
            load_tokenizer_source((fixtures / name / "tokenizer.json").string());
        const HfTokenizerFiles files = hf_tokenizer_files(schema, name);
        const fs::path out = dir / name;
        fs::create_directories(out);
        write_file(out / "tokenizer.json", files.tokenizer.dump(2));
        write_file(out / "tokenizer_config.json", files.tokenizer_config.dump(2));
        write_file(out / "generation_config.json", files.generation_config.dump(2));
        const nlohmann::json back = load_tokenizer_source((out / "tokenizer.json").string());
        for (const auto& [key, value] : schema.items()) {
            INFO(key);
            CHECK(back.at(key) == value);
        }
        CHECK(back == schema);
    }
    const nlohmann::json llama2c = load_tokenizer_source((kFixtures / "tok512.bin").string());
    CHECK_THROWS_WITH(hf_tokenizer_files(llama2c, "tok512.bin"),
                      Catch::Contains("no tokenizer.json form"));
}

TEST_CASE("exporting an imported checkpoint gives back its tensors byte for byte",
          "[interop][export]") {
    // The numpy fixtures (scripts/make_quant_checkpoint_fixtures.py) pack the published layouts
    // independently of qforge; import then export must reproduce every tensor of them.
    ScratchDir dir("hf_export_fixtures");
    for (const auto& [name, format] :
         std::vector<std::pair<std::string, std::string>>{{"gptq_4bit_asym_g32", "gptq"},
                                                          {"gptq_4bit_sym_g128", "gptq"},
                                                          {"gptq_4bit_asym_gm1", "gptq"},
                                                          {"gptq_4bit_act_order", "gptq"},
                                                          {"gptq_4bit_sym_act_order", "gptq"},
                                                          {"awq_4bit_g64", "awq"}}) {
        INFO(name);
        const fs::path qf = dir / (name + ".qf");
        ConvertOptions o;
        o.input = (kFixtures / name).string();
        o.output = qf.string();
        convert_checkpoint(o);
        const auto r = run_export(qf, dir / name, format);
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
        const SafetensorsCheckpoint fixture((kFixtures / name).string()),
            exported((dir / name).string());
        CHECK(fixture.tensor_names().size() == exported.tensor_names().size());
        for (const std::string& t : fixture.tensor_names()) {
            INFO(t);
            REQUIRE(exported.contains(t));
            const TensorView a = fixture.tensor(t), b = exported.tensor(t);
            CHECK(a.dtype == b.dtype);
            CHECK(a.shape == b.shape);
            CHECK(std::equal(a.data.begin(), a.data.end(), b.data.begin(), b.data.end()));
        }
    }
}

TEST_CASE("stories260K exports with its unpackable linears kept float", "[interop][export]") {
    // hidden_dim 172 packs into no 8-code word: gate/up ([172, 64]) stay float for AWQ (listed in
    // modules_to_not_convert); GPTQ also packs down's input (172), so all of the MLP stays float
    // and the config lists the quantized linears (modules_in_block_to_quantize).
    QF_REQUIRE_SHARED_DATA(data);
    ScratchDir dir("hf_export_stories");
    const fs::path f32 = convert_stories(data, "hf", dir);
    fs::copy_file(data / "stories260K" / "tok512.bin", dir / "tok512.bin");
    const auto plain = run_export(quantize(f32, dir, "q4_g32"), dir / "refused", "gptq");
    CHECK(plain.exit_code == 1);
    CHECK_THAT(plain.output, Catch::Contains("layers.0.mlp.gate") &&
                                 Catch::Contains("does not pack into whole 8-code words"));
    // GPTQ has one modules_in_block_to_quantize list for all blocks.
    const fs::path uneven = dir / "uneven.qf";
    REQUIRE(run_qforge("quantize " + q(f32) + " -o " + q(uneven) +
                       " --qtype q4_g32 --method rtn --tensor-type 'mlp\\.=f32' "
                       "--tensor-type '^layers\\.4\\.attn\\.q$=f32'")
                .exit_code == 0);
    const auto refused = run_export(uneven, dir / "refused", "gptq");
    CHECK(refused.exit_code == 1);
    CHECK_THAT(refused.output, Catch::Contains("layers.4.*") &&
                                   Catch::Contains("quantizes other linears than layers.0.*"));

    for (const auto& [format, keep_float] : std::vector<std::pair<std::string, std::string>>{
             {"awq", "mlp\\.(gate|up)"}, {"gptq", "mlp\\."}}) {
        INFO(format);
        const fs::path qf = dir / (format + ".qf");
        const auto qr = run_qforge("quantize " + q(f32) + " -o " + q(qf) +
                                   " --qtype q4_g32 --method rtn --tensor-type '^embed$=f32' "
                                   "--tensor-type '" +
                                   keep_float + "=f32'");
        REQUIRE(qr.exit_code == 0);
        const fs::path out = dir / format;
        const auto r = run_export(qf, out, format);
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
        CHECK_THAT(r.output, Catch::Contains("no tokenizer.json form"));
        const auto qc =
            nlohmann::json::parse(read_file(out / "config.json")).at("quantization_config");
        if (format == "awq") {
            CHECK(qc.at("modules_to_not_convert").size() == 10);
            CHECK(qc.at("modules_to_not_convert")[0] == "model.layers.0.mlp.gate_proj");
        } else {
            CHECK(qc.at("modules_in_block_to_quantize") ==
                  nlohmann::json::parse(R"([["self_attn.k_proj", "self_attn.o_proj",
                                             "self_attn.q_proj", "self_attn.v_proj"]])"));
        }
        const auto imp = run_qforge("convert " + q(out) + " -o " + q(dir / "re.qf"));
        INFO(imp.output);
        REQUIRE(imp.exit_code == 0);
        require_same_tensors(qf, dir / "re.qf");
    }
}

TEST_CASE("GPTQ v1 cannot hold a 4-bit zero point of 0, GPTQ v2 and AWQ can", "[interop][export]") {
    ScratchDir dir("hf_export_zero");
    const fs::path qf = quantize(make_float_model(dir, true), dir, "q4_g32");
    const auto gptq = run_export(qf, dir / "gptq", "gptq");
    CHECK(gptq.exit_code == 1);
    CHECK_THAT(gptq.output, Catch::Contains("layers.0.attn.q") &&
                                Catch::Contains("zero point 0 cannot be written to GPTQ v1"));
    CHECK(!fs::exists(dir / "gptq"));
    const auto awq = run_export(qf, dir / "awq", "awq");
    INFO(awq.output);
    REQUIRE(awq.exit_code == 0);
    REQUIRE(run_qforge("convert " + q(dir / "awq") + " -o " + q(dir / "re.qf")).exit_code == 0);
    require_same_tensors(qf, dir / "re.qf");

    // v2 stores the zeros themselves and says so; the v1 reader's formula would be one step off,
    // so the import reads them as v2 (asymmetric zeros fit both: checkpoint_format decides).
    const auto v2 = run_export(qf, dir / "v2", "gptq_v2");
    INFO(v2.output);
    REQUIRE(v2.exit_code == 0);
    const auto qc =
        nlohmann::json::parse(read_file(dir / "v2" / "config.json")).at("quantization_config");
    CHECK(qc.at("checkpoint_format") == "gptq_v2");
    const SafetensorsCheckpoint ck((dir / "v2").string());
    uint32_t zero;  // layers.0.attn.q is non-negative: its first group's zero is 0, stored as 0
    std::memcpy(&zero, ck.tensor("model.layers.0.self_attn.q_proj.qzeros").data.data(), 4);
    CHECK((zero & 0xf) == 0);
    fs::remove(dir / "re.qf");
    REQUIRE(run_qforge("convert " + q(dir / "v2") + " -o " + q(dir / "re.qf")).exit_code == 0);
    require_same_tensors(qf, dir / "re.qf");
}

TEST_CASE("GPTQ export writes v1 with an explicit checkpoint_format, v2 on request",
          "[interop][export]") {
    ScratchDir dir("hf_export_v1_v2");
    const fs::path qf = quantize(make_float_model(dir), dir, "q4s_g128");
    for (const std::string format : {"gptq", "gptq_v2"}) {
        INFO(format);
        const fs::path out = dir / format;
        REQUIRE(run_export(qf, out, format).exit_code == 0);
        const auto qc =
            nlohmann::json::parse(read_file(out / "config.json")).at("quantization_config");
        CHECK(qc.at("checkpoint_format") == format);
        // sym: zero 8, stored 7 by v1 (zero - 1) and 8 by v2, in all eight nibbles of a word.
        const SafetensorsCheckpoint ck(out.string());
        uint32_t word;
        std::memcpy(&word, ck.tensor("model.layers.0.mlp.down_proj.qzeros").data.data(), 4);
        CHECK(word == (format == "gptq" ? 0x77777777u : 0x88888888u));
        const fs::path re = dir / (format + ".qf");
        REQUIRE(run_qforge("convert " + q(out) + " -o " + q(re)).exit_code == 0);
        require_same_tensors(qf, re);
    }
}

TEST_CASE("large exports are sharded with an index", "[interop][export]") {
    ScratchDir dir("hf_export_shards");
    const fs::path qf = quantize(make_float_model(dir), dir, "q4_g32");
    ExportOptions o;
    o.input = qf.string();
    o.output_dir = (dir / "sharded").string();
    o.format = HfQuantMethod::gptq;
    o.max_shard_bytes = 64 * 1024;  // the f16 embedding alone is 128 KiB: several shards
    const ExportReport r = export_hf_quantized(o);
    CHECK(std::count_if(r.files.begin(), r.files.end(),
                        [](const std::string& f) { return f.starts_with("model-"); }) >= 2);
    const auto index =
        nlohmann::json::parse(read_file(dir / "sharded" / "model.safetensors.index.json"));
    CHECK(index.at("metadata").at("total_size") == r.bytes);
    CHECK(index.at("weight_map").size() == r.tensors);
    REQUIRE(run_qforge("convert " + q(dir / "sharded") + " -o " + q(dir / "re.qf")).exit_code == 0);
    require_same_tensors(qf, dir / "re.qf");
    // An existing non-empty output is refused, and left as it was.
    CHECK_THROWS_WITH(export_hf_quantized(o), Catch::Contains("not an empty directory"));
    CHECK(fs::exists(dir / "sharded" / "model.safetensors.index.json"));
}

}  // namespace hf_export_test
