// `qforge quantize` end to end: every stored row recomputed independently with the reference
// quantizer, the recipe in the header, byte-identical output for any thread count, Hugging Face
// input equal to .qf input, and refusals (NaN weights, unknown types, bad regexes, re-quantizing)
// that leave no output behind. `qforge inspect` shows what quantize recorded.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "core/half.hpp"
#include "formats/architectures.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "formats/safetensors.hpp"
#include "test_support.hpp"

namespace quant_cli_test {

using namespace qforge;
using Catch::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kHfModels = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "hf_models";

using qforge::test::q;

std::vector<std::string> lines_of(const std::string& s) {
    std::vector<std::string> lines;
    size_t b = 0;
    for (size_t e; (e = s.find('\n', b)) != std::string::npos; b = e + 1)
        lines.push_back(s.substr(b, e - b));
    if (b < s.size()) lines.push_back(s.substr(b));
    return lines;
}

test::CommandResult quantize(const std::string& args) {
    return test::run_qforge("quantize " + args);
}

void require_ok(const test::CommandResult& r) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
}

// A non-zero exit, one line of error with the expected words, and nothing in `out_dir`. Errors
// found while streaming (NaN weights) follow the per-class decisions printed before the first
// tensor; those are the only other lines allowed.
void require_clean_failure(const test::CommandResult& r, const fs::path& out_dir,
                           const std::string& what) {
    INFO(r.output);
    REQUIRE(r.exit_code != 0);
    const std::vector<std::string> lines = lines_of(r.output);
    REQUIRE(!lines.empty());
    for (size_t i = 0; i + 1 < lines.size(); ++i)
        REQUIRE(lines[i].rfind("qforge: quantize: ", 0) == 0);
    REQUIRE(lines.back().rfind("qforge: error: ", 0) == 0);
    REQUIRE_THAT(lines.back(), Contains(what));
    REQUIRE(test::files_containing(out_dir, ".qf").empty());
}

// The type the default policy gives a tensor (quant/recipe.hpp), written out independently.
QType expected_default(QType def, const QfTensorInfo& t, bool tied) {
    if (t.shape.size() != 2) return QType::f32;
    const bool head = t.name == "lm_head" || (tied && t.name == "embed");
    const QTypeTraits& d = qtype_traits(def);
    if (head && !d.is_float && d.bits < 8) return QType::q8_g32;
    return def;
}

// Every tensor of `out` equals the reference quantizer applied row by row to the float tensor of
// the same name in `src` (converted to f32 by hand, not by the code under test).
void require_rows_equal_reference(const QfFile& src, const QfFile& out) {
    REQUIRE(out.tensors().size() == src.tensors().size());
    std::vector<uint8_t> s1, s2;
    for (size_t i = 0; i < out.tensors().size(); ++i) {
        const QfTensorInfo& o = out.tensors()[i];
        const QfTensorInfo& s = src.tensors()[i];
        INFO(o.name << " as " << qtype_traits(o.qtype).name);
        REQUIRE(o.name == s.name);
        REQUIRE(o.shape == s.shape);
        const auto in = src.tensor_bytes(s, s1);
        const auto got = out.tensor_bytes(o, s2);
        const uint64_t rows = o.shape.size() == 2 ? o.shape[0] : 1;
        const uint64_t k = o.shape.size() == 2 ? o.shape[1] : o.shape[0];
        const uint64_t out_row = *qtype_row_bytes(o.qtype, k);
        REQUIRE(got.size() == rows * out_row);
        std::vector<float> w(k);
        std::vector<uint8_t> want(out_row);
        for (uint64_t r = 0; r < rows; ++r) {
            for (uint64_t j = 0; j < k; ++j) {
                const uint64_t e = r * k + j;
                if (s.qtype == QType::f32) {
                    std::memcpy(&w[j], in.data() + 4 * e, 4);
                } else {
                    uint16_t h;
                    std::memcpy(&h, in.data() + 2 * e, 2);
                    w[j] = s.qtype == QType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
                }
            }
            REQUIRE(quantize_row_ref(o.qtype, w.data(), k, want.data()) == QuantStatus::ok);
            REQUIRE(std::equal(want.begin(), want.end(),
                               got.begin() + static_cast<ptrdiff_t>(r * out_row)));
        }
    }
}

