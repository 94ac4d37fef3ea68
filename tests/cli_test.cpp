// The qforge binary end to end on the real stories260K checkpoint, and on broken inputs: one
// line of error, a non-zero exit, and no output file.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "core/half.hpp"
#include "formats/architectures.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "formats/safetensors.hpp"
#include "test_support.hpp"

namespace cli_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using qforge::test::q;

size_t count_lines(const std::string& s) {
    size_t n = 0;
    for (char c : s) n += c == '\n';
    return n;
}

void require_clean_failure(const test::CommandResult& r, const fs::path& dir,
                           const std::string& what) {
    INFO(r.output);
    REQUIRE(r.exit_code != 0);
    REQUIRE(count_lines(r.output) == 1);
    REQUIRE(r.output.rfind("qforge: error: ", 0) == 0);
    REQUIRE_THAT(r.output, Contains(what));
    REQUIRE(test::files_containing(dir, ".qf").empty());
}

}  // namespace

TEST_CASE("convert, verify and inspect stories260K (f32 and f16 checkpoints)", "[cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("cli-stories");
    const fs::path st = data / "stories260K";
    for (const char* variant : {"hf", "hf-fp16"}) {
        const fs::path out = dir / (std::string(variant) + ".qf");
        auto r = test::run_qforge("convert " + q(st / variant) + " -o " + q(out));
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
        REQUIRE_THAT(r.output, Contains("tok512.bin"));  // found one folder up
        r = test::run_qforge("verify " + q(out));
        REQUIRE(r.exit_code == 0);
        REQUIRE_THAT(r.output, Contains("OK"));
        r = test::run_qforge("inspect " + q(out));
        REQUIRE(r.exit_code == 0);
        REQUIRE_THAT(r.output, Contains("llama, 5 layers, hidden 64, heads 8 (kv 4, head_dim 8)"));
        REQUIRE_THAT(r.output, Contains("llama2.c vocabulary, 512 tokens"));
        r = test::run_qforge("inspect --json " + q(out));
        REQUIRE(r.exit_code == 0);
        auto j = nlohmann::json::parse(r.output);
        REQUIRE(j["totals"]["parameters"] == 260032);  // stated in the model's README
        REQUIRE(j["totals"]["bits_per_weight"] == (std::string(variant) == "hf" ? 32.0 : 16.0));
    }
}

TEST_CASE("safetensors -> .qf keeps every tensor byte-identical", "[cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("cli-roundtrip");
    const fs::path hf = data / "stories260K" / "hf";
    const fs::path out = dir / "s.qf";
    auto r = test::run_qforge("convert " + q(hf) + " -o " + q(out));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    SafetensorsCheckpoint ckpt(hf.string());
    QfFile qf(out.string(), {.verify_checksums = true});
    const auto specs = expected_tensors(read_model_config((hf / "config.json").string()));
    REQUIRE(qf.tensors().size() == specs.size());
    std::vector<uint8_t> scratch;
    for (const auto& s : specs) {
        INFO(s.hf_name);
        const TensorView src = ckpt.tensor(s.hf_name);
        const auto got = qf.tensor_bytes(qf.at(s.name), scratch);
        REQUIRE(qf.at(s.name).shape == src.shape);
        REQUIRE(std::equal(got.begin(), got.end(), src.data.begin(), src.data.end()));
    }
}

TEST_CASE("convert --dtype f16 of the f32 checkpoint equals the independently made f16 checkpoint",
          "[cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("cli-f16");
    const fs::path st = data / "stories260K";
    const fs::path out = dir / "s16.qf";
    auto r =
        test::run_qforge("convert " + q(st / "hf") + " -o " + q(out) + " --dtype f16 --compress");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    SafetensorsCheckpoint ref((st / "hf-fp16").string());
    SafetensorsCheckpoint f32((st / "hf").string());
    QfFile qf(out.string(), {.verify_checksums = true});
    std::vector<uint8_t> scratch;
    for (const auto& t : qf.tensors()) {
        INFO(t.name);
        const auto specs =
            expected_tensors(read_model_config((st / "hf" / "config.json").string()));
        const auto it =
            std::find_if(specs.begin(), specs.end(), [&](auto& s) { return s.name == t.name; });
        REQUIRE(it != specs.end());
        const TensorView want = ref.tensor(it->hf_name);
        const auto got = qf.tensor_bytes(t, scratch);
        if (t.shape.size() >= 2) {  // matrices: f16, rounded exactly as the reference did
            REQUIRE(t.qtype == QType::f16);
            REQUIRE(std::equal(got.begin(), got.end(), want.data.begin(), want.data.end()));
        } else {  // norms and biases stay f32: the source's values, untouched
            REQUIRE(t.qtype == QType::f32);
            const TensorView src = f32.tensor(it->hf_name);
            REQUIRE(std::equal(got.begin(), got.end(), src.data.begin(), src.data.end()));
        }
    }
}

