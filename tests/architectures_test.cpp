// The architecture table: the tensors each config expects, checked against a real checkpoint
// (stories260K's safetensors header) and against the shapes of real model configs.
#include "formats/architectures.hpp"

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "test_support.hpp"

namespace architectures_test {

using namespace qforge;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kConfigs = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "configs";

ModelConfig fixture(const std::string& name) {
    return read_model_config((kConfigs / name).string());
}

const TensorSpec* find(const std::vector<TensorSpec>& specs, const std::string& name) {
    for (const auto& s : specs)
        if (s.name == name) return &s;
    return nullptr;
}

// Name -> shape from a safetensors header (u64 little-endian length, then JSON), read here
// directly so this test does not depend on the safetensors reader.
std::map<std::string, std::vector<uint64_t>> safetensors_shapes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    uint8_t len_bytes[8] = {};
    f.read(reinterpret_cast<char*>(len_bytes), 8);
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
    REQUIRE(len < (uint64_t{1} << 24));
    std::string header(len, '\0');
    f.read(header.data(), static_cast<std::streamsize>(len));
    std::map<std::string, std::vector<uint64_t>> shapes;
    const json parsed = json::parse(header);
    for (const auto& [name, info] : parsed.items())
        if (name != "__metadata__") shapes[name] = info.at("shape").get<std::vector<uint64_t>>();
    return shapes;
}

}  // namespace

TEST_CASE("arch: stories260K's table matches its checkpoint", "[arch]") {
    QF_REQUIRE_SHARED_DATA(d);
    const fs::path hf = d / "stories260K" / "hf";
    const ModelConfig c = read_model_config((hf / "config.json").string());
    const auto specs = expected_tensors(c);
    // embed, 5 layers x (2 norms + q k v o + gate up down), final_norm; tied: no lm_head.
    CHECK(specs.size() == 1 + 5 * 9 + 1);
    CHECK_FALSE(find(specs, "lm_head"));

    std::map<std::string, std::vector<uint64_t>> expected;
    for (const auto& s : specs) expected[s.hf_name] = s.shape;
    auto actual = safetensors_shapes(hf / "model.safetensors");
    std::erase_if(actual, [](const auto& kv) { return is_ignorable_hf_tensor(kv.first); });
    CHECK(actual == expected);
}

TEST_CASE("arch: shapes and order for a GQA llama", "[arch]") {
    const ModelConfig c = fixture("tinyllama_1.1b.hub.json");  // 22 layers, 32 heads, 4 KV, untied
    const auto specs = expected_tensors(c);
    REQUIRE(specs.size() == 1 + 22 * 9 + 1 + 1);
    CHECK(specs.front().name == "embed");
    CHECK(specs.front().hf_name == "model.embed_tokens.weight");
    CHECK(specs[1].name == "layers.0.attn_norm");
    CHECK(specs[9].name == "layers.0.mlp.down");
    CHECK(specs[10].name == "layers.1.attn_norm");
    CHECK(specs[specs.size() - 2].name == "final_norm");
    CHECK(specs.back().name == "lm_head");
    CHECK(specs.back().shape == std::vector<uint64_t>{32000, 2048});

    const auto* q = find(specs, "layers.21.attn.q");
    REQUIRE(q);
    CHECK(q->hf_name == "model.layers.21.self_attn.q_proj.weight");
    CHECK(q->shape == std::vector<uint64_t>{2048, 2048});
    CHECK(find(specs, "layers.21.attn.k")->shape == std::vector<uint64_t>{256, 2048});
    CHECK(find(specs, "layers.21.attn.v")->shape == std::vector<uint64_t>{256, 2048});
    CHECK(find(specs, "layers.21.attn.o")->shape == std::vector<uint64_t>{2048, 2048});
    CHECK(find(specs, "layers.0.mlp.gate")->shape == std::vector<uint64_t>{5632, 2048});
    CHECK(find(specs, "layers.0.mlp.up")->shape == std::vector<uint64_t>{5632, 2048});
    CHECK(find(specs, "layers.0.mlp.down")->shape == std::vector<uint64_t>{2048, 5632});
    CHECK(find(specs, "layers.0.mlp_norm")->hf_name ==
          "model.layers.0.post_attention_layernorm.weight");
    CHECK(find(specs, "final_norm")->hf_name == "model.norm.weight");
    CHECK_FALSE(find(specs, "layers.0.attn.q_bias"));
    CHECK_FALSE(find(specs, "layers.22.attn_norm"));

    // Matrices are the 2-D tensors; norms are not.
    for (const auto& s : specs) CHECK(s.is_matrix == (s.shape.size() == 2));
    CHECK(find(specs, "embed")->is_matrix);
    CHECK_FALSE(find(specs, "final_norm")->is_matrix);
}