// Tensor bytes of two files, in order.
void require_same_tensors(const QfFile& a, const QfFile& b) {
    REQUIRE(a.tensors().size() == b.tensors().size());
    std::vector<uint8_t> s1, s2;
    for (size_t i = 0; i < a.tensors().size(); ++i) {
        INFO(a.tensors()[i].name);
        REQUIRE(a.tensors()[i].name == b.tensors()[i].name);
        REQUIRE(a.tensors()[i].qtype == b.tensors()[i].qtype);
        const auto x = a.tensor_bytes(a.tensors()[i], s1);
        const auto y = b.tensor_bytes(b.tensors()[i], s2);
        REQUIRE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
    }
}

// A one-layer llama (hidden 32, intermediate 64, vocab 16) whose layers.0.mlp.up holds a NaN at
// row 3, column 5, as a Hugging Face directory `ckpt` and as a .qf `qf`.
void write_nan_model(const fs::path& ckpt, const fs::path& qf) {
    const std::string config = R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 16, "max_position_embeddings": 16,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": true})";
    fs::create_directories(ckpt);
    test::write_file(ckpt / "config.json", config);
    const ModelConfig cfg = read_model_config((ckpt / "config.json").string());
    std::vector<std::vector<float>> data;
    std::vector<TensorView> views;
    const auto specs = expected_tensors(cfg);
    for (const auto& s : specs) {
        data.emplace_back(*checked_product(s.shape), 0.25f);
        if (s.name == "layers.0.mlp.up") data.back()[3 * 32 + 5] = std::nanf("");
    }
    QfWriter w(qf.string());
    w.set_model(model_config_to_json(cfg));
    for (size_t i = 0; i < specs.size(); ++i) {
        const std::span<const uint8_t> bytes{reinterpret_cast<const uint8_t*>(data[i].data()),
                                             data[i].size() * 4};
        views.push_back({specs[i].hf_name, DType::f32, specs[i].shape, bytes});
        w.add_tensor(specs[i].name, QType::f32, specs[i].shape, bytes);
    }
    w.finish();
    write_safetensors((ckpt / "model.safetensors").string(), views);
}

}  // namespace

TEST_CASE("quantize stories260K to every type: each row is the reference quantizer's",
          "[quant][cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("quant-stories");
    const fs::path in = test::convert_stories(data, "hf", dir);
    const QfFile src(in.string());
    for (const auto& tr : kQTypes) {
        INFO("--qtype " << tr.name);
        {
            const fs::path out = dir / (std::string(tr.name) + ".qf");
            require_ok(quantize(q(in) + " -o " + q(out) + " --qtype " + std::string(tr.name)));
            const QfFile qf(out.string(), {.verify_checksums = true});
            for (const auto& t : qf.tensors()) {
                INFO(t.name);
                REQUIRE(t.qtype == expected_default(tr.type, t, /*tied=*/true));
            }
            require_rows_equal_reference(src, qf);
            REQUIRE(qf.model() == src.model());
            REQUIRE(qf.header().at("tokenizer") == src.header().at("tokenizer"));

            // The recipe, the sources and the input's own provenance are in the header.
            const json& prov = qf.header()["provenance"];
            REQUIRE(prov["recipe"] == json{{"command", "quantize"}, {"source_format", "qf"}});
            REQUIRE(prov["sources"].size() == 1);
            REQUIRE(prov["sources"][0]["file"] == "hf.qf");
            REQUIRE(prov["sources"][0]["bytes"] == fs::file_size(in));
            REQUIRE(prov["input_provenance"] == src.header()["provenance"]);
            REQUIRE(prov["generator"]["version"] == QFORGE_VERSION);
            const json& quant = prov["quantization"];
            REQUIRE(quant["method"] == "rtn");
            REQUIRE(quant["qtype"] == tr.name);
            REQUIRE(quant["overrides"] == json::array());
            REQUIRE(quant["version"] == QFORGE_VERSION);
            std::map<std::string, uint64_t> counts;
            for (const auto& t : qf.tensors()) counts[std::string(qtype_traits(t.qtype).name)] += 1;
            REQUIRE(quant["qtypes"] == json(counts));
            uint64_t classified = 0;
            for (const auto& c : quant["classes"]) classified += c["tensors"].get<uint64_t>();
            REQUIRE(classified == qf.tensors().size());
        }
    }
}

