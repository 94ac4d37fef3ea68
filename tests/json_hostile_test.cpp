// Hostile JSON: nesting bombs in every file qforge reads (refused with the file and the byte,
// never a stack overflow), and values of the wrong type (an Error naming the file and the key
// path, never a library exception). Broken inputs are made here from the committed fixtures by
// changing one value.
#include <zstd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "core/error.hpp"
#include "formats/architectures.hpp"
#include "formats/gguf.hpp"
#include "formats/json_io.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "gguf_builder.hpp"
#include "qf_support.hpp"
#include "quant/resume_state.hpp"
#include "test_support.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/jinja_subset.hpp"
#include "tokenizer/source.hpp"
#include "tokenizer/source_gguf.hpp"
#include "tokenizer/tokenizer.hpp"

namespace json_hostile_test {

using namespace qforge;
using Catch::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data";
constexpr size_t kBomb = 100000;  // levels: far past any stack's worth of recursion

std::string nested_arrays(size_t depth) {
    return std::string(depth, '[') + "0" + std::string(depth, ']');
}
std::string nested_objects(size_t depth) {
    std::string s;
    for (size_t i = 0; i < depth; ++i) s += "{\"a\":";
    return s + "0" + std::string(depth, '}');
}

std::string repeat(const std::string& s, size_t n) {
    std::string out;
    out.reserve(s.size() * n);
    for (size_t i = 0; i < n; ++i) out += s;
    return out;
}

// The offset of the n-th (1-based) occurrence of `c` in `s`: where a depth limit must point.
size_t nth(const std::string& s, char c, size_t n) {
    for (size_t i = 0; i < s.size(); ++i)
        if (s[i] == c && --n == 0) return i;
    return std::string::npos;
}

// The value at a key path ("a.b[2].c") of `j`, created when absent. Keys must not hold '.' or '['.
json& at_path(json& j, const std::string& path) {
    json* cur = &j;
    size_t i = 0;
    while (i < path.size()) {
        if (path[i] == '.') {
            ++i;
        } else if (path[i] == '[') {
            const size_t close = path.find(']', i);
            cur = &(*cur)[std::stoul(path.substr(i + 1, close - i - 1))];
            i = close + 1;
        } else {
            const size_t end = std::min(path.find_first_of(".[", i), path.size());
            cur = &(*cur)[path.substr(i, end - i)];
            i = end;
        }
    }
    return *cur;
}

// `j` as text with the value at `path` replaced by raw JSON text (nlohmann cannot build or dump
// a 100,000-level value without recursing, which is the point of these tests).
std::string with_raw_value(json j, const std::string& path, const std::string& raw) {
    const std::string marker = "@@raw-value@@";
    at_path(j, path) = marker;
    std::string text = j.dump();
    const size_t at = text.find("\"" + marker + "\"");
    REQUIRE(at != std::string::npos);
    return text.replace(at, marker.size() + 2, raw);
}

json read_json(const fs::path& p) {
    const auto bytes = test::read_file(p);
    return json::parse(bytes.begin(), bytes.end());
}

// A copy of a tokenizer fixture directory (tokenizer.json, tokenizer_config.json) in `dir`.
fs::path copy_tokenizer(const std::string& family, const test::ScratchDir& dir) {
    const fs::path out = dir / family;
    fs::create_directories(out);
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"})
        fs::copy_file(kData / "tokenizers" / family / name, out / name,
                      fs::copy_options::overwrite_existing);
    return out;
}

// A valid .qf holding `tokenizer` (a schema, or null) and three small tensors.
// A valid tiny llama .qf (zero weights; every command that opens it validates the model against
// its config, so the base file must be a real model for each failure below to be the one
// changed value). The vocabulary is larger than any fixture tokenizer's, as real padded
// vocabularies are.
void write_qf(const fs::path& path, const json& tokenizer) {
    const ModelConfig c = test::tiny_llama_config(33000, 4);
    QfWriter w(path.string(), {.compress = false});
    w.set_model(model_config_to_json(c));
    w.set_tokenizer(tokenizer);
    w.set_provenance({{"recipe", {{"command", "test"}, {"rules", json::array({"a", "b"})}}}});
    test::add_zero_tensors(w, c);
    w.finish();
}

using test::replace_qf_header;

json qf_header(const fs::path& path) { return json::parse(test::qf_header_text(path)); }

// The message of the qforge::Error `f` throws; fails the test for any other outcome.
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    } catch (const std::exception& e) {
        FAIL("not a qforge::Error: " << e.what());
    }
    FAIL("no error");
    return {};
}

