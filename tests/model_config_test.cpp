// config.json reader: compared with what Hugging Face transformers derives for real configs
// (tests/data/configs/expected.json, written by scripts/make_config_fixtures.py), the normalized
// form's round trip, and a catalogue of broken configs each with its own message.
#include "formats/model_config.hpp"

#include <catch2/catch.hpp>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "test_support.hpp"

namespace model_config_test {

using namespace qforge;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kConfigs = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "configs";

json load_json(const fs::path& p) {
    const auto bytes = test::read_file(p);
    return json::parse(bytes.begin(), bytes.end());
}

// expected.json spells the values out under ModelConfig's own field names.
ModelConfig from_expected(const json& e) {
    ModelConfig c;
    c.arch = *architecture_from_model_type(e.at("arch").get<std::string>());
    c.vocab_size = e.at("vocab_size");
    c.hidden_size = e.at("hidden_size");
    c.intermediate_size = e.at("intermediate_size");
    c.num_layers = e.at("num_layers");
    c.num_heads = e.at("num_heads");
    c.num_kv_heads = e.at("num_kv_heads");
    c.head_dim = e.at("head_dim");
    c.max_position_embeddings = e.at("max_position_embeddings");
    c.rms_norm_eps = e.at("rms_norm_eps");
    c.rope_theta = e.at("rope_theta");
    const json& s = e.at("rope_scaling");
    c.rope_scaling = {s.at("type"), s.at("factor"), s.at("low_freq_factor"),
                      s.at("high_freq_factor"), s.at("original_max_position_embeddings")};
    c.tie_word_embeddings = e.at("tie_word_embeddings");
    c.attention_bias = e.at("attention_bias");
    if (!e.at("bos_token_id").is_null()) c.bos_token_id = e.at("bos_token_id").get<int64_t>();
    c.eos_token_ids = e.at("eos_token_ids").get<std::vector<int64_t>>();
    if (!e.at("sliding_window").is_null())
        c.sliding_window = e.at("sliding_window").get<uint64_t>();
    c.max_window_layers = e.at("max_window_layers");
    c.torch_dtype = e.at("torch_dtype");
    return c;
}

// A small valid llama config (the stories260K shape) for the broken-config catalogue.
json base_config() {
    return json::parse(R"({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 172,
        "num_hidden_layers": 5, "num_attention_heads": 8, "num_key_value_heads": 4,
        "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "rope_scaling": null, "hidden_act": "silu",
        "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2})");
}

const json kLlama3Rope = {{"rope_type", "llama3"},
                          {"factor", 32.0},
                          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};

}  // namespace

TEST_CASE("config: real configs parse to what transformers derives", "[config]") {
    const json expected = load_json(kConfigs / "expected.json");
    REQUIRE(expected.at("cases").size() >= 10);
    for (const json& c : expected.at("cases")) {
        const std::string file = c.at("file");
        INFO(file);
        const ModelConfig got = read_model_config((kConfigs / file).string());
        const ModelConfig want = from_expected(c.at("expect"));
        INFO("got  " << model_config_to_json(got).dump());
        INFO("want " << model_config_to_json(want).dump());
        CHECK(got == want);
    }
}

TEST_CASE("config: the normalized form round-trips exactly", "[config]") {
    for (const auto& entry : fs::directory_iterator(kConfigs)) {
        if (entry.path().filename() == "expected.json") continue;
        INFO(entry.path().filename().string());
        const ModelConfig c = read_model_config(entry.path().string());
        const json j = model_config_to_json(c);
        CHECK(model_config_from_json(j, "header") == c);
        // Through text too: doubles are printed with enough digits to come back bit-exact.
        CHECK(model_config_from_json(json::parse(j.dump()), "header") == c);
        CHECK(model_config_to_json(model_config_from_json(j, "header")) == j);
    }
}