TEST_CASE("quantize is byte-identical whatever --threads is", "[quant][cli]") {
    test::ScratchDir dir("quant-threads");
    for (const char* model : {"qwen2_bias_tied", "llama_gqa_untied"}) {
        INFO(model);
        const std::string args =
            q(kHfModels / model) + " --qtype q4_g32 --tensor-type 'mlp\\.down=q8' ";
        require_ok(quantize(args + "-o " + q(dir / "t1.qf") + " --threads 1"));
        require_ok(quantize(args + "-o " + q(dir / "t3.qf") + " --threads 3"));
        REQUIRE(test::read_file(dir / "t1.qf") == test::read_file(dir / "t3.qf"));
    }
}

TEST_CASE("quantize stories260K is byte-identical whatever --threads is", "[quant][cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("quant-stories-threads");
    const fs::path in = test::convert_stories(data, "hf-fp16", dir);
    const std::string args = q(in) + " --qtype q4s_g64 --tensor-type '^layers\\.0\\.=q8_g128' ";
    require_ok(quantize(args + "-o " + q(dir / "t1.qf") + " -t 1"));
    require_ok(quantize(args + "-o " + q(dir / "t3.qf") + " -t 3"));
    REQUIRE(test::read_file(dir / "t1.qf") == test::read_file(dir / "t3.qf"));
    const QfFile src(in.string()), qf((dir / "t1.qf").string());
    require_rows_equal_reference(src, qf);  // f16 source rows
    REQUIRE(qf.at("layers.0.mlp.down").qtype == QType::q8_g128);
    REQUIRE(qf.at("layers.1.mlp.down").qtype == QType::q4s_g64);
}

TEST_CASE("a Hugging Face directory quantizes exactly like its converted .qf", "[quant][cli]") {
    test::ScratchDir dir("quant-hf");
    for (const char* model : {"qwen2_bias_tied", "llama_gqa_untied", "mistral"}) {
        INFO(model);
        const fs::path hf = kHfModels / model;
        REQUIRE(test::run_qforge("convert " + q(hf) + " -o " + q(dir / "f32.qf")).exit_code == 0);
        const std::string opts = " --qtype q4_g128 --tensor-type 'attn\\.v$=q8_g32'";
        require_ok(quantize(q(hf) + " -o " + q(dir / "from_hf.qf") + opts));
        require_ok(quantize(q(dir / "f32.qf") + " -o " + q(dir / "from_qf.qf") + opts));
        const QfFile f32((dir / "f32.qf").string());
        const QfFile from_hf((dir / "from_hf.qf").string(), {.verify_checksums = true});
        const QfFile from_qf((dir / "from_qf.qf").string());
        require_same_tensors(from_hf, from_qf);
        require_rows_equal_reference(f32, from_hf);
        REQUIRE(from_hf.model() == f32.model());
        const json& prov = from_hf.header()["provenance"];
        REQUIRE(prov["recipe"]["source_format"] == "safetensors");
        REQUIRE(prov["sources"][0]["file"] == "config.json");
        REQUIRE(prov["sources"][1]["file"] == "model.safetensors");
        REQUIRE_FALSE(prov.contains("input_provenance"));
        REQUIRE(prov["quantization"]["overrides"] == json::array({"attn\\.v$=q8_g32"}));
        REQUIRE(from_hf.at("layers.1.attn.v").qtype == QType::q8_g32);
        REQUIRE(from_hf.at("layers.1.attn.k").qtype == QType::q4_g128);
        const bool tied = read_model_config((hf / "config.json").string()).tie_word_embeddings;
        REQUIRE(from_hf.at("embed").qtype == (tied ? QType::q8_g32 : QType::q4_g128));
        if (!tied) REQUIRE(from_hf.at("lm_head").qtype == QType::q8_g32);
        if (std::string(model) == "qwen2_bias_tied")
            REQUIRE(from_hf.at("layers.0.attn.q_bias").qtype == QType::f32);
    }
}

