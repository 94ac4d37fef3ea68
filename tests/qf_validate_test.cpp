// A .qf whose tensors disagree with its own config, or whose tokenizer does not fit its
// vocabulary, is refused by every command that opens it, with one message naming the file and
// the tensor or key: verify, inspect, ppl, generate, bench, quantize and export alike. Each broken
// file is made here from a valid conversion of stories260K with exactly one defect.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "core/error.hpp"
#include "formats/qf.hpp"
#include "qf_support.hpp"
#include "test_support.hpp"

namespace qf_validate_test {

using namespace qforge;
using Catch::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Tensor {
    std::string name;
    QType qtype;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> bytes;
};

// A .qf taken apart: what QfWriter needs to write it again.
struct QfParts {
    json model, tokenizer, provenance;
    std::vector<Tensor> tensors;

    Tensor& at(const std::string& name) {
        for (auto& t : tensors)
            if (t.name == name) return t;
        FAIL("no tensor " << name);
        throw std::logic_error("unreachable");
    }
};

QfParts read_parts(const fs::path& p) {
    const QfFile qf(p.string(), {.check_model = false});
    QfParts parts{qf.model(), qf.header().at("tokenizer"), qf.header().at("provenance"), {}};
    std::vector<uint8_t> scratch;
    for (const auto& t : qf.tensors()) {
        const auto b = qf.tensor_bytes(t, scratch);
        parts.tensors.push_back({t.name, t.qtype, t.shape, {b.begin(), b.end()}});
    }
    return parts;
}

void write_parts(const fs::path& p, const QfParts& parts) {
    QfWriter w(p.string());
    w.set_model(parts.model);
    w.set_tokenizer(parts.tokenizer);
    w.set_provenance(parts.provenance);
    for (const auto& t : parts.tensors) w.add_tensor(t.name, t.qtype, t.shape, t.bytes);
    w.finish();
}

// Replaces `from` by `to` in the JSON header text itself, for what nlohmann would not write
// (1e999) or QfWriter would not accept (a norm typed q4_g32); the preamble is kept consistent.
void edit_header_text(const fs::path& p, const std::string& from, const std::string& to) {
    std::string text = test::qf_header_text(p);
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    test::replace_qf_header(p, text);
}

struct Defect {
    std::string label;
    std::function<void(QfParts&)> edit;               // on the parts, before writing
    std::pair<std::string, std::string> header_text;  // then on the header's text
    std::string expected;                             // in the one error line
    std::function<void(json&)> header = {};           // then on the header's JSON
    bool structural = false;  // refused by the reader itself: inspect cannot show the table
};

// Rewrites the header's JSON through `edit`, keeping the preamble consistent.
void edit_header(const fs::path& p, const std::function<void(json&)>& edit) {
    auto bytes = test::read_file(p);
    QfPreamble pre;
    std::memcpy(&pre, bytes.data(), sizeof pre);
    const std::string text(bytes.begin() + static_cast<long>(pre.header_offset), bytes.end());
    json h = json::parse(text);
    edit(h);
    edit_header_text(p, text, h.dump());
}

// clang-format off
const std::vector<Defect> kDefects = {
    {"a tensor missing", [](QfParts& q) { std::erase_if(q.tensors, [](const Tensor& t) { return t.name == "layers.2.attn.k"; }); },
     {}, "tensor 'layers.2.attn.k': missing: the architecture 'llama' requires it, with shape [32, 64]"},
    {"embed transposed, same bytes", [](QfParts& q) { q.at("embed").shape = {64, 512}; },
     {}, "tensor 'embed': shape [64, 512] but the config's vocab_size 512 and hidden_size 64 require [512, 64]"},
    {"513 embedding rows for vocab 512", [](QfParts& q) { auto& e = q.at("embed"); e.shape = {513, 64}; e.bytes.resize(513 * 64 * 4); },
     {}, "tensor 'embed': shape [513, 64] but the config's vocab_size 512 and hidden_size 64 require [512, 64]"},
    {"head_dim wrong", [](QfParts& q) { q.model["head_dim"] = 16; },
     {}, "tensor 'layers.0.attn.q': shape [64, 64] but the config's num_attention_heads 8 * head_dim 16 and hidden_size 64 require [128, 64]"},
    {"untied without lm_head", [](QfParts& q) { q.model["tie_word_embeddings"] = false; },
     {}, "tensor 'lm_head': missing: the config has tie_word_embeddings false"},
    {"tied with an lm_head", [](QfParts& q) { Tensor t = q.at("embed"); t.name = "lm_head"; q.tensors.push_back(t); },
     {}, "tensor 'lm_head': present but the config has tie_word_embeddings true"},
    {"attention_bias without biases", [](QfParts& q) { q.model["attention_bias"] = true; },
     {}, "tensor 'layers.0.attn.q_bias': missing: the config has attention_bias true"},
    {"a bias without attention_bias", [](QfParts& q) { q.tensors.push_back({"layers.1.attn.v_bias", QType::f32, {32}, std::vector<uint8_t>(128)}); },
     {}, "tensor 'layers.1.attn.v_bias': present but the config has attention_bias false"},
    {"an unknown tensor", [](QfParts& q) { q.tensors.push_back({"layers.0.attn.gate", QType::f32, {64}, std::vector<uint8_t>(256)}); },
     {}, "tensor 'layers.0.attn.gate': unknown tensor for architecture 'llama'"},
    {"a layer past num_hidden_layers", [](QfParts& q) { Tensor t = q.at("layers.4.mlp_norm"); t.name = "layers.5.mlp_norm"; q.tensors.push_back(t); },
     {}, "tensor 'layers.5.mlp_norm': layer 5 but the config has num_hidden_layers 5"},
    // The reader refuses a packed type for a 1-D tensor before validation sees it.
    {"a norm stored as q4", nullptr, {}, "tensor 'final_norm': shape [64]: q4_g32 tensors must be matrices",
     [](json& h) { for (auto& t : h["tensors"]) if (t["name"] == "final_norm") t["qtype"] = "q4_g32"; }, true},
    {"eps 0", [](QfParts& q) { q.model["rms_norm_eps"] = 0.0; },
     {}, "'rms_norm_eps' must be in (0, 1), found 0"},
    {"eps NaN (JSON writes null)", [](QfParts& q) { q.model["rms_norm_eps"] = std::nan(""); },
     {}, "missing required key 'rms_norm_eps'"},
    // JSON has no infinity; the nearest a header can say is refused by the parser.
    // (The parser's wording is its own; the line must still start with the file.)
    {"eps infinite (1e999)", [](QfParts& q) { q.model["rms_norm_eps"] = 0.123456; },
     {"0.123456", "1e999"}, "", {}, true},
    {"eps negative", [](QfParts& q) { q.model["rms_norm_eps"] = -1e-5; },
     {}, "'rms_norm_eps' must be in (0, 1), found -0.000010"},
    {"rope_theta 0", [](QfParts& q) { q.model["rope_theta"] = 0.0; },
     {}, "'rope_theta' must be a positive number"},
    {"vocab 0", [](QfParts& q) { q.model["vocab_size"] = 0; },
     {}, "'vocab_size' must be between 1 and"},
    {"max_position_embeddings 0", [](QfParts& q) { q.model["max_position_embeddings"] = 0; },
     {}, "'max_position_embeddings' must be between 1 and"},
    {"heads not a multiple of kv_heads", [](QfParts& q) { q.model["num_key_value_heads"] = 3; },
     {}, "num_attention_heads (8) is not a multiple of num_key_value_heads (3)"},
    {"head_dim odd", [](QfParts& q) { q.model["head_dim"] = 7; },
     {}, "head_dim (7) must be even"},
    {"bos id past the vocabulary", [](QfParts& q) { q.model["bos_token_id"] = 512; },
     {}, "'bos_token_id' 512 is not below vocab_size 512"},
    {"eos id past the vocabulary", [](QfParts& q) { q.model["eos_token_ids"] = json::array({2, 9000}); },
     {}, "'eos_token_id' 9000 is not below vocab_size 512"},
    {"a tokenizer with more tokens than vocab_size", [](QfParts& q) {
         for (int i = 0; i < 8; ++i) {
             q.tokenizer["pieces"].push_back("extra" + std::to_string(i));
             q.tokenizer["scores"].push_back(0.0);
             q.tokenizer["token_types"].push_back("normal");
         } },
     {}, "the embedded tokenizer has 520 tokens, more than the model's vocab_size 512"},
};
// clang-format on

// The defect's file, written from the valid `good` one.
fs::path make_broken(const fs::path& good, const Defect& d, const fs::path& out) {
    QfParts parts = read_parts(good);
    if (d.edit) d.edit(parts);
    write_parts(out, parts);
    if (!d.header_text.first.empty())
        edit_header_text(out, d.header_text.first, d.header_text.second);
    if (d.header) edit_header(out, d.header);
    return out;
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// The lines of a command's output that are not empty.
std::vector<std::string> lines_of(const std::string& s) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < s.size()) {
        size_t end = s.find('\n', at);
        if (end == std::string::npos) end = s.size();
        if (end > at) out.push_back(s.substr(at, end - at));
        at = end + 1;
    }
    return out;
}

}  // namespace