void check_nesting_error(const std::string& message, const fs::path& file) {
    INFO(message);
    CHECK_THAT(message, Contains(file.string() + ": "));
    CHECK_THAT(message, Contains("nested deeper than"));
    CHECK_THAT(message, !Contains("json.exception"));
}

}  // namespace

TEST_CASE("parse_json refuses nesting past the limit at the byte where it starts",
          "[hostile][json]") {
    const std::string file = "doc.json";
    for (const std::string& text : {nested_arrays(kBomb), nested_objects(kBomb)}) {
        const char open = text[0];
        const std::string message = error_of([&] { parse_json(text, file); });
        CHECK(message == file + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                             " levels at byte " +
                             std::to_string(nth(text, open, kMaxJsonDepth + 1)));
    }
    // Brackets inside strings are text, not nesting.
    const std::string in_string = "[\"" + std::string(1000, '[') + "\\\"" + "\"]";
    CHECK(parse_json(in_string, file)[0].get<std::string>().size() == 1001);

    // Exactly at the limit parses, and the value has that depth; one more level is refused.
    for (const auto& make : {nested_arrays, nested_objects}) {
        const json j = parse_json(make(kMaxJsonDepth), file);
        int depth = 0;
        for (const json* v = &j; v->is_structured(); v = v->is_array() ? &(*v)[0] : &(*v)["a"])
            ++depth;
        CHECK(depth == kMaxJsonDepth);
        CHECK_THROWS_WITH(parse_json(make(kMaxJsonDepth + 1), file), Contains("nested deeper"));
    }
}

TEST_CASE("parse_cbor refuses nesting past the limit", "[hostile][json]") {
    // CBOR 0x81: an array of one element; nlohmann's reader recurses once per level.
    std::vector<uint8_t> bomb(kBomb, 0x81);
    bomb.push_back(0x00);
    CHECK_THROWS_WITH(parse_cbor(bomb, "state.bin"),
                      Contains("state.bin: CBOR nested deeper than 256 levels"));
    std::vector<uint8_t> at_limit(kMaxJsonDepth, 0x81);
    at_limit.push_back(0x07);
    json j = parse_cbor(at_limit, "state.bin");
    for (int i = 0; i < kMaxJsonDepth; ++i) j = json(j[0]);
    CHECK(j == 7);
    const std::vector<uint8_t> round = json::to_cbor(json{{"a", {1, 2, {{"b", "c"}}}}});
    CHECK(parse_cbor(round, "x") == json{{"a", {1, 2, {{"b", "c"}}}}});
    CHECK_THROWS_WITH(parse_cbor(std::vector<uint8_t>{0x82, 0x01}, "x"),
                      Contains("x: CBOR is not valid"));
}

TEST_CASE("a nesting bomb in config.json is an Error naming the file", "[hostile][json]") {
    test::ScratchDir dir("json-nest-config");
    const json config = read_json(kData / "hf_models" / "llama_gqa_untied" / "config.json");
    const fs::path p = dir / "config.json";
    for (const char* key : {"vocab_size", "rope_scaling", "eos_token_id"})
        for (const std::string& raw : {nested_arrays(kBomb), nested_objects(kBomb)}) {
            test::write_file(p, with_raw_value(config, key, raw));
            check_nesting_error(error_of([&] { read_model_config(p.string()); }), p);
        }
    // The same file with a shallow value of the same kind reads (or fails on its type only).
    test::write_file(p, with_raw_value(config, "eos_token_id", "[2]"));
    CHECK(read_model_config(p.string()).eos_token_ids == std::vector<int64_t>{2});
}