TEST_CASE("quantize --json reports every tensor and the totals", "[quant][cli]") {
    test::ScratchDir dir("quant-json");
    // stdout and stderr arrive together: the per-class decisions (stderr, one line each, written
    // first) and then the JSON object (stdout).
    auto r = test::run_qforge("quantize " + q(kHfModels / "llama_gqa_untied") + " -o " +
                              q(dir / "o.qf") + " --qtype q4s_g32 --json");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const size_t brace = r.output.find("\n{");
    REQUIRE(brace != std::string::npos);
    const std::string decisions = r.output.substr(0, brace);
    REQUIRE_THAT(decisions,
                 Contains("lm_head") && Contains("q8_g32") && Contains("at least 8 bits"));
    REQUIRE_THAT(decisions, Contains("vector") && Contains("f32"));
    const json j = json::parse(r.output.substr(brace + 1));
    REQUIRE(j["method"] == "rtn");
    REQUIRE(j["qtype"] == "q4s_g32");
    REQUIRE(j["seconds"].get<double>() >= 0.0);
    const QfFile qf((dir / "o.qf").string());
    REQUIRE(j["tensors"].size() == qf.tensors().size());
    uint64_t bytes = 0, params = 0;
    for (size_t i = 0; i < qf.tensors().size(); ++i) {
        const QfTensorInfo& t = qf.tensors()[i];
        const json& e = j["tensors"][i];
        INFO(t.name);
        REQUIRE(e["name"] == t.name);
        REQUIRE(e["qtype"] == qtype_traits(t.qtype).name);
        REQUIRE(e["source_qtype"] == "f32");
        REQUIRE(e["bytes"] == t.length);
        if (t.shape.size() == 2)
            REQUIRE(e["bits_per_weight"].get<double>() ==
                    Approx(qtype_bits_per_weight(t.qtype, t.shape[1])));
        bytes += t.length;
        params += *checked_product(t.shape);
    }
    REQUIRE(j["totals"]["bytes"] == bytes);
    REQUIRE(j["totals"]["parameters"] == params);
    REQUIRE(j["totals"]["file_bytes"] == fs::file_size(dir / "o.qf"));
    REQUIRE(j["totals"]["bits_per_weight"].get<double>() ==
            Approx(8.0 * double(bytes) / double(params)));
    REQUIRE(j["classes"].size() == 4);  // embed, vector, linear, lm_head
}

TEST_CASE("inspect shows bits per weight and the recorded recipe", "[quant][cli]") {
    test::ScratchDir dir("quant-inspect");
    const fs::path out = dir / "o.qf";
    require_ok(quantize(q(kHfModels / "qwen2_bias_tied") + " -o " + q(out) +
                        " --qtype q4_g64 --tensor-type 'mlp=q8'"));
    auto r = test::run_qforge("inspect " + q(out));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE_THAT(r.output, Contains("quantization: rtn, default q4_g64, --tensor-type mlp=q8"));
    REQUIRE_THAT(r.output, Contains("bpw"));
    r = test::run_qforge("inspect --json " + q(out));
    REQUIRE(r.exit_code == 0);
    const json j = json::parse(r.output);
    const QfFile qf(out.string());
    REQUIRE(j["quantization"] == qf.header()["provenance"]["quantization"]);
    REQUIRE(j["provenance"] == qf.header()["provenance"]);  // the existing key, unchanged
    for (size_t i = 0; i < qf.tensors().size(); ++i) {
        const QfTensorInfo& t = qf.tensors()[i];
        INFO(t.name);
        const double bpw = j["tensors"][i]["bits_per_weight"];
        if (t.shape.size() == 2)
            REQUIRE(bpw == Approx(qtype_bits_per_weight(t.qtype, t.shape[1])));
        else
            REQUIRE(bpw == 32.0);
    }
    REQUIRE(j["qtypes"].is_array());
    REQUIRE(j.contains("totals"));
    // A float .qf has no recipe.
    REQUIRE(
        test::run_qforge("convert " + q(kHfModels / "qwen2_bias_tied") + " -o " + q(dir / "f.qf"))
            .exit_code == 0);
    REQUIRE(
        json::parse(test::run_qforge("inspect --json " + q(dir / "f.qf")).output)["quantization"]
            .is_null());
}