TEST_CASE("validate: every command refuses a .qf that disagrees with its config",
          "[hostile][validate][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("validate-catalogue");
    const fs::path good = test::convert_stories(data, "hf", dir);
    const fs::path text = dir / "text.txt";
    test::write_file(text, std::string("Once upon a time there was a little girl named Lily."));

    // The valid file passes everywhere (so each refusal below is the defect's).
    REQUIRE(test::run_qforge("verify " + quoted(good)).exit_code == 0);
    REQUIRE_NOTHROW(QfFile(good.string()));

    int n = 0;
    for (const Defect& d : kDefects) {
        INFO(d.label);
        const fs::path bad = dir / ("bad" + std::to_string(n++) + ".qf");
        make_broken(good, d, bad);
        const std::string expected = bad.string() + ": " + d.expected;

        // The library: the open itself refuses it.
        REQUIRE_THROWS_WITH(QfFile(bad.string()), Contains(d.expected));

        const fs::path out = dir / "out.qf", out_dir = dir / "export";
        const std::vector<std::string> commands = {
            "verify " + quoted(bad),
            "ppl " + quoted(bad) + " -f " + quoted(text) + " --ctx 8",
            "generate " + quoted(bad) + " -n 4 --greedy -p Once",
            "bench " + quoted(bad) + " -p 4 -n 4 -r 1",
            "quantize " + quoted(bad) + " --qtype q8 -o " + quoted(out),
            "export " + quoted(bad) + " --format gptq -o " + quoted(out_dir),
            "tokenize " + quoted(bad) + " -p Once",
        };
        for (const std::string& cmd : commands) {
            INFO(cmd);
            const auto r = test::run_qforge(cmd);
            INFO(r.output);
            REQUIRE(r.exit_code == 1);
            const auto lines = lines_of(r.output);
            REQUIRE(lines.size() == 1);
            REQUIRE_THAT(lines[0], Contains("qforge: error: " + expected));
            REQUIRE_FALSE(fs::exists(out));
            REQUIRE_FALSE(fs::exists(out_dir));
        }
        // inspect shows the table (that is how one sees what is wrong) and then fails the same.
        const auto r = test::run_qforge("inspect " + quoted(bad));
        INFO(r.output);
        REQUIRE(r.exit_code == 1);
        if (!d.structural) REQUIRE_THAT(r.output, Contains("INVALID: " + expected));
        REQUIRE_THAT(lines_of(r.output).back(), Contains("qforge: error: " + expected));
        const auto j = test::run_qforge("inspect --json " + quoted(bad));
        REQUIRE(j.exit_code == 1);
        if (!d.structural) REQUIRE_THAT(j.output, Contains("\"valid\": false"));
    }
}