TEST_CASE("nesting bombs in tokenizer.json and tokenizer_config.json name their file",
          "[hostile][json]") {
    test::ScratchDir dir("json-nest-tokenizer");
    auto sequence = [](const char* list_key, size_t depth, const std::string& leaf) {
        std::string s;
        for (size_t i = 0; i < depth; ++i)
            s += std::string("{\"type\":\"Sequence\",\"") + list_key + "\":[";
        s += leaf;
        for (size_t i = 0; i < depth; ++i) s += "]}";
        return s;
    };
    const fs::path llama2 = copy_tokenizer("llama2", dir);
    const fs::path qwen2 = copy_tokenizer("qwen2", dir);
    const json llama2_tok = read_json(llama2 / "tokenizer.json");
    const json qwen2_tok = read_json(qwen2 / "tokenizer.json");
    const json qwen2_config = read_json(qwen2 / "tokenizer_config.json");

    // Nested Sequence normalizers and pre-tokenizers, 100,000 deep (200,000 JSON levels).
    test::write_file(llama2 / "tokenizer.json",
                     with_raw_value(llama2_tok, "normalizer",
                                    sequence("normalizers", kBomb, "{\"type\":\"NFC\"}")));
    check_nesting_error(
        error_of([&] { load_tokenizer_source((llama2 / "tokenizer.json").string()); }),
        llama2 / "tokenizer.json");
    const std::string byte_level = qwen2_tok["pre_tokenizer"]["pretokenizers"][1].dump();
    test::write_file(
        qwen2 / "tokenizer.json",
        with_raw_value(qwen2_tok, "pre_tokenizer", sequence("pretokenizers", kBomb, byte_level)));
    check_nesting_error(
        error_of([&] { load_tokenizer_source((qwen2 / "tokenizer.json").string()); }),
        qwen2 / "tokenizer.json");

    // A Sequence nested as deep as the limit allows still loads: the flattening is bounded, not
    // refused, and gives the same tokenizer as the flat form.
    const size_t allowed = kMaxJsonDepth / 2 - 4;  // the root and the leaf Sequence take 5 levels
    test::write_file(
        llama2 / "tokenizer.json",
        with_raw_value(llama2_tok, "normalizer",
                       sequence("normalizers", allowed, llama2_tok["normalizer"].dump())));
    const json deep_schema = load_tokenizer_source((llama2 / "tokenizer.json").string());
    test::write_file(llama2 / "tokenizer.json", llama2_tok.dump());
    CHECK(deep_schema["normalizer"] ==
          load_tokenizer_source((llama2 / "tokenizer.json").string())["normalizer"]);

    // tokenizer_config.json: a nested field, and nesting bombs inside its chat template.
    test::write_file(qwen2 / "tokenizer.json", qwen2_tok.dump());
    test::write_file(qwen2 / "tokenizer_config.json",
                     with_raw_value(qwen2_config, "model_max_length", nested_objects(kBomb)));
    check_nesting_error(
        error_of([&] { load_tokenizer_source((qwen2 / "tokenizer.json").string()); }),
        qwen2 / "tokenizer_config.json");
    const std::vector<std::string> templates = {
        "{{ " + repeat("(", kBomb) + "1" + repeat(")", kBomb) + " }}",
        "{{ " + repeat("[", kBomb) + "1" + repeat("]", kBomb) + " }}",
        "{{ 1" + repeat("|string", kBomb) + " }}",
        "{{ 1" + repeat(" + 1", kBomb) + " }}",
        "{{ " + repeat("not ", kBomb) + "1 }}",
        "{{ " + repeat("-", kBomb) + "1 }}",
        "{{ " + repeat("1 if x else ", kBomb) + "1 }}",
        repeat("{% if true %}", kBomb) + "x" + repeat("{% endif %}", kBomb),
        repeat("{% for i in [1] %}", kBomb) + "x" + repeat("{% endfor %}", kBomb),
    };
    for (const std::string& chat : templates) {
        json config = qwen2_config;
        config["chat_template"] = chat;
        test::write_file(qwen2 / "tokenizer_config.json", config.dump());
        const std::string message =
            error_of([&] { load_tokenizer_source((qwen2 / "tokenizer.json").string()); });
        INFO(message);
        CHECK_THAT(message,
                   Contains((qwen2 / "tokenizer_config.json").string() +
                            ": key 'chat_template': chat template nested deeper than 256 levels"));
    }
}

