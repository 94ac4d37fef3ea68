// GPTQ and AWQ Hugging Face checkpoints import without re-quantizing: fixtures packed by numpy
// from the published formats (scripts/make_quant_checkpoint_fixtures.py) convert to .qf files
// whose every linear dequantizes (dequantize_row_ref) to exactly the weights numpy computed from
// the format's own formula; act-order checkpoints and hostile configs and tensors are refused
// with one line naming the file and the tensor; an imported model runs.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "formats/architectures.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "formats/safetensors.hpp"
#include "qf_support.hpp"
#include "sources/hf_quantized.hpp"
#include "test_support.hpp"

namespace hf_quantized_import_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "quant_checkpoints";

std::string convert_case(const fs::path& in, const ScratchDir& dir, const std::string& name) {
    ConvertOptions o;
    o.input = in.string();
    o.output = (dir / (name + ".qf")).string();
    convert_checkpoint(o);
    return o.output;
}

// The Error a conversion throws (and that it leaves no .qf behind).
std::string convert_error(const fs::path& in, const ScratchDir& dir) {
    try {
        convert_case(in, dir, "refused");
    } catch (const Error& e) {
        CHECK(files_containing(dir.path(), ".qf").empty());
        return e.what();
    }
    FAIL("converted " << in);
    return {};
}

// A copy of a fixture case in `dir`, so a test can break one piece of it.
fs::path copy_case(const std::string& name, const ScratchDir& dir) {
    const fs::path to = dir / name;
    fs::remove_all(to);
    fs::copy(kFixtures / name, to);
    fs::copy_file(kFixtures / "tok512.bin", dir / "tok512.bin", fs::copy_options::skip_existing);
    return to;
}

void edit_config(const fs::path& config, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(read_file(config));
    edit(j);
    write_file(config, j.dump(2));
}

// Rewrites model.safetensors with one tensor replaced by `replacement` (same name), or added.
void replace_tensor(const fs::path& dir, const TensorView& replacement) {
    const fs::path path = dir / "model.safetensors";
    std::vector<TensorView> views;
    std::vector<std::vector<uint8_t>> keep;
    {
        const SafetensorsFile f(path.string());
        bool replaced = false;
        for (const auto& info : f.tensors()) {
            replaced |= info.name == replacement.name;
            const TensorView v = info.name == replacement.name ? replacement : f.view(info);
            keep.emplace_back(v.data.begin(), v.data.end());
            views.push_back({v.name, v.dtype, v.shape, keep.back()});
        }
        if (!replaced) {
            keep.emplace_back(replacement.data.begin(), replacement.data.end());
            views.push_back(replacement);
        }
    }
    for (size_t i = 0; i < views.size(); ++i) views[i].data = keep[i];
    fs::remove(path);
    write_safetensors(path.string(), views);
}

// The Error converting a copy of fixture `name` gives once `edit` changed its `file`, which the
// Error must name first.
std::string refused_with_config(const ScratchDir& dir, const std::string& name,
                                const std::string& file,
                                const std::function<void(nlohmann::json&)>& edit) {
    const fs::path d = copy_case(name, dir);
    edit_config(d / file, edit);
    const std::string e = convert_error(d, dir);
    CHECK_THAT(e, Catch::StartsWith((d / file).string() + ": "));
    return e;
}

// The same with one tensor replaced (or added), which the Error must name.
std::string refused_with_tensor(const ScratchDir& dir, const std::string& name,
                                const TensorView& v) {
    const fs::path d = copy_case(name, dir);
    replace_tensor(d, v);
    const std::string e = convert_error(d, dir);
    CHECK_THAT(
        e, Catch::StartsWith((d / "model.safetensors").string() + ": tensor '" + v.name + "': "));
    return e;
}

}  // namespace