TEST_CASE("validate: a tokenizer with more tokens than vocab_size is refused, naming both files",
          "[hostile][validate]") {
    test::ScratchDir dir("validate-tokenizer-more");
    const fs::path src = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data";
    const fs::path model = src / "hf_models" / "llama_gqa_untied";              // vocab_size 256
    const fs::path tokenizer = src / "tokenizers" / "gpt2" / "tokenizer.json";  // 3001 tokens
    const fs::path out = dir / "out.qf";
    const std::string why = tokenizer.string() +
                            ": the tokenizer has 3001 tokens, more than the vocab_size 256 of " +
                            model.string();
    for (const std::string& cmd :
         {"convert " + quoted(model) + " --tokenizer " + quoted(tokenizer) + " -o " + quoted(out),
          "quantize " + quoted(model) + " --tokenizer " + quoted(tokenizer) + " --qtype q8 -o " +
              quoted(out)}) {
        INFO(cmd);
        const auto r = test::run_qforge(cmd);
        INFO(r.output);
        REQUIRE(r.exit_code == 1);
        REQUIRE(lines_of(r.output).size() == 1);
        REQUIRE_THAT(r.output, Contains("qforge: error: " + why));
        REQUIRE_FALSE(fs::exists(out));
    }
    // The same tokenizer found beside the checkpoint (no --tokenizer) is refused the same way.
    const fs::path copy = dir / "model";
    fs::create_directories(copy);
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(model / f, copy / f);
    fs::copy_file(tokenizer, copy / "tokenizer.json");
    const auto r = test::run_qforge("convert " + quoted(copy) + " -o " + quoted(out));
    INFO(r.output);
    REQUIRE(r.exit_code == 1);
    REQUIRE_THAT(r.output,
                 Contains("the tokenizer has 3001 tokens, more than the vocab_size 256 of " +
                          copy.string()));
    REQUIRE_FALSE(fs::exists(out));
}