TEST_CASE("chat templates and values nested to the limit render, one level more is refused",
          "[hostile][json]") {
    const auto depth = static_cast<size_t>(jinja::kMaxTemplateDepth);
    // Each parenthesis is one level of the parser; the tag itself takes a few more.
    const std::string parens =
        "{{ " + std::string(depth - 8, '(') + "1" + std::string(depth - 8, ')') + " }}";
    CHECK(jinja::render(parens, {}) == "1");
    CHECK_THROWS_WITH(
        jinja::render(
            "{{ " + std::string(depth + 1, '(') + "1" + std::string(depth + 1, ')') + " }}", {}),
        Contains("chat template nested deeper than 256 levels"));
    std::string blocks;
    for (size_t i = 0; i + 2 < depth; ++i) blocks += "{% if true %}";
    blocks += "x";
    for (size_t i = 0; i + 2 < depth; ++i) blocks += "{% endif %}";
    CHECK(jinja::render(blocks, {}) == "x");
    // Values grow one statement at a time, out of the parser's sight: bounded where made.
    std::string grow = "{% set x = 1 %}";
    for (size_t i = 0; i < 2 * depth; ++i) grow += "{% set x = [x] %}";
    grow += "{{ x|length }}";
    CHECK_THROWS_WITH(jinja::render(grow, {}),
                      Contains("chat template nested deeper than 256 levels"));
    // At render time the error names the tokenizer's file.
    test::ScratchDir dir("json-nest-render");
    const fs::path qwen2 = copy_tokenizer("qwen2", dir);
    json config = read_json(qwen2 / "tokenizer_config.json");
    config["chat_template"] = grow;
    test::write_file(qwen2 / "tokenizer_config.json", config.dump());
    const Tokenizer tok = Tokenizer::load((qwen2 / "tokenizer.json").string());
    CHECK_THROWS_WITH(
        render_chat_prompt(tok, "", "hi"),
        Contains((qwen2 / "tokenizer.json").string() + ": chat template nested deeper"));
}

TEST_CASE("a nesting bomb anywhere in a .qf header is an Error naming the file",
          "[hostile][json]") {
    test::ScratchDir dir("json-nest-qf");
    const fs::path p = dir / "m.qf";
    for (const char* path :
         {"format_version", "tensors[1].offset", "provenance.recipe", "model.arch", "tokenizer"})
        for (const std::string& raw : {nested_arrays(kBomb), nested_objects(kBomb)}) {
            write_qf(p, nullptr);
            const json header = qf_header(p);
            REQUIRE_NOTHROW(QfFile(p.string()));
            replace_qf_header(p, with_raw_value(header, path, raw));
            INFO(path);
            check_nesting_error(error_of([&] { QfFile f(p.string()); }), p);
        }
    // The command line: exit code 1 and one line naming the file.
    write_qf(p, nullptr);
    replace_qf_header(p, with_raw_value(qf_header(p), "provenance.recipe", nested_arrays(kBomb)));
    const auto r = test::run_qforge("inspect '" + p.string() + "'");
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Contains(p.string() + ": header nested deeper than 256 levels at byte"));
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
}

TEST_CASE("a nesting bomb in a --resume run record is an Error naming the file",
          "[hostile][json]") {
    test::ScratchDir dir("json-nest-resume");
    const json fingerprint = {{"recipe", {{"qtype", "q4_g128"}}}, {"source", "x"}};
    { ResumeDir first(dir.path().string(), fingerprint, 2); }
    const fs::path run = dir / "run.json";
    const json record = read_json(run);
    for (const char* path : {"fingerprint.recipe", "version"}) {
        test::write_file(run, with_raw_value(record, path, nested_arrays(kBomb)));
        check_nesting_error(error_of([&] { ResumeDir again(dir.path().string(), fingerprint, 2); }),
                            run);
    }
    // A key that looks like a path in a hostile record is reported, not parsed as an index.
    json odd = record;
    odd["fingerprint"]["recipe"] = {{"x[zz", 1}};
    test::write_file(run, odd.dump());
    CHECK_THROWS_WITH(ResumeDir(dir.path().string(), fingerprint, 2), Contains("differs"));
}