TEST_CASE("convert is deterministic", "[cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("cli-determinism");
    const fs::path hf = data / "stories260K" / "hf";
    REQUIRE(test::run_qforge("convert " + q(hf) + " -o " + q(dir / "a.qf")).exit_code == 0);
    REQUIRE(test::run_qforge("convert " + q(hf) + " -o " + q(dir / "b.qf")).exit_code == 0);
    REQUIRE(test::read_file(dir / "a.qf") == test::read_file(dir / "b.qf"));
}

TEST_CASE("convert into a full disk fails cleanly and leaves no file", "[cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("cli-diskfull");
    // ulimit -f counts 1024-byte blocks: 256 KiB is far less than the 1 MB model.
    auto r = test::run_qforge(
        "convert " + q(data / "stories260K" / "hf") + " -o " + q(dir / "s.qf"), "ulimit -f 256;");
    require_clean_failure(r, dir.path(), "write failed");
}

TEST_CASE("broken inputs: one-line error, non-zero exit, no output file", "[cli][broken]") {
    test::ScratchDir dir("cli-broken");
    const fs::path ckpt = dir / "ckpt";
    fs::create_directories(ckpt);
    const std::string config = R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 4, "max_position_embeddings": 16,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": true})";
    test::write_file(ckpt / "config.json", config);
    const fs::path out = dir / "out.qf";
    auto convert = [&] { return test::run_qforge("convert " + q(ckpt) + " -o " + q(out)); };

    SECTION("truncated safetensors") {
        test::write_file(ckpt / "model.safetensors", std::vector<uint8_t>{1, 2, 3});
        require_clean_failure(convert(), dir.path(), "model.safetensors");
    }
    SECTION("header length past the end of the file") {
        std::vector<uint8_t> b(16, 0);
        b[0] = 0xff;
        b[1] = 0xff;
        test::write_file(ckpt / "model.safetensors", b);
        require_clean_failure(convert(), dir.path(), "model.safetensors");
    }
    SECTION("unsupported architecture") {
        test::write_file(ckpt / "config.json", std::string(R"({"model_type": "gpt_neox"})"));
        test::write_file(ckpt / "model.safetensors", std::vector<uint8_t>{});
        require_clean_failure(convert(), dir.path(), "gpt_neox");
    }
    SECTION("missing tensors") {
        const std::string hdr =
            R"({"model.norm.weight":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})";
        std::vector<uint8_t> b(8 + hdr.size() + 32, 0);
        const uint64_t n = hdr.size();
        std::memcpy(b.data(), &n, 8);
        std::memcpy(b.data() + 8, hdr.data(), hdr.size());
        test::write_file(ckpt / "model.safetensors", b);
        require_clean_failure(convert(), dir.path(), "missing from the checkpoint");
    }
    SECTION("NaN weights") {
        // A complete one-layer model whose final norm holds a NaN.
        std::vector<std::pair<std::string, std::vector<uint64_t>>> t = {
            {"model.embed_tokens.weight", {4, 8}},
            {"model.layers.0.input_layernorm.weight", {8}},
            {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
            {"model.layers.0.self_attn.k_proj.weight", {4, 8}},
            {"model.layers.0.self_attn.v_proj.weight", {4, 8}},
            {"model.layers.0.self_attn.o_proj.weight", {8, 8}},
            {"model.layers.0.post_attention_layernorm.weight", {8}},
            {"model.layers.0.mlp.gate_proj.weight", {16, 8}},
            {"model.layers.0.mlp.up_proj.weight", {16, 8}},
            {"model.layers.0.mlp.down_proj.weight", {8, 16}},
            {"model.norm.weight", {8}}};
        std::vector<std::vector<float>> data;
        std::vector<TensorView> views;
        for (auto& [name, shape] : t) {
            size_t n = 1;
            for (auto d : shape) n *= d;
            data.emplace_back(n, 0.5f);
        }
        data.back()[3] = std::nanf("");
        for (size_t i = 0; i < t.size(); ++i)
            views.push_back(
                {t[i].first,
                 DType::f32,
                 t[i].second,
                 {reinterpret_cast<const uint8_t*>(data[i].data()), data[i].size() * 4}});
        write_safetensors((ckpt / "model.safetensors").string(), views);
        require_clean_failure(convert(), dir.path(),
                              "tensor 'model.norm.weight': element 3 is nan");
    }
    SECTION("a broken .qf given to verify and inspect") {
        test::write_file(
            dir / "bad.qf",
            std::string(
                "QFORGE\r\n but not really a qf file........................................"));
        auto r = test::run_qforge("verify " + q(dir / "bad.qf"));
        INFO(r.output);
        REQUIRE(r.exit_code != 0);
        REQUIRE(count_lines(r.output) == 1);
        r = test::run_qforge("inspect " + q(dir / "bad.qf"));
        REQUIRE(r.exit_code != 0);
        REQUIRE(count_lines(r.output) == 1);
    }
}

}  // namespace cli_test
