// Phi-3 through the commands, on the tiny random Phi3ForCausalLM of tests/data/hf_models
// (q/k/v fused in qkv_proj, gate/up in gate_up_proj, a sliding window of 6 on every layer, the
// 256-symbol byte-level tokenizer; scripts/make_hf_reference_fixtures.py). Its logits against
// transformers are checked in runtime_hf_reference_test.cpp; here: conversion splits the fused
// tensors into exactly their rows, calibrated quantization runs on the split model, and what
// qforge does not write or read for Phi-3 is refused by name.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "formats/qf.hpp"
#include "formats/safetensors.hpp"
#include "test_support.hpp"

namespace phi3_cli_test {

using namespace qforge;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using qforge::test::q;

test::CommandResult run(const std::string& args) {
    auto r = test::run_qforge(args);
    INFO("qforge " << args << "\n" << r.output);
    return r;
}

test::CommandResult ok(const std::string& args) {
    auto r = run(args);
    REQUIRE(r.exit_code == 0);
    return r;
}

// A copy of the fixture with config.json edited.
fs::path edited_copy(const fs::path& from, const fs::path& to,
                     const std::function<void(json&)>& edit) {
    fs::create_directories(to);
    for (const auto& e : fs::directory_iterator(from))
        fs::copy_file(e.path(), to / e.path().filename());
    const auto bytes = test::read_file(to / "config.json");
    json cfg = json::parse(bytes.begin(), bytes.end());
    edit(cfg);
    test::write_file(to / "config.json", cfg.dump(2));
    return to;
}

}  // namespace

TEST_CASE("phi3: the fused q/k/v and gate/up split by rows, then quantize, ppl, generate",
          "[quant][cli][phi3]") {
    test::ScratchDir dir("phi3-cli");
    const fs::path hf = test::fixture("hf_models") / "phi3_fused_window";
    const fs::path f32 = dir / "f32.qf";
    ok("convert " + q(hf) + " -o " + q(f32) + " -q");

    // Each part is its rows of the fused tensor, byte for byte (f32 stays f32).
    const SafetensorsCheckpoint st((hf / "model.safetensors").string());
    const QfFile qf(f32.string());
    REQUIRE(qf.config().arch == Architecture::phi3);
    REQUIRE(qf.config().attention_window(0) == 6);
    struct Part {
        const char* name;
        const char* fused;
        uint64_t row0, rows;
    };
    // q 4 heads x 8, k and v 2 x 8; gate and up 86 each.
    const Part parts[] = {{"attn.q", "self_attn.qkv_proj", 0, 32},
                          {"attn.k", "self_attn.qkv_proj", 32, 16},
                          {"attn.v", "self_attn.qkv_proj", 48, 16},
                          {"mlp.gate", "mlp.gate_up_proj", 0, 86},
                          {"mlp.up", "mlp.gate_up_proj", 86, 86}};
    for (int layer = 0; layer < 2; ++layer)
        for (const Part& p : parts) {
            const std::string name = "layers." + std::to_string(layer) + "." + p.name;
            INFO(name);
            const TensorView fused =
                st.tensor("model.layers." + std::to_string(layer) + "." + p.fused + ".weight");
            const uint64_t row_bytes = fused.shape[1] * 4;
            REQUIRE(qf.at(name).shape == std::vector<uint64_t>{p.rows, fused.shape[1]});
            std::vector<uint8_t> scratch;
            const auto got = qf.tensor_bytes(qf.at(name), scratch);
            REQUIRE(got.size() == p.rows * row_bytes);
            REQUIRE(std::memcmp(got.data(), fused.data.data() + p.row0 * row_bytes, got.size()) ==
                    0);
        }

    const fs::path calib = dir / "calib.txt";
    std::string text;
    for (int i = 0; i < 40; ++i)
        text += "A small test of a fused model, line " + std::to_string(i) + ". ";
    std::ofstream(calib, std::ios::binary) << text;
    // down's input (86) is no multiple of q4_g32's group: it stays float.
    const std::string calibrated = " --qtype q4_g32 --tensor-type 'mlp\\.down=f32' --calib " +
                                   q(calib) + " --nsamples 2 --seqlen 16 -q";
    for (const char* method : {"gptq", "awq+gptq"})
        ok("quantize " + q(f32) + " -o " + q(dir / (std::string(method) + ".qf")) + " --method " +
           method + calibrated);
    const auto ppl = ok("ppl " + q(dir / "gptq.qf") + " -f " + q(calib) +
                        " --ctx 16 --chunks 2 --json -q --kl-base " + q(f32));
    const json j = json::parse(ppl.output.substr(ppl.output.find('{')));
    REQUIRE(j.at("kld").get<double>() > 0.0);
    ok("generate " + q(dir / "awq+gptq.qf") + " -p 'A small' -n 8 --greedy -q");
}

TEST_CASE("phi3: what is not supported is refused by name", "[cli][phi3]") {
    test::ScratchDir dir("phi3-refusals");
    const fs::path hf = test::fixture("hf_models") / "phi3_fused_window";
    const fs::path f32 = dir / "f32.qf";
    ok("convert " + q(hf) + " -o " + q(f32) + " -q");

    // GPTQ/AWQ export would have to fuse the packed projections again.
    const auto ex = run("export " + q(f32) + " --format gptq -o " + q(dir / "out"));
    REQUIRE(ex.exit_code == 1);
    REQUIRE_THAT(ex.output, Catch::Contains("export of a phi3 model is not supported"));
    REQUIRE_FALSE(fs::exists(dir / "out"));

    // A fused tensor whose rows do not match the config names it and both shapes.
    const fs::path narrow =
        edited_copy(hf, dir / "narrow", [](json& c) { c["intermediate_size"] = 80; });
    const auto sh = run("convert " + q(narrow) + " -o " + q(dir / "n.qf"));
    REQUIRE(sh.exit_code == 1);
    REQUIRE_THAT(sh.output,
                 Catch::Contains("model.layers.0.mlp.gate_up_proj.weight") &&
                     Catch::Contains("shape [172, 32] but config.json implies [160, 32]"));

    // Phi-3's long-context RoPE.
    const fs::path longrope = edited_copy(hf, dir / "longrope", [](json& c) {
        c["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 10000.0}};
    });
    const auto lr = run("convert " + q(longrope) + " -o " + q(dir / "l.qf"));
    REQUIRE(lr.exit_code == 1);
    REQUIRE_THAT(lr.output, Catch::Contains("unsupported RoPE scaling type 'longrope'"));
    for (const char* out : {"n.qf", "l.qf"}) REQUIRE_FALSE(fs::exists(dir / out));
}

}  // namespace phi3_cli_test