TEST_CASE("GPTQ/AWQ import: every linear dequantizes exactly to the format's own formula",
          "[interop]") {
    const std::map<std::string, QType> cases = {{"gptq_4bit_asym_g32", QType::q4_g32},
                                                {"gptq_4bit_sym_g128", QType::q4s_g128},
                                                {"gptq_4bit_asym_gm1", QType::q4_g128},
                                                {"gptq_8bit_sym_g64", QType::q8_g32},
                                                {"awq_4bit_g64", QType::q4_g64},
                                                {"gptq_4bit_asym_g32_v2", QType::q4_g32},
                                                {"gptq_4bit_sym_g128_v2_as_gptq", QType::q4s_g128},
                                                // desc_act: rows stored sorted by group, with
                                                // the column permutation beside them
                                                {"gptq_4bit_act_order", QType::q4_g32},
                                                {"gptq_4bit_sym_act_order", QType::q4s_g32},
                                                // compressed-tensors' own compressor wrote
                                                // these (make_compressed_tensors_fixtures.py)
                                                {"ct_4bit_asym_g32", QType::q4_g32},
                                                {"ct_4bit_sym_g32_bf16", QType::q4s_g32},
                                                {"ct_8bit_sym_channel", QType::q8}};
    ScratchDir dir("hf-quantized-import");
    for (const auto& [name, qtype] : cases) {
        INFO(name);
        const QfFile qf(convert_case(kFixtures / name, dir, name));
        const ModelConfig cfg = read_model_config((kFixtures / name / "config.json").string());
        const SafetensorsFile ref((kFixtures / name / "reference.safetensors").string());
        CHECK(qf.has_tokenizer());
        const auto& recipe = qf.header().at("provenance").at("recipe");
        CHECK(recipe.at("source_format") == (name.starts_with("awq")   ? "awq"
                                             : name.starts_with("ct_") ? "compressed-tensors"
                                                                       : "gptq"));
        CHECK(recipe.at("imported_qtype") == qtype_traits(qtype).name);
        uint64_t linears = 0, exact = 0, weights = 0, permuted = 0;
        for (const TensorSpec& s : expected_tensors(cfg)) {
            const QfTensorInfo& t = qf.at(s.name);
            INFO(s.name);
            if (!ref.find(s.hf_name)) {
                CHECK(t.qtype ==
                      QType::f16);  // embeddings and norms stay as the checkpoint has them
                continue;
            }
            REQUIRE(t.qtype == qtype);
            const TensorView r = ref.view(*ref.find(s.hf_name));
            REQUIRE(r.shape == t.shape);
            std::vector<uint8_t> scratch;
            const auto bytes = qf.tensor_bytes(t, scratch);
            const uint64_t rows = t.shape[0], k = t.shape[1],
                           row_bytes = *qtype_row_bytes(qtype, k);
            std::vector<float> got(k), want(k);
            for (uint64_t o = 0; o < rows; ++o) {
                dequantize_row_ref(qtype, bytes.data() + o * row_bytes, k, got.data());
                std::memcpy(want.data(), r.data.data() + o * k * 4, k * 4);
                // Stored column i holds input col_perm[i] (act-order), or input i.
                for (uint64_t i = 0; i < k; ++i)
                    exact += std::memcmp(&got[i], &want[t.col_perm.empty() ? i : t.col_perm[i]],
                                         sizeof(float)) == 0;
            }
            weights += rows * k;
            ++linears;
            // Only mlp.down (k = 128, four groups) has groups to permute; k = 32 is one group.
            permuted += !t.col_perm.empty();
            CHECK(t.col_perm.empty() ==
                  (!name.ends_with("act_order") || s.name != "layers.0.mlp.down"));
        }
        CHECK(linears == 7);
        CHECK(permuted == (name.ends_with("act_order") ? 1 : 0));
        CHECK(exact == weights);
        CHECK(weights == 32 * 32 * 2 + 16 * 32 * 2 + 128 * 32 * 3);
    }
}

TEST_CASE("GPTQ/AWQ import: the imported model runs (ppl, finite)", "[interop][cli]") {
    ScratchDir dir("hf-quantized-run");
    const std::string model = convert_case(kFixtures / "gptq_4bit_asym_g32", dir, "m");
    const std::string model8 = convert_case(kFixtures / "gptq_8bit_sym_g64", dir, "m8");
    std::string text;
    for (int i = 0; i < 4; ++i)
        text += "Once upon a time there was a little cat. It liked to play in the sun. ";
    write_file(dir / "text.txt", text);
    for (const std::string& m : {model, model8}) {
        const auto r = run_qforge("ppl '" + m + "' -f '" + (dir / "text.txt").string() +
                                  "' --ctx 16 --json -q");
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
        const auto j = nlohmann::json::parse(r.output);
        CHECK(std::isfinite(j.at("ppl").get<double>()));
        CHECK(j.at("ppl").get<double>() > 1.0);
    }
}