TEST_CASE("validate: a tokenizer with fewer tokens than vocab_size converts, warns, and generates",
          "[hostile][validate][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("validate-tokenizer-fewer");
    // The first 400 records of tok512.bin: 112 embedding rows without a token, as real models
    // have padding rows (Qwen2.5: 151936 rows, 151665 tokens).
    const auto full = test::read_file(data / "stories260K" / "tok512.bin");
    size_t at = 4;
    for (int i = 0; i < 400; ++i) {
        int32_t len;
        std::memcpy(&len, full.data() + at + 4, 4);
        at += 8 + static_cast<size_t>(len);
    }
    const fs::path tok = dir / "tok400.bin", qf = dir / "m.qf";
    test::write_file(tok, std::vector<uint8_t>(full.begin(), full.begin() + static_cast<long>(at)));
    const auto c = test::run_qforge("convert " + quoted(data / "stories260K" / "hf") +
                                    " --tokenizer " + quoted(tok) + " -o " + quoted(qf));
    INFO(c.output);
    REQUIRE(c.exit_code == 0);
    REQUIRE_THAT(c.output,
                 Contains("warning: " + tok.string() +
                          " has 400 tokens for 512 embedding rows: 112 ids have no token"));
    REQUIRE(test::run_qforge("verify " + quoted(qf)).exit_code == 0);
    // Near-uniform sampling over all 512 ids would pick one of the 112 within a few tokens; the
    // masked logits never do, so the whole run decodes.
    for (const char* how : {"--temp 50 --top-k 0 --top-p 1", "--greedy"}) {
        const auto g =
            test::run_qforge("generate " + quoted(qf) + " -n 200 --seed 3 " + std::string(how));
        INFO(how << "\n" << g.output);
        REQUIRE(g.exit_code == 0);
    }
}

}  // namespace qf_validate_test