TEST_CASE("qforge on a nested config.json or tokenizer_config.json: exit 1, one line",
          "[hostile][json]") {
    test::ScratchDir dir("json-nest-cli");
    const fs::path hf = dir / "hf";
    fs::create_directories(hf);
    fs::copy_file(kData / "hf_models" / "llama_gqa_untied" / "model.safetensors",
                  hf / "model.safetensors");
    const json config = read_json(kData / "hf_models" / "llama_gqa_untied" / "config.json");
    test::write_file(hf / "config.json",
                     with_raw_value(config, "hidden_size", nested_objects(kBomb)));
    auto r = test::run_qforge("inspect '" + hf.string() + "'");
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output,
               Contains((hf / "config.json").string() + ": JSON nested deeper than 256 levels"));
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);

    const fs::path tok = copy_tokenizer("llama2", dir);
    const json tok_config = read_json(tok / "tokenizer_config.json");
    test::write_file(tok / "tokenizer_config.json",
                     with_raw_value(tok_config, "bos_token", nested_arrays(kBomb)));
    r = test::run_qforge("tokenize '" + (tok / "tokenizer.json").string() + "' -p hello");
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output,
               Contains((tok / "tokenizer_config.json").string() + ": JSON nested deeper"));
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
}

TEST_CASE("JsonView refuses wrong types, non-integers, negatives and overflow by key path",
          "[hostile][json]") {
    const std::string file = "f.json";
    const json j =
        json::parse(R"({"a": {"b": [1, -2, 2.5, 1e300, "7", 18446744073709551615, null, true]}})");
    const JsonView v(j, file);
    CHECK(v["a"]["b"][0].unsigned_integer() == 1);
    CHECK(v["a"]["b"][0].integer(0, 1) == 1);
    auto message = [&](auto&& f) { return error_of(f); };
    CHECK(message([&] { v["a"]["b"][1].unsigned_integer(); }) ==
          "f.json: key 'a.b[1]': expected a non-negative integer, found number -2");
    CHECK(message([&] { v["a"]["b"][2].integer(); }) ==
          "f.json: key 'a.b[2]': expected an integer, found number 2.5");
    CHECK(message([&] { v["a"]["b"][3].unsigned_integer(); }) ==
          "f.json: key 'a.b[3]': expected a non-negative integer, found number 1e+300");
    CHECK(message([&] { v["a"]["b"][4].string().substr(0, 0), v["a"]["b"][4].integer(); }) ==
          "f.json: key 'a.b[4]': expected an integer, found string \"7\"");
    CHECK(
        message([&] { v["a"]["b"][5].integer(); }) ==
        "f.json: key 'a.b[5]': expected an integer in [-9223372036854775808, 9223372036854775807], "
        "found number 18446744073709551615");
    CHECK(
        message([&] { v["a"]["b"][5].unsigned_integer(100); }) ==
        "f.json: key 'a.b[5]': expected an integer in [0, 100], found number 18446744073709551615");
    CHECK(message([&] { v["a"]["b"][6].string(); }) ==
          "f.json: key 'a.b[6]': expected a string, found null");
    CHECK(v["a"]["b"][6].string_or("x") == "x");
    CHECK(message([&] { v["a"]["b"][7].number(); }) ==
          "f.json: key 'a.b[7]': expected a number, found boolean true");
    CHECK(message([&] { v["a"]["c"].boolean(); }) ==
          "f.json: key 'a.c': missing (expected true or false)");
    CHECK(v["a"]["c"]["d"].boolean_or(true));
    CHECK(message([&] { v["a"]["b"]["c"].string(); }) ==
          "f.json: key 'a.b': expected an object, found an array of 8 elements");
    CHECK(message([&] { v["a"]["b"][8].string(); }) ==
          "f.json: key 'a.b': has 8 elements, element 8 is missing");
    // The backstop turns a library exception into an Error naming the file.
    CHECK(message([&] { with_json_errors(file, [&] { return j["a"].get<std::string>(); }); }) ==
          "f.json: unexpected JSON content: type must be string, but is object");
}

namespace {

// One broken value: the file it goes into, the key path, the value, and the key the message
// must name (the same path unless a reader words it its own way).
struct BadValue {
    std::string file;
    std::string path;
    json value;
    std::string named;
};

void check_bad_value_message(const std::string& message, const fs::path& file,
                             const std::string& named) {
    INFO(message);
    CHECK_THAT(message, Contains(file.string() + ": "));
    CHECK_THAT(message, Contains(named));
    CHECK_THAT(message, !Contains("json.exception"));
    CHECK_THAT(message, !Contains("type must be"));
}

}  // namespace