TEST_CASE("config: stories260K", "[config]") {
    QF_REQUIRE_SHARED_DATA(d);
    const ModelConfig c = read_model_config((d / "stories260K" / "hf" / "config.json").string());
    CHECK(c.arch == Architecture::llama);
    CHECK(c.num_layers == 5);
    CHECK(c.num_heads == 8);
    CHECK(c.num_kv_heads == 4);
    CHECK(c.head_dim == 8);
    CHECK(c.hidden_size == 64);
    CHECK(c.vocab_size == 512);
    CHECK(c.tie_word_embeddings);
    CHECK_FALSE(c.attention_bias);
    CHECK(c.rms_norm_eps == 1e-5);
    CHECK(c.rope_scaling.type == "none");
    CHECK(c.eos_token_ids == std::vector<int64_t>{2});
    CHECK(c.torch_dtype == "float32");
}

TEST_CASE("config: defaults that differ from the plain reading", "[config]") {
    SECTION("null num_key_value_heads means one KV head per query head, even for mistral") {
        json j = base_config();
        j["model_type"] = "mistral";
        j["num_key_value_heads"] = nullptr;
        CHECK(parse_model_config(j, "c").num_kv_heads == 8);
    }
    SECTION("qwen2 records a sliding window only with use_sliding_window") {
        json j = base_config();
        j["model_type"] = "qwen2";
        j["sliding_window"] = 256;
        CHECK_FALSE(parse_model_config(j, "c").sliding_window);
        j["use_sliding_window"] = true;
        CHECK(parse_model_config(j, "c").sliding_window == 256u);
        j.erase("sliding_window");
        CHECK(parse_model_config(j, "c").sliding_window == 4096u);
    }
    SECTION("phi3 has a sliding window only when it says so (Phi3Config's default is none)") {
        json j = base_config();
        j["model_type"] = "phi3";
        CHECK_FALSE(parse_model_config(j, "c").sliding_window);
        j["sliding_window"] = nullptr;
        CHECK_FALSE(parse_model_config(j, "c").sliding_window);
        j["sliding_window"] = 2047;
        CHECK(parse_model_config(j, "c").sliding_window == 2047u);
        CHECK(parse_model_config(j, "c").attention_window(4) == 2047u);
        j["attention_bias"] = true;  // Phi3Attention has no biases whatever the config says
        CHECK_FALSE(parse_model_config(j, "c").attention_bias);
    }
    SECTION("qwen2 has q/k/v biases whatever attention_bias says; mistral never") {
        json j = base_config();
        j["attention_bias"] = false;
        j["model_type"] = "qwen2";
        CHECK(parse_model_config(j, "c").attention_bias);
        j["attention_bias"] = true;
        j["model_type"] = "mistral";
        CHECK_FALSE(parse_model_config(j, "c").attention_bias);
        j["model_type"] = "llama";
        CHECK(parse_model_config(j, "c").attention_bias);
    }
    SECTION("rope_scaling wins over rope_parameters; rope_theta inside the object wins") {
        json j = base_config();
        j["rope_scaling"] = kLlama3Rope;
        j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5.0e5}};
        const ModelConfig c = parse_model_config(j, "c");
        CHECK(c.rope_scaling.type == "llama3");
        CHECK(c.rope_theta == 10000.0);
        j["rope_scaling"]["rope_theta"] = 123456.0;
        CHECK(parse_model_config(j, "c").rope_theta == 123456.0);
    }
}