TEST_CASE("GPTQ/AWQ import: act-order and hostile checkpoints are refused by name", "[interop]") {
    ScratchDir dir("hf-quantized-refused");
    // A g_idx that is no permutation of whole groups (group 0 holding 31 inputs) is refused.
    {
        const std::string down = "model.layers.0.mlp.down_proj";
        std::vector<int32_t> g_idx(128);
        for (int32_t i = 0; i < 128; ++i) g_idx[static_cast<size_t>(i)] = i / 32;
        g_idx[0] = 1;
        CHECK_THAT(refused_with_tensor(dir, "gptq_4bit_act_order",
                                       {down + ".g_idx",
                                        DType::i32,
                                        {128},
                                        {reinterpret_cast<const uint8_t*>(g_idx.data()), 512}}),
                   Catch::Contains("group 0 holds 31 inputs, not 32"));
        g_idx[0] = 4;
        CHECK_THAT(refused_with_tensor(dir, "gptq_4bit_act_order",
                                       {down + ".g_idx",
                                        DType::i32,
                                        {128},
                                        {reinterpret_cast<const uint8_t*>(g_idx.data()), 512}}),
                   Catch::Contains("g_idx[0] is 4, outside the 4 groups"));
    }

    auto refused_config = [&](const std::string& name, const std::string& file,
                              const std::function<void(nlohmann::json&)>& edit) {
        return refused_with_config(dir, name, file, edit);
    };
    auto qc = [](nlohmann::json& j) -> nlohmann::json& { return j["quantization_config"]; };
    CHECK_THAT(
        refused_config("gptq_4bit_asym_g32", "config.json", [&](auto& j) { qc(j)["bits"] = 3; }),
        Catch::Contains("GPTQ bits 3 is not supported (qforge imports 4- and 8-bit GPTQ)"));
    CHECK_THAT(
        refused_config("gptq_4bit_asym_g32", "config.json", [&](auto& j) { qc(j)["bits"] = 2; }),
        Catch::Contains("GPTQ bits 2 is not supported"));
    CHECK_THAT(refused_config("gptq_4bit_asym_g32", "config.json",
                              [&](auto& j) { qc(j)["checkpoint_format"] = "marlin"; }),
               Catch::Contains("GPTQ checkpoint_format 'marlin' is not supported"));
    CHECK_THAT(
        refused_config("awq_4bit_g64", "config.json", [&](auto& j) { qc(j)["version"] = "gemv"; }),
        Catch::Contains("AWQ version 'gemv' is not supported (supported: gemm)"));
    CHECK_THAT(refused_config("gptq_4bit_asym_g32", "config.json",
                              [&](auto& j) { qc(j)["quant_method"] = "bitsandbytes"; }),
               Catch::Contains("quant_method 'bitsandbytes' is not supported"));
    CHECK_THAT(refused_config("gptq_4bit_asym_g32", "config.json",
                              [&](auto& j) { qc(j)["group_size"] = 16; }),
               Catch::Contains("group_size 16 is not supported"));
    CHECK_THAT(refused_config("gptq_8bit_sym_g64", "quantize_config.json",
                              [&](auto& j) { j["sym"] = false; }),
               Catch::Contains("8-bit asymmetric GPTQ (sym false) is not supported"));

    // Tensors: a wrong qweight shape, a g_idx of the wrong length, a wrong dtype, a float
    // checkpoint's quantized parts without a declaration.
    const std::string q = "model.layers.0.self_attn.q_proj";
    auto refused_tensor = [&](const std::string& name, const TensorView& v) {
        return refused_with_tensor(dir, name, v);
    };
    std::vector<uint8_t> words(4 * 8 * 32, 0);
    CHECK_THAT(refused_tensor("gptq_4bit_asym_g32", {q + ".qweight", DType::i32, {8, 32}, words}),
               Catch::Contains("shape [8, 32], expected [4, 32]"));
    CHECK_THAT(refused_tensor("gptq_4bit_asym_g32",
                              {q + ".g_idx", DType::i32, {31}, {words.data(), 31 * 4}}),
               Catch::Contains("shape [31], expected [32]"));
    CHECK_THAT(refused_tensor("awq_4bit_g64",
                              {q + ".qweight", DType::f32, {32, 4}, {words.data(), 32 * 4 * 4}}),
               Catch::Contains("dtype F32, expected I32"));
    // Values: GPTQ v1's wrapped zero (stored 15, read 16), a sym checkpoint with another zero,
    // an infinite scale. q_proj is [32, 32]: one group (k = 32), four words of 8 zeros.
    const std::vector<uint8_t> all_ones(16, 0xff), all_zero(16, 0x00);
    CHECK_THAT(refused_tensor("gptq_4bit_asym_g32", {q + ".qzeros", DType::i32, {1, 4}, all_ones}),
               Catch::Contains("group 0, output 0: zero 16 is outside q4_g32's 0..15"));
    CHECK_THAT(
        refused_tensor("gptq_4bit_sym_g128", {q + ".qzeros", DType::i32, {1, 4}, all_zero}),
        Catch::Contains("group 0, output 0 stores zero 0") && Catch::Contains("fit neither"));
    std::vector<uint8_t> inf_scales(2 * 32, 0);
    for (size_t i = 0; i < inf_scales.size(); i += 2) inf_scales[i + 1] = 0x7c;  // fp16 +inf
    CHECK_THAT(refused_tensor("awq_4bit_g64", {q + ".scales", DType::f16, {1, 32}, inf_scales}),
               Catch::Contains("scale of group 0, output 0 is NaN or infinite"));
    {
        const fs::path d = copy_case("gptq_4bit_asym_g32", dir);
        edit_config(d / "config.json", [](auto& j) { j.erase("quantization_config"); });
        CHECK_THAT(convert_error(d, dir), Catch::Contains("a GPTQ/AWQ tensor, but") &&
                                              Catch::Contains("declares no quantization_config"));
    }
}