TEST_CASE("values of the wrong type in HF files name the file and the key", "[hostile][json]") {
    const std::vector<BadValue> cases = {
        // config.json (formats/model_config.cpp words keys as 'key')
        {"config.json", "vocab_size", "512", "'vocab_size'"},
        {"config.json", "hidden_size", -64, "'hidden_size'"},
        {"config.json", "num_hidden_layers", 1e300, "'num_hidden_layers'"},
        {"config.json", "num_attention_heads", 18446744073709551615u, "'num_attention_heads'"},
        {"config.json", "rms_norm_eps", "1e-5", "'rms_norm_eps'"},
        {"config.json", "tie_word_embeddings", 1, "'tie_word_embeddings'"},
        {"config.json", "rope_scaling", json::array({1}), "'rope_scaling'"},
        {"config.json", "eos_token_id", json::array({2, "x"}), "'eos_token_id'"},
        {"config.json", "model_type", 7, "'model_type'"},
        // tokenizer.json (llama2: SentencePiece-style fixture)
        {"tokenizer.json", "model.vocab.<unk>", "0", "key 'model.vocab.<unk>'"},
        {"tokenizer.json", "model.vocab.<s>", -1, "key 'model.vocab.<s>'"},
        {"tokenizer.json", "model.vocab.</s>", 2.0, "key 'model.vocab.</s>'"},
        {"tokenizer.json", "model.merges[0]", 5, "key 'model.merges[0]'"},
        {"tokenizer.json", "model.byte_fallback", "yes", "key 'model.byte_fallback'"},
        {"tokenizer.json", "model.unk_token", 5, "key 'model.unk_token'"},
        {"tokenizer.json", "model.type", json::array(), "key 'model.type'"},
        {"tokenizer.json", "added_tokens[0].id", "0", "key 'added_tokens[0].id'"},
        {"tokenizer.json", "added_tokens[0].content", 5, "key 'added_tokens[0].content'"},
        {"tokenizer.json", "added_tokens[1].special", "true", "key 'added_tokens[1].special'"},
        {"tokenizer.json", "added_tokens[0].normalized", 0, "key 'added_tokens[0].normalized'"},
        {"tokenizer.json", "added_tokens", json::object(), "key 'added_tokens'"},
        {"tokenizer.json", "normalizer.normalizers[0].prepend", 7,
         "key 'normalizer.normalizers[0].prepend'"},
        {"tokenizer.json", "normalizer.normalizers[1].content", nullptr,
         "key 'normalizer.normalizers[1].content'"},
        {"tokenizer.json", "normalizer.normalizers", "NFC", "key 'normalizer.normalizers'"},
        {"tokenizer.json", "decoder.decoders[3].start", -1, "key 'decoder.decoders[3].start'"},
        {"tokenizer.json", "decoder.decoders[3].stop", "0", "key 'decoder.decoders[3].stop'"},
        {"tokenizer.json", "decoder.decoders[1]", 3, "key 'decoder.decoders[1]'"},
        {"tokenizer.json", "post_processor.special_tokens.<s>.ids[0]", "1",
         "key 'post_processor.special_tokens.<s>.ids[0]'"},
        {"tokenizer.json", "post_processor.single[0].SpecialToken.id", 1,
         "key 'post_processor.single[0].SpecialToken.id'"},
        {"tokenizer.json", "post_processor.single", "x", "key 'post_processor.single'"},
        // tokenizer_config.json: named as itself, never as tokenizer.json
        {"tokenizer_config.json", "add_bos_token", "yes", "key 'add_bos_token'"},
        {"tokenizer_config.json", "add_eos_token", 1, "key 'add_eos_token'"},
        {"tokenizer_config.json", "bos_token", 5, "key 'bos_token'"},
        {"tokenizer_config.json", "eos_token", {{"content", 3}}, "key 'eos_token.content'"},
        {"tokenizer_config.json", "chat_template", 5, "key 'chat_template'"},
        {"tokenizer_config.json", "chat_template", json::object(), "key 'chat_template'"},
        // generation_config.json: likewise
        {"generation_config.json", "eos_token_id", "2", "key 'eos_token_id'"},
        {"generation_config.json", "eos_token_id", json::array({2, "x"}), "key 'eos_token_id[1]'"},
        {"generation_config.json", "eos_token_id", -1, "key 'eos_token_id'"},
        {"generation_config.json", "eos_token_id", 1e300, "key 'eos_token_id'"},
        {"generation_config.json", "eos_token_id", json::array({2, 4294967296u}),
         "key 'eos_token_id[1]'"},
    };
    test::ScratchDir dir("json-bad-values");
    const fs::path model = kData / "hf_models" / "llama_gqa_untied";
    const json config = read_json(model / "config.json");
    const fs::path tok_dir = copy_tokenizer("llama2", dir);
    const json tokenizer = read_json(tok_dir / "tokenizer.json");
    const json tok_config = read_json(tok_dir / "tokenizer_config.json");
    const json gen_config = {{"bos_token_id", 1}, {"eos_token_id", json::array({2})}};
    // The unmodified files load: every failure below is the one changed value.
    test::write_file(tok_dir / "generation_config.json", gen_config.dump());
    REQUIRE_NOTHROW(load_tokenizer_source((tok_dir / "tokenizer.json").string()));

    for (const BadValue& c : cases) {
        INFO(c.file << " " << c.path << " = " << c.value.dump());
        if (c.file == "config.json") {
            json j = config;
            at_path(j, c.path) = c.value;
            const fs::path p = dir / "config.json";
            test::write_file(p, j.dump());
            check_bad_value_message(error_of([&] { read_model_config(p.string()); }), p, c.named);
            continue;
        }
        json tok = tokenizer, tc = tok_config, gen = gen_config;
        json& target = c.file == "tokenizer.json"          ? tok
                       : c.file == "tokenizer_config.json" ? tc
                                                           : gen;
        at_path(target, c.path) = c.value;
        test::write_file(tok_dir / "tokenizer.json", tok.dump());
        test::write_file(tok_dir / "tokenizer_config.json", tc.dump());
        test::write_file(tok_dir / "generation_config.json", gen.dump());
        check_bad_value_message(
            error_of([&] { load_tokenizer_source((tok_dir / "tokenizer.json").string()); }),
            tok_dir / c.file, c.named);
    }
}