TEST_CASE("NaN weights are refused with the tensor, row and column, nothing is written",
          "[quant][cli]") {
    test::ScratchDir dir("quant-nan");
    const fs::path out_dir = dir / "out";
    fs::create_directories(out_dir);
    write_nan_model(dir / "ckpt", dir / "nan.qf");
    for (const fs::path& in : {dir / "ckpt", dir / "nan.qf"}) {
        INFO(in);
        for (const char* threads : {"1", "3"}) {
            require_clean_failure(
                quantize(q(in) + " -o " + q(out_dir / "o.qf") + " --qtype q4_g32 -t " + threads),
                out_dir, "tensor 'layers.0.mlp.up': row 3, column 5 is nan");
        }
    }
    // The file named is the one holding the tensor.
    require_clean_failure(quantize(q(dir / "ckpt") + " -o " + q(out_dir / "o.qf") + " --qtype q8"),
                          out_dir, "model.safetensors: tensor 'layers.0.mlp.up'");
}

TEST_CASE("quantize refuses bad options with one line and writes nothing", "[quant][cli]") {
    test::ScratchDir dir("quant-options");
    const fs::path hf = kHfModels / "llama_gqa_untied";
    const std::string base = q(hf) + " -o " + q(dir / "o.qf") + " ";
    require_clean_failure(
        quantize(base + "--qtype q5_k"), dir.path(),
        "unknown qtype 'q5_k' (valid: f32, f16, bf16, q8, q8_g32, q8_g128, q4_g32");
    require_clean_failure(quantize(base + "--qtype q4_g32 --tensor-type 'attn.(q=q8'"), dir.path(),
                          "bad regex 'attn.(q'");
    require_clean_failure(quantize(base + "--qtype q4_g32 --tensor-type attn"), dir.path(),
                          "expected REGEX=TYPE");
    require_clean_failure(quantize(base + "--qtype q4_g32 --tensor-type attn=q2"), dir.path(),
                          "unknown qtype 'q2'");
    require_clean_failure(quantize(base + "--qtype q4_g32 --method gptq"), dir.path(),
                          "--method gptq needs calibration text: --calib FILE");
    require_clean_failure(quantize(base + "--qtype q4_g32 --method awq"), dir.path(),
                          "--method awq needs calibration text: --calib FILE");
}

TEST_CASE("an already quantized input is refused unless each tensor keeps its type",
          "[quant][cli]") {
    test::ScratchDir dir("quant-requant");
    const fs::path out_dir = dir / "out";
    fs::create_directories(out_dir);
    const fs::path q4 = dir / "q4.qf";
    require_ok(quantize(q(kHfModels / "llama_gqa_untied") + " -o " + q(q4) + " --qtype q4_g128"));
    require_clean_failure(
        quantize(q(q4) + " -o " + q(out_dir / "o.qf") + " --qtype q4_g32"), out_dir,
        "tensor 'embed': already quantized as q4_g128; re-quantizing to q4_g32 is not supported");
    require_clean_failure(quantize(q(q4) + " -o " + q(out_dir / "o.qf") +
                                   " --qtype q4_g128 --tensor-type lm_head=q8"),
                          out_dir, "tensor 'lm_head': already quantized as q8_g32");
    // The same recipe again: every quantized tensor is copied as stored.
    require_ok(quantize(q(q4) + " -o " + q(out_dir / "again.qf") + " --qtype q4_g128"));
    const QfFile a(q4.string()), b((out_dir / "again.qf").string());
    require_same_tensors(a, b);
    REQUIRE(b.header()["provenance"]["input_provenance"] == a.header()["provenance"]);
}

}  // namespace quant_cli_test