TEST_CASE("act-order import: the column permutation is kept, checked and refused where unusable",
          "[interop]") {
    ScratchDir dir("act-order");
    const fs::path qf = convert_case(kFixtures / "gptq_4bit_act_order", dir, "ao");
    // quantize cannot re-plan permuted rows; GGUF has no place for the permutation.
    const auto q = run_qforge("quantize '" + qf.string() + "' -o '" + (dir / "q.qf").string() +
                              "' --qtype q4_g32");
    CHECK(q.exit_code == 1);
    CHECK_THAT(q.output,
               Catch::Contains("layers.0.mlp.down") && Catch::Contains("column permutation"));
    // (q4s_g32 rows: the type GGUF holds, so the permutation is what it refuses.)
    const std::string sym = convert_case(kFixtures / "gptq_4bit_sym_act_order", dir, "sym");
    const auto g =
        run_qforge("export '" + sym + "' --format gguf -o '" + (dir / "ao.gguf").string() + "'");
    CHECK(g.exit_code == 1);
    CHECK_THAT(g.output, Catch::Contains("layers.0.mlp.down") && Catch::Contains("g_idx"));

    // The reader checks col_perm: a permutation of the columns, on quantized matrices only.
    const std::string header = qf_header_text(qf);
    auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
        nlohmann::json h = nlohmann::json::parse(header);
        for (auto& t : h["tensors"]) edit(t);
        const fs::path broken = dir / "broken.qf";
        fs::copy_file(qf, broken, fs::copy_options::overwrite_existing);
        replace_qf_header(broken, h.dump());
        try {
            QfFile f(broken.string());
        } catch (const Error& e) {
            return std::string(e.what());
        }
        FAIL("opened");
        return std::string();
    };
    CHECK_THAT(refused([](auto& t) {
                   if (t.contains("col_perm")) t["col_perm"][1] = t["col_perm"][0];
               }),
               Catch::Contains("layers.0.mlp.down") && Catch::Contains("not a permutation"));
    CHECK_THAT(refused([](auto& t) {
                   if (t.contains("col_perm")) t["col_perm"].erase(0);
               }),
               Catch::Contains("col_perm has 127 entries for 128 columns"));
    CHECK_THAT(refused([](auto& t) {
                   if (t["name"] == "final_norm") t["col_perm"] = {0};
               }),
               Catch::Contains("only quantized matrices are permuted"));
}