TEST_CASE("values of the wrong type in a .qf header name the file and the key", "[hostile][json]") {
    test::ScratchDir dir("json-bad-qf");
    const fs::path tok_dir = copy_tokenizer("llama2", dir);
    const json schema = load_tokenizer_source((tok_dir / "tokenizer.json").string());
    const fs::path p = dir / "m.qf";
    write_qf(p, schema);
    const json header = qf_header(p);
    REQUIRE_NOTHROW(Tokenizer::load(p.string()));

    const std::vector<BadValue> cases = {
        {"", "format_version", "1", "key 'format_version'"},
        {"", "format_version", -1, "key 'format_version'"},
        {"", "format", 1, "key 'format'"},
        {"", "tensors[0].offset", "0", "key 'tensors[0].offset'"},
        {"", "tensors[0].offset", -64, "key 'tensors[0].offset'"},
        {"", "tensors[0].offset", 1.5, "key 'tensors[0].offset'"},
        {"", "tensors[2].length", 1e300, "key 'tensors[2].length'"},
        {"", "tensors[1].stored_length", nullptr, "key 'tensors[1].stored_length'"},
        {"", "tensors[1].shape[0]", -3, "key 'tensors[1].shape[0]'"},
        {"", "tensors[1].shape", 4, "key 'tensors[1].shape'"},
        {"", "tensors[2].name", 5, "key 'tensors[2].name'"},
        {"", "tensors[2].qtype", json::array(), "key 'tensors[2].qtype'"},
        {"", "tensors[0].encoding", false, "key 'tensors[0].encoding'"},
        {"", "tensors[0].checksum", 0, "key 'tensors[0].checksum'"},
        {"", "tensors[1]", "x", "key 'tensors[1]'"},
        {"", "tensors", json::object(), "key 'tensors'"},
        {"", "provenance", json::array(), "key 'provenance'"},
        {"", "model", 3, "key 'model'"},
        {"", "tokenizer", "x", "key 'tokenizer'"},
    };
    for (const BadValue& c : cases) {
        INFO(c.path << " = " << c.value.dump());
        json h = header;
        at_path(h, c.path) = c.value;
        write_qf(p, schema);
        replace_qf_header(p, h.dump());
        check_bad_value_message(error_of([&] { QfFile f(p.string()); }), p, c.named);
    }

    // The tokenizer stored in the header: read when the model's tokenizer is loaded.
    const std::vector<BadValue> tokenizer_cases = {
        {"", "tokenizer.add_bos", "yes", "key 'tokenizer.add_bos'"},
        {"", "tokenizer.chat_template", 5, "key 'tokenizer.chat_template'"},
        {"", "tokenizer.token_types[3]", 5, "key 'tokenizer.token_types[3]'"},
        {"", "tokenizer.merges[0]", 5, "key 'tokenizer.merges[0]'"},
        {"", "tokenizer.bpe.byte_fallback", "no", "key 'tokenizer.bpe.byte_fallback'"},
        {"", "tokenizer.added_tokens[0].special", 1, "key 'tokenizer.added_tokens[0].special'"},
        {"", "tokenizer.decoder.strip_leading_spaces", -1,
         "key 'tokenizer.decoder.strip_leading_spaces'"},
        {"", "tokenizer.decoder.metaspace", 1, "key 'tokenizer.decoder.metaspace'"},
        {"", "tokenizer.normalizer[0].prepend", 1, "key 'tokenizer.normalizer[0].prepend'"},
        {"", "tokenizer.model", 1, "tokenizer"},
    };
    for (const BadValue& c : tokenizer_cases) {
        INFO(c.path << " = " << c.value.dump());
        json h = header;
        at_path(h, c.path) = c.value;
        write_qf(p, schema);
        replace_qf_header(p, h.dump());
        check_bad_value_message(error_of([&] { Tokenizer::load(p.string()); }), p, c.named);
    }
}