TEST_CASE("config: broken configs name the key and what was expected", "[config]") {
    struct Case {
        const char* what;
        std::function<void(json&)> edit;
        const char* message;
    };
    const Case cases[] = {
        {"unsupported model_type", [](json& j) { j["model_type"] = "gpt_neox"; },
         "cfg/config.json: unsupported architecture 'gpt_neox' (model_type); supported: llama, "
         "mistral, qwen2, qwen3, gemma2, gemma3_text, phi3"},
        {"layer_types: full after sliding",
         [](json& j) {
             j["model_type"] = "qwen3";
             j["use_sliding_window"] = true;
             j["num_hidden_layers"] = 3;
             j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
         },
         "'layer_types': a full-attention layer 2 after the sliding layer 1 is not supported"},
        {"layer_types: unknown kind",
         [](json& j) {
             j["model_type"] = "qwen3";
             j["use_sliding_window"] = true;
             j["num_hidden_layers"] = 2;
             j["layer_types"] = {"full_attention", "chunked_attention"};
         },
         "'layer_types[1]' must be \"full_attention\" or \"sliding_attention\""},
        {"layer_types: wrong length",
         [](json& j) {
             j["model_type"] = "qwen3";
             j["use_sliding_window"] = true;
             j["layer_types"] = {"full_attention"};
         },
         "'layer_types' must be a list of num_hidden_layers (5) strings"},
        {"no model_type", [](json& j) { j.erase("model_type"); },
         "missing required key 'model_type'"},
        {"not an object",
         [](json& j) {
             j = json::array({1, 2});
         },
         "config.json must be a JSON object, found array"},
        {"missing dimension", [](json& j) { j.erase("intermediate_size"); },
         "missing required key 'intermediate_size'"},
        {"dimension as a string", [](json& j) { j["hidden_size"] = "64"; },
         "'hidden_size' must be an integer, found string \"64\""},
        {"dimension as a float", [](json& j) { j["num_hidden_layers"] = 5.0; },
         "'num_hidden_layers' must be an integer, found number 5.0"},
        {"zero dimension", [](json& j) { j["vocab_size"] = 0; },
         "'vocab_size' must be between 1 and 2147483647, found 0"},
        {"negative dimension", [](json& j) { j["num_attention_heads"] = -8; },
         "'num_attention_heads' must be between 1 and 2147483647, found -8"},
        {"huge dimension", [](json& j) { j["intermediate_size"] = uint64_t{1} << 31; },
         "'intermediate_size' must be between 1 and 2147483647, found 2147483648"},
        {"kv heads do not divide heads", [](json& j) { j["num_key_value_heads"] = 3; },
         "num_attention_heads (8) is not a multiple of num_key_value_heads (3)"},
        {"head_dim not derivable",
         [](json& j) {
             j["hidden_size"] = 60;
             j.erase("head_dim");
         },
         "hidden_size (60) is not a multiple of num_attention_heads (8) and head_dim is not given"},
        {"odd head_dim", [](json& j) { j["head_dim"] = 7; },
         "head_dim (7) must be even: RoPE rotates pairs"},
        {"yarn RoPE",
         [](json& j) {
             j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
         },
         "unsupported RoPE scaling type 'yarn' (rope_scaling.rope_type); supported: none, llama3"},
        {"partial rotary embeddings", [](json& j) { j["partial_rotary_factor"] = 0.75; },
         "'partial_rotary_factor' is number 0.75: partial rotary embeddings are not supported"},
        {"partial rotary embeddings in rope_parameters",
         [](json& j) {
             j["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
         },
         "'rope_parameters.partial_rotary_factor' is number 0.5"},
        {"Phi-3 longrope",
         [](json& j) {
             j["model_type"] = "phi3";
             j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}};
         },
         "unsupported RoPE scaling type 'longrope' (rope_scaling.type)"},
        {"linear RoPE, older key",
         [](json& j) {
             j["rope_scaling"] = {{"type", "linear"}};
         },
         "unsupported RoPE scaling type 'linear' (rope_scaling.type)"},
        {"RoPE type in rope_parameters",
         [](json& j) {
             j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
         },
         "unsupported RoPE scaling type 'dynamic' (rope_parameters.rope_type)"},
        {"llama3 without factor",
         [](json& j) {
             j["rope_scaling"] = kLlama3Rope;
             j["rope_scaling"].erase("factor");
         },
         "missing required key 'rope_scaling.factor'"},
        {"llama3 band inverted",
         [](json& j) {
             j["rope_scaling"] = kLlama3Rope;
             j["rope_scaling"]["high_freq_factor"] = 1.0;
         },
         "llama3 RoPE needs 0 < low_freq_factor < high_freq_factor"},
        {"rope_scaling not an object", [](json& j) { j["rope_scaling"] = "llama3"; },
         "'rope_scaling' must be an object or null, found string \"llama3\""},
        {"RoPE per layer type",
         [](json& j) {
             j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
         },
         "'rope_parameters.full_attention': RoPE parameters per layer type are not supported"},
        {"rope_theta as a string", [](json& j) { j["rope_theta"] = "1e4"; },
         "'rope_theta' must be a number, found string \"1e4\""},
        {"rope_theta zero", [](json& j) { j["rope_theta"] = 0; },
         "'rope_theta' must be a positive number"},
        {"rms_norm_eps zero", [](json& j) { j["rms_norm_eps"] = 0.0; },
         "'rms_norm_eps' must be in (0, 1)"},
        {"MLP biases", [](json& j) { j["mlp_bias"] = true; }, "mlp_bias = true is not supported"},
        {"other activation", [](json& j) { j["hidden_act"] = "gelu"; },
         "unsupported hidden_act 'gelu'; supported: silu"},
        {"tie flag as a string", [](json& j) { j["tie_word_embeddings"] = "yes"; },
         "'tie_word_embeddings' must be true or false, found string \"yes\""},
        {"eos as a string", [](json& j) { j["eos_token_id"] = "2"; },
         "'eos_token_id' must be an integer, found string \"2\""},
        {"negative eos in a list",
         [](json& j) {
             j["eos_token_id"] = {2, -1};
         },
         "'eos_token_id' must be between 0 and 2147483647, found -1"},
    };
    CHECK_NOTHROW(parse_model_config(base_config(), "cfg/config.json"));
    for (const Case& c : cases) {
        INFO(c.what);
        json j = base_config();
        j["head_dim"] = 8;
        c.edit(j);
        CHECK_THROWS_AS(parse_model_config(j, "cfg/config.json"), Error);
        CHECK_THROWS_WITH(parse_model_config(j, "cfg/config.json"),
                          Catch::Contains(c.message) && Catch::StartsWith("cfg/config.json: "));
    }
}