TEST_CASE("GPTQ v1 and v2 are told apart by their zeros, not their label", "[interop]") {
    ScratchDir dir("gptq-v1-v2");
    // The same codes and scales with v1 zeros (stored 7) and with v2 zeros (8) under v1's label:
    // the same rows, and a warning that the label was wrong.
    ConvertOptions o;
    o.input = (kFixtures / "gptq_4bit_sym_g128").string();
    o.output = (dir / "v1.qf").string();
    CHECK(convert_checkpoint(o).warnings.empty());
    o.input = (kFixtures / "gptq_4bit_sym_g128_v2_as_gptq").string();
    o.output = (dir / "v2.qf").string();
    const auto report = convert_checkpoint(o);
    REQUIRE(report.warnings.size() == 1);
    CHECK_THAT(report.warnings[0], Catch::Contains("checkpoint_format says gptq but the zeros") &&
                                       Catch::Contains("are GPTQ v2: read as v2"));
    {
        const QfFile a((dir / "v1.qf").string()), b((dir / "v2.qf").string());
        std::vector<uint8_t> sa, sb;
        for (const QfTensorInfo& t : a.tensors()) {
            INFO(t.name);
            const auto ba = a.tensor_bytes(t, sa), bb = b.tensor_bytes(b.at(t.name), sb);
            CHECK(std::equal(ba.begin(), ba.end(), bb.begin(), bb.end()));
        }
    }
    // v1 zeros under v2's label read as v1, with the warning.
    const fs::path relabeled = copy_case("gptq_4bit_sym_g128", dir);
    edit_config(relabeled / "config.json",
                [](auto& j) { j["quantization_config"]["checkpoint_format"] = "gptq_v2"; });
    o.input = relabeled.string();
    o.output = (dir / "relabeled.qf").string();
    CHECK_THAT(convert_checkpoint(o).warnings.at(0), Catch::Contains("read as v1"));

    // Zeros that fit neither, or both kinds in one checkpoint, are refused naming the tensor.
    ScratchDir refused("gptq-v1-v2-refused");
    const std::string q = "model.layers.0.self_attn.q_proj";
    std::vector<uint8_t> fives(16, 0x55), eights(16, 0x88);
    CHECK_THAT(refused_with_tensor(refused, "gptq_4bit_sym_g128",
                                   {q + ".qzeros", DType::i32, {1, 4}, fives}),
               Catch::Contains("group 0, output 0 stores zero 5") &&
                   Catch::Contains("so they fit neither"));
    eights[15] = 0x78;  // output 31 (the top nibble of the last word) stores v1's 7
    CHECK_THAT(refused_with_tensor(refused, "gptq_4bit_sym_g128",
                                   {q + ".qzeros", DType::i32, {1, 4}, eights}),
               Catch::Contains("output 31 stores zero 7") && Catch::Contains("first zero is v2"));
    eights[15] = 0x88;  // q_proj all v2, the others v1
    CHECK_THAT(refused_with_tensor(refused, "gptq_4bit_sym_g128",
                                   {q + ".qzeros", DType::i32, {1, 4}, eights}),
               Catch::Contains("stores GPTQ v") && Catch::Contains("a checkpoint holds one kind"));
}