TEST_CASE("a chat template nesting bomb in a GGUF names the GGUF file", "[hostile][json]") {
    test::ScratchDir dir("json-nest-gguf");
    test::TestGguf g;
    g.kvs = {test::kv_str("tokenizer.ggml.model", "gpt2"),
             test::kv_str_array("tokenizer.ggml.tokens", {"a", "b", "ab"}),
             test::kv_str_array("tokenizer.ggml.merges", {"a b"}),
             test::kv_str("tokenizer.ggml.pre", "llama-bpe"),
             test::kv_u32("tokenizer.ggml.bos_token_id", 2),
             test::kv_str("tokenizer.chat_template", "{{ (1) }}")};
    const fs::path p = dir / "t.gguf";
    test::write_file(p, g.bytes());
    CHECK(tokenizer_schema_from_gguf(GgufFile(p.string())).at("chat_template") == "{{ (1) }}");
    g.kvs.back() = test::kv_str("tokenizer.chat_template", "{{ " + std::string(kBomb, '(') + "1" +
                                                               std::string(kBomb, ')') + " }}");
    test::write_file(p, g.bytes());
    CHECK_THROWS_WITH(
        tokenizer_schema_from_gguf(GgufFile(p.string())),
        Contains(p.string() +
                 ": tokenizer.chat_template: chat template nested deeper than 256 levels"));
}

TEST_CASE("a nesting bomb in a block state's CBOR meta section is an Error naming the file",
          "[hostile][json]") {
    test::ScratchDir dir("json-nest-cbor-state");
    const ResumeDir resume(dir.path().string(), json{{"source", "x"}}, 2);
    std::vector<uint8_t> cbor(kBomb, 0x81);  // 100,000 nested one-element arrays
    cbor.push_back(0x00);
    std::vector<uint8_t> frame(ZSTD_compressBound(cbor.size()));
    const size_t n = ZSTD_compress(frame.data(), frame.size(), cbor.data(), cbor.size(), 1);
    REQUIRE(!ZSTD_isError(n));
    frame.resize(n);
    StateFileHeader h{};
    std::memcpy(h.magic, "QFSTATE", 8);
    h.version = kStateFileVersion;
    h.sections = 1;
    h.layer = 0;
    StateSection section{};
    section.kind = static_cast<uint32_t>(StateSectionKind::meta);
    section.raw_bytes = cbor.size();
    section.stored_bytes = frame.size();
    std::vector<uint8_t> bytes(sizeof h + sizeof section + frame.size());
    std::memcpy(bytes.data(), &h, sizeof h);
    std::memcpy(bytes.data() + sizeof h, &section, sizeof section);
    std::memcpy(bytes.data() + sizeof h + sizeof section, frame.data(), frame.size());
    const std::string path = resume.block_path(0);
    test::write_file(path, bytes);
    CHECK_THROWS_WITH(resume.load(0, false, false),
                      Contains(path + ": damaged block state: meta section nested deeper than 256 "
                                      "levels"));
}

}  // namespace json_hostile_test