TEST_CASE("config: files that are not JSON are refused with the path", "[config]") {
    test::ScratchDir dir("model-config");
    test::write_file(dir / "config.json", std::string("{\"model_type\": \"llama\",,}"));
    CHECK_THROWS_WITH(read_model_config((dir / "config.json").string()),
                      Catch::StartsWith((dir / "config.json").string() + ": not valid JSON"));
}

TEST_CASE("config: the normalized form is read strictly", "[config]") {
    const json good = model_config_to_json(parse_model_config(base_config(), "c"));
    auto fails_with = [&](const std::function<void(json&)>& edit, const std::string& message) {
        json j = good;
        edit(j);
        CHECK_THROWS_WITH(model_config_from_json(j, "m.qf"), Catch::Contains(message));
    };
    fails_with([](json& j) { j.erase("head_dim"); }, "m.qf: missing required key 'head_dim'");
    fails_with([](json& j) { j.erase("sliding_window"); }, "missing required key 'sliding_window'");
    fails_with([](json& j) { j["eos_token_ids"] = 2; }, "'eos_token_ids' must be a list");
    fails_with([](json& j) { j["rope_scaling"]["type"] = "yarn"; },
               "unsupported RoPE scaling type 'yarn' (rope_scaling.type)");
    fails_with([](json& j) { j["rope_scaling"]["factor"] = 8.0; },
               "rope_scaling of type 'none' must carry neutral values");
    fails_with([](json& j) { j["model_type"] = "gemma"; }, "unsupported architecture 'gemma'");
    fails_with([](json& j) { j["max_window_layers"] = 1; },
               "'max_window_layers' without a sliding_window");
    // Written only where some layers attend fully; it round-trips.
    json window = base_config();
    window["model_type"] = "qwen3";
    window["use_sliding_window"] = true;
    window["sliding_window"] = 16;
    window["max_window_layers"] = 2;
    const ModelConfig c = parse_model_config(window, "c");
    CHECK(c.attention_window(1) == 0);
    CHECK(c.attention_window(2) == 16);
    CHECK(model_config_to_json(c).at("max_window_layers") == 2);
    CHECK(model_config_from_json(model_config_to_json(c), "m.qf") == c);
    CHECK_FALSE(good.contains("max_window_layers"));
}

TEST_CASE("config: every architecture has a model_type", "[config]") {
    for (auto arch :
         {Architecture::llama, Architecture::mistral, Architecture::qwen2, Architecture::qwen3,
          Architecture::gemma2, Architecture::gemma3, Architecture::phi3})
        CHECK(architecture_from_model_type(architecture_name(arch)) == arch);
    CHECK(architecture_name(Architecture::qwen2) == "qwen2");
    CHECK(architecture_name(Architecture::gemma3) == "gemma3_text");
    CHECK_FALSE(architecture_from_model_type("LlamaForCausalLM"));
    CHECK(supported_architectures() == "llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3");
}

}  // namespace model_config_test