TEST_CASE("compressed-tensors import: what it cannot hold exactly is refused by name",
          "[interop]") {
    ScratchDir dir("ct-import-refused");
    auto qc = [](nlohmann::json& j) -> nlohmann::json& { return j["quantization_config"]; };
    auto w = [&](nlohmann::json& j) -> nlohmann::json& {
        return qc(j)["config_groups"]["group_0"]["weights"];
    };
    auto refused_config = [&](const std::function<void(nlohmann::json&)>& edit) {
        return refused_with_config(dir, "ct_4bit_asym_g32", "config.json", edit);
    };
    CHECK_THAT(refused_config([&](auto& j) { qc(j)["format"] = "int-quantized"; }),
               Catch::Contains("format 'int-quantized' is not supported"));
    CHECK_THAT(refused_config([&](auto& j) { qc(j)["quantization_status"] = "frozen"; }),
               Catch::Contains("quantization_status 'frozen' is not supported"));
    CHECK_THAT(refused_config([&](auto& j) { w(j)["actorder"] = "group"; }),
               Catch::Contains("weights.actorder \"group\" is not supported"));
    CHECK_THAT(refused_config([&](auto& j) { w(j)["num_bits"] = 3; }),
               Catch::Contains("weights.num_bits 3 is not supported"));
    CHECK_THAT(refused_config([&](auto& j) { w(j)["strategy"] = "tensor"; }),
               Catch::Contains("weights.strategy 'tensor' is not supported"));
    CHECK_THAT(refused_config([&](auto& j) {
                   qc(j)["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
               }),
               Catch::Contains("'input_activations'") && Catch::Contains("weight-only"));
    CHECK_THAT(refused_config([&](auto& j) {
                   qc(j)["config_groups"]["group_1"] = qc(j)["config_groups"]["group_0"];
               }),
               Catch::Contains("2 config_groups"));

    const std::string q = "model.layers.0.self_attn.q_proj";
    auto refused_tensor = [&](const std::string& name, const TensorView& v) {
        return refused_with_tensor(dir, name, v);
    };
    const int64_t wrong_shape[2] = {32, 64};
    CHECK_THAT(
        refused_tensor("ct_4bit_asym_g32", {q + ".weight_shape",
                                            DType::i64,
                                            {2},
                                            {reinterpret_cast<const uint8_t*>(wrong_shape), 16}}),
        Catch::Contains("holds 64 at dimension 1, but config.json implies 32"));
    std::vector<uint8_t> words(4 * 32 * 8, 0);
    CHECK_THAT(
        refused_tensor("ct_4bit_asym_g32", {q + ".weight_packed", DType::i32, {32, 8}, words}),
        Catch::Contains("shape [32, 8], expected [32, 4]"));
    // A bfloat16 scale below binary16's smallest subnormal cannot be stored in our rows.
    std::vector<uint8_t> tiny(2 * 32, 0);
    for (size_t i = 0; i < tiny.size(); i += 2) tiny[i + 1] = 0x10;  // bf16 ~2.5e-29
    CHECK_THAT(
        refused_tensor("ct_4bit_sym_g32_bf16", {q + ".weight_scale", DType::bf16, {32, 1}, tiny}),
        Catch::Contains("scale of output 0, group 0") &&
            Catch::Contains("is not exact in binary16"));
    CHECK_THAT(refused_tensor("ct_4bit_asym_g32",
                              {q + ".weight_g_idx", DType::i32, {32}, {words.data(), 4 * 32}}),
               Catch::Contains("permuted group assignment"));
}

TEST_CASE("GPTQ/AWQ import: group sizes map to the largest table group that divides them",
          "[interop]") {
    auto target = [](uint32_t bits, int64_t group, bool sym) {
        HfQuantConfig qc{HfQuantMethod::gptq, "config.json", bits, group, sym, {}};
        return hf_quant_target(qc);
    };
    CHECK(target(4, 32, false) == QType::q4_g32);
    CHECK(target(4, 64, true) == QType::q4s_g64);
    CHECK(target(4, 256, false) == QType::q4_g128);
    CHECK(target(4, 96, true) == QType::q4s_g32);
    CHECK(target(4, -1, false) == QType::q4_g128);
    CHECK(target(8, -1, true) == QType::q8);
    CHECK(target(8, 64, true) == QType::q8_g32);
    CHECK(target(8, 128, true) == QType::q8_g128);
    CHECK(hf_quantized_part_of("model.layers.3.mlp.up_proj.qzeros") ==
          "model.layers.3.mlp.up_proj.weight");
    CHECK_FALSE(hf_quantized_part_of("model.norm.weight"));
}

TEST_CASE("GPTQ/AWQ import: a sharded checkpoint imports as the single file does", "[interop]") {
    ScratchDir dir("hf-quantized-sharded");
    const fs::path single = kFixtures / "gptq_4bit_asym_g32";
    const fs::path sharded = dir / "sharded";
    fs::create_directories(sharded);
    fs::copy_file(single / "config.json", sharded / "config.json");
    fs::copy_file(kFixtures / "tok512.bin", dir / "tok512.bin");
    // Every other tensor to the second shard, so a linear's parts are split between files.
    const SafetensorsFile f((single / "model.safetensors").string());
    std::vector<TensorView> shards[2];
    nlohmann::json weight_map = nlohmann::json::object();
    const std::string names[2] = {"model-00001-of-00002.safetensors",
                                  "model-00002-of-00002.safetensors"};
    size_t i = 0;
    for (const auto& info : f.tensors()) {
        shards[i % 2].push_back(f.view(info));
        weight_map[info.name] = names[i % 2];
        ++i;
    }
    for (int s = 0; s < 2; ++s) write_safetensors((sharded / names[s]).string(), shards[s]);
    write_file(
        sharded / "model.safetensors.index.json",
        nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", weight_map}}.dump());
    const QfFile a(convert_case(single, dir, "single")), b(convert_case(sharded, dir, "sharded"));
    REQUIRE(a.tensors().size() == b.tensors().size());
    for (size_t t = 0; t < a.tensors().size(); ++t) {
        CHECK(a.tensors()[t].name == b.tensors()[t].name);
        CHECK(a.tensors()[t].qtype == b.tensors()[t].qtype);
        CHECK(a.tensors()[t].checksum == b.tensors()[t].checksum);
    }
}

}  // namespace hf_quantized_import_test