TEST_CASE("arch: head_dim decoupled from hidden_size", "[arch]") {
    ModelConfig c = fixture("smollm2_135m.json");
    c.head_dim = 128;  // as in models whose heads * head_dim != hidden (e.g. Qwen3, Gemma)
    const auto specs = expected_tensors(c);
    CHECK(find(specs, "layers.0.attn.q")->shape == std::vector<uint64_t>{9 * 128, 576});
    CHECK(find(specs, "layers.0.attn.k")->shape == std::vector<uint64_t>{3 * 128, 576});
    CHECK(find(specs, "layers.0.attn.o")->shape == std::vector<uint64_t>{576, 9 * 128});
}

TEST_CASE("arch: qwen2 brings q/k/v biases", "[arch]") {
    const ModelConfig c = fixture("qwen2_0.5b.hub.json");  // 24 layers, 14 heads, 2 KV, tied
    const auto specs = expected_tensors(c);
    CHECK(specs.size() == 1 + 24 * 12 + 1);
    const auto* qb = find(specs, "layers.23.attn.q_bias");
    REQUIRE(qb);
    CHECK(qb->hf_name == "model.layers.23.self_attn.q_proj.bias");
    CHECK(qb->shape == std::vector<uint64_t>{896});
    CHECK_FALSE(qb->is_matrix);
    CHECK(find(specs, "layers.23.attn.k_bias")->shape == std::vector<uint64_t>{128});
    CHECK(find(specs, "layers.23.attn.v_bias")->hf_name == "model.layers.23.self_attn.v_proj.bias");
    CHECK_FALSE(find(specs, "lm_head"));

    // The same table serves llama with attention_bias.
    ModelConfig llama = fixture("tinyllama_1.1b.json");
    llama.attention_bias = true;
    CHECK(expected_tensors(llama).size() == 1 + 22 * 12 + 1 + 1);
}

TEST_CASE("arch: names are unique and every architecture has rows", "[arch]") {
    for (const char* file : {"llama3.2_1b_instruct.json", "mistral_7b_v0.1.json", "qwen2_0.5b.json",
                             "tinyllama_1.1b.json"}) {
        INFO(file);
        std::set<std::string> names, hf_names;
        for (const auto& s : expected_tensors(fixture(file))) {
            CHECK(names.insert(s.name).second);
            CHECK(hf_names.insert(s.hf_name).second);
            CHECK_FALSE(is_ignorable_hf_tensor(s.hf_name));
            for (uint64_t dim : s.shape) CHECK(dim > 0);
        }
    }
    for (auto arch : {Architecture::llama, Architecture::mistral, Architecture::qwen2}) {
        const auto rows = tensor_rows(arch);
        CHECK(rows.size() >= 13);
        for (const auto& row : rows) CHECK(row.shape[0] != Dim::none);
    }
}

TEST_CASE("arch: tensors a checkpoint may carry but the model ignores", "[arch]") {
    CHECK(is_ignorable_hf_tensor("model.layers.0.self_attn.rotary_emb.inv_freq"));
    CHECK(is_ignorable_hf_tensor("model.layers.31.self_attn.rotary_emb.inv_freq"));
    CHECK(is_ignorable_hf_tensor("model.rotary_emb.inv_freq"));
    CHECK_FALSE(is_ignorable_hf_tensor("model.layers.0.self_attn.q_proj.weight"));
    CHECK_FALSE(is_ignorable_hf_tensor("model.layers..self_attn.rotary_emb.inv_freq"));
    CHECK_FALSE(is_ignorable_hf_tensor("model.layers.x.self_attn.rotary_emb.inv_freq"));
    CHECK_FALSE(is_ignorable_hf_tensor("lm_head.weight"));
}

TEST_CASE("arch: layer patterns match only canonical indices", "[arch]") {
    const std::string_view p = "model.layers.{i}.mlp.up_proj.weight";
    uint64_t layer = 99;
    CHECK(match_tensor_pattern(p, "model.layers.0.mlp.up_proj.weight", &layer));
    CHECK(layer == 0);
    CHECK(match_tensor_pattern(p, "model.layers.117.mlp.up_proj.weight", &layer));
    CHECK(layer == 117);
    CHECK_FALSE(match_tensor_pattern(p, "model.layers.07.mlp.up_proj.weight"));
    CHECK_FALSE(match_tensor_pattern(p, "model.layers.-1.mlp.up_proj.weight"));
    CHECK_FALSE(match_tensor_pattern(p, "model.layers.+1.mlp.up_proj.weight"));
    CHECK_FALSE(match_tensor_pattern(p, "model.layers.1.2.mlp.up_proj.weight"));
    CHECK_FALSE(match_tensor_pattern(p, "model.layers.99999999999999999999.mlp.up_proj.weight"));
    CHECK_FALSE(match_tensor_pattern(p, "model.layers.1.mlp.up_proj.bias"));
    CHECK(match_tensor_pattern("model.norm.weight", "model.norm.weight"));
    CHECK_FALSE(match_tensor_pattern("model.norm.weight", "model.norm.weight2"));
}

}  // namespace architectures_test
