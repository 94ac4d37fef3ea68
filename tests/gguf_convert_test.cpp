// GGUF -> .qf on tests/data/gguf/tiny_llama.gguf, a 2-layer "llama" model written by llama.cpp's
// `gguf` package with q/k permuted as convert_hf_to_gguf.py does and a different ggml type per
// tensor (scripts/make_gguf_fixtures.py): the config from the metadata, every tensor's values in
// Hugging Face layout (fingerprints of the package's dequantization, un-permuted in Python), the
// tokenizer against `tokenizers`, and the logits against transformers on the same dequantized
// weights (scripts/make_gguf_logits_fixtures.py). Runs in CI: no model download needed.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "formats/architectures.hpp"
#include "formats/gguf.hpp"
#include "formats/qf.hpp"
#include "gguf_builder.hpp"
#include "runtime/backend.hpp"
#include "runtime/model.hpp"
#include "runtime/thread_pool.hpp"
#include "sources/gguf.hpp"
#include "test_support.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/pretokenizer.hpp"
#include "tokenizer/source_gguf.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer_fixtures.hpp"

namespace gguf_convert_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

const fs::path kGgufFixtures = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "gguf";
const fs::path kTiny = kGgufFixtures / "tiny_llama.gguf";

// Our tensor names against llama.cpp's, written out independently of the architecture table's GGUF
// names.
std::string gguf_name_of(const std::string& ours) {
    static const std::map<std::string, std::string> global = {{"embed", "token_embd.weight"},
                                                              {"final_norm", "output_norm.weight"},
                                                              {"lm_head", "output.weight"}};
    static const std::map<std::string, std::string> layer = {
        {"attn_norm", "attn_norm.weight"}, {"attn.q", "attn_q.weight"},
        {"attn.k", "attn_k.weight"},       {"attn.v", "attn_v.weight"},
        {"attn.o", "attn_output.weight"},  {"mlp_norm", "ffn_norm.weight"},
        {"mlp.gate", "ffn_gate.weight"},   {"mlp.up", "ffn_up.weight"},
        {"mlp.down", "ffn_down.weight"}};
    if (global.count(ours)) return global.at(ours);
    const size_t dot = ours.find('.', 7);  // "layers.N.rest"
    return "blk." + ours.substr(7, dot - 7) + "." + layer.at(ours.substr(dot + 1));
}

// The fixture's fingerprint: sum of v[r, c] * (((7 r + 3 c) mod 11) - 5), and the scale of its
// terms (sum of |v| * 5) to bound float64 summation-order differences.
std::pair<double, double> fingerprint(const std::vector<float>& v, uint64_t rows) {
    const uint64_t cols = v.size() / rows;
    double sum = 0.0, scale = 0.0;
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t c = 0; c < cols; ++c) {
            const double x = v[r * cols + c];
            sum += x * static_cast<double>(static_cast<int64_t>((7 * r + 3 * c) % 11) - 5);
            scale += std::abs(x) * 5;
        }
    return {sum, scale};
}

std::vector<float> tensor_floats(const QfFile& qf, const QfTensorInfo& t) {
    std::vector<uint8_t> scratch;
    const auto bytes = qf.tensor_bytes(t, scratch);
    const uint64_t n = *checked_product(t.shape);
    std::vector<float> out(n);
    if (t.qtype == QType::f32) {
        std::memcpy(out.data(), bytes.data(), n * 4);
    } else {
        REQUIRE(t.qtype == QType::f16);
        for (uint64_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, bytes.data() + 2 * i, 2);
            out[i] = f16_to_f32(h);
        }
    }
    return out;
}

fs::path convert_tiny(const ScratchDir& dir, const std::string& name,
                      std::optional<QType> dtype = std::nullopt) {
    ConvertOptions o;
    o.input = kTiny.string();
    o.output = (dir / name).string();
    o.dtype = dtype;
    const ConvertReport r = convert_checkpoint(o);
    CHECK(r.tensors == 21);
    CHECK(r.tokenizer == kTiny.string());
    CHECK(r.warnings.empty());
    return o.output;
}

}  // namespace

TEST_CASE("GGUF convert: config from the metadata", "[gguf]") {
    CHECK(is_gguf_file(kTiny.string()));
    CHECK_FALSE(is_gguf_file((kGgufFixtures / "tiny_llama.json").string()));
    CHECK_FALSE(is_gguf_file("/nonexistent.gguf"));
    const ModelConfig c = gguf_model_config(GgufFile(kTiny.string()));
    CHECK(c.arch == Architecture::llama);
    CHECK(c.vocab_size == 300);
    CHECK(c.hidden_size == 64);
    CHECK(c.intermediate_size == 64);
    CHECK(c.num_layers == 2);
    CHECK(c.num_heads == 4);
    CHECK(c.num_kv_heads == 2);
    CHECK(c.head_dim == 16);
    CHECK(c.max_position_embeddings == 256);
    CHECK(c.rms_norm_eps == 1e-5);  // stored as float32 9.99999975e-06; read back as written
    CHECK(c.rope_theta == 10000.0);
    CHECK_FALSE(c.tie_word_embeddings);
    CHECK_FALSE(c.attention_bias);
    CHECK(c.bos_token_id == 1);
    CHECK(c.eos_token_ids == std::vector<int64_t>{2});
}

TEST_CASE("GGUF convert: tensors in Hugging Face layout equal the gguf package's values",
          "[gguf]") {
    ScratchDir dir("gguf-convert");
    const auto ref = read_json_file(kGgufFixtures / "tiny_llama.json");
    for (const auto dtype : {std::optional<QType>(), std::optional<QType>(QType::f16)}) {
        INFO("dtype " << (dtype ? "f16" : "default"));
        const QfFile qf(convert_tiny(dir, dtype ? "tiny-f16.qf" : "tiny.qf", dtype).string());
        CHECK(qf.header().at("provenance").at("recipe").at("source_format") == "gguf");
        CHECK(qf.header().at("provenance").at("recipe").at("dtype") == (dtype ? "f16" : "f32"));
        CHECK(qf.header().at("provenance").at("recipe").at("gguf_tensor_types").at("Q4_1") == 4);
        REQUIRE(qf.tensors().size() == 21);
        for (const QfTensorInfo& t : qf.tensors()) {
            INFO("tensor " << t.name);
            const bool matrix = t.shape.size() == 2;
            CHECK(t.qtype == (dtype && matrix ? QType::f16 : QType::f32));
            const auto values = tensor_floats(qf, t);
            const auto [sum, scale] = fingerprint(values, matrix ? t.shape[0] : 1);
            const double want = ref.at("fingerprints").at(gguf_name_of(t.name)).get<double>();
            // Exact values: only the float64 summation order differs. f16 storage rounds each
            // value by at most 2^-11 relative, so the sum moves by at most scale * 2^-11.
            const double bound = dtype && matrix ? scale * std::ldexp(1.0, -11) : scale * 1e-13;
            CHECK(std::abs(sum - want) <= bound);
        }
    }
}

TEST_CASE("GGUF convert: the tokenizer equals `tokenizers` on the fixture texts", "[gguf]") {
    const Tokenizer tok = Tokenizer::from_schema(
        tokenizer_schema_from_gguf(GgufFile(kTiny.string())), kTiny.string());
    const auto ref = read_json_file(kGgufFixtures / "tiny_llama.json");
    CHECK(tok.vocab_size() == 300);
    CHECK(tok.bos_id() == 1);
    CHECK(tok.eos_id() == 2);
    CHECK_FALSE(tok.add_bos());
    CHECK(tok.stop_ids() == std::vector<int32_t>{2});
    std::map<std::string, std::string> texts;
    for (const auto& ft : load_fixture_texts(std::nullopt)) texts[ft.name] = ft.text;
    for (const auto& [name, text] : ref.at("texts").items()) texts[name] = text;
    int checked = 0;
    for (const auto& [name, ids] : ref.at("ids").items()) {
        INFO("text " << name);
        REQUIRE(texts.count(name));
        const auto want = ids.get<std::vector<int32_t>>();
        const auto got = tok.encode(texts.at(name), true);
        CHECK(first_difference(got, want, [](int32_t id) { return std::to_string(id); }) == "");
        ++checked;
    }
    CHECK(checked >= 30);
    // The ChatML template renders with the file's special tokens.
    CHECK(render_chat_prompt(tok, "", "Hi") ==
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("GGUF convert: logits equal transformers on the dequantized weights", "[gguf]") {
    const fs::path ref_path = test::fixture("gguf/tiny_llama_logits.gguf");
    const GgufFile ref(ref_path.string());
    const std::vector<int64_t> ids64 = ref.get_int_array("qforge.input_ids");
    const std::vector<int32_t> ids(ids64.begin(), ids64.end());
    const GgufTensorInfo* logits_info = ref.find_tensor("logits");
    REQUIRE(logits_info);
    std::vector<float> want(logits_info->elements);
    std::memcpy(want.data(), ref.tensor_data(*logits_info).data(), want.size() * 4);

    ScratchDir dir("gguf-logits");
    const Model model(convert_tiny(dir, "tiny.qf").string());
    const uint64_t v = model.config().vocab_size;
    REQUIRE(want.size() == ids.size() * v);
    ThreadPool pool(2);
    auto cpu = make_cpu_backend(model, pool);
    std::vector<float> got(ids.size() * v);
    auto cache = cpu->new_cache(ids.size());
    cpu->forward(ids, *cache, 0, got);
    // transformers' float32 and a float32 runtime with the same formulas agree to ~1e-6
    // (tests/runtime_hf_reference_test.cpp); a wrong permutation or type moves logits by O(1).
    double worst = 0.0;
    for (size_t t = 0; t < ids.size(); ++t) {
        double diff = 0.0, norm = 0.0;
        for (uint64_t i = 0; i < v; ++i) {
            const double d = got[t * v + i] - want[t * v + i];
            diff += d * d;
            norm += static_cast<double>(want[t * v + i]) * want[t * v + i];
        }
        worst = std::max(worst, std::sqrt(diff / norm));
    }
    INFO("worst relative L2 error " << worst);
    CHECK(worst < 1e-4);
}

TEST_CASE("GGUF convert: the CLI converts, and tokenizes with a .gguf", "[gguf][cli]") {
    ScratchDir dir("gguf-cli");
    const std::string out = (dir / "tiny.qf").string();
    const auto r = run_qforge("convert '" + kTiny.string() + "' -o '" + out + "'");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Contains("21 tensors"));
    const auto v = run_qforge("verify '" + out + "'");
    CHECK(v.exit_code == 0);
    const auto t = run_qforge("tokenize '" + kTiny.string() + "' -p 'Hi 42'");
    INFO(t.output);
    CHECK(t.exit_code == 0);
    // generate renders the ChatML template and shows only the reply; --raw continues the text.
    const auto chat = run_qforge("-q generate '" + out + "' -p 'Zebra' -n 3 --greedy");
    INFO(chat.output);
    CHECK(chat.exit_code == 0);
    CHECK(chat.output.find("Zebra") == std::string::npos);
    const auto raw = run_qforge("-q generate '" + out + "' -p 'Zebra' -n 3 --greedy --raw");
    INFO(raw.output);
    CHECK(raw.exit_code == 0);
    CHECK_THAT(raw.output, Catch::StartsWith("Zebra"));
}

TEST_CASE("GGUF convert: models qforge cannot run are refused by name", "[gguf]") {
    ScratchDir dir("gguf-convert-errors");
    auto convert_error = [&](const TestGguf& g) {
        const fs::path p = dir / "m.gguf";
        write_file(p, g.bytes());
        ConvertOptions o;
        o.input = p.string();
        o.output = (dir / "m.qf").string();
        try {
            convert_checkpoint(o);
        } catch (const Error& e) {
            CHECK_THAT(e.what(), Catch::StartsWith(p.string() + ": "));
            CHECK(files_containing(dir.path(), ".qf").empty());
            return std::string(e.what());
        }
        FAIL("converted");
        return std::string();
    };
    auto base = [] {
        TestGguf g;
        g.kvs = {kv_str("general.architecture", "llama"),
                 kv_u32("llama.embedding_length", 64),
                 kv_u32("llama.feed_forward_length", 64),
                 kv_u32("llama.block_count", 1),
                 kv_u32("llama.attention.head_count", 4),
                 kv_u32("llama.context_length", 128),
                 kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f)};
        g.tensors = {{"token_embd.weight", {64, 8}, 0, std::vector<uint8_t>(64 * 8 * 4, 0), {}}};
        return g;
    };
    TestGguf g = base();
    g.kvs[0] = kv_str("general.architecture", "mamba");
    CHECK_THAT(convert_error(g),
               Catch::Contains("GGUF architecture 'mamba' is not supported (supported: llama, "
                               "qwen2, qwen3, gemma2, gemma3, phi3)"));
    g = base();
    g.kvs.erase(g.kvs.begin() + 6);
    CHECK_THAT(convert_error(g),
               Catch::Contains("'llama.attention.layer_norm_rms_epsilon' is absent"));
    g = base();
    g.kvs.push_back(kv_u32("llama.rope.dimension_count", 8));
    CHECK_THAT(convert_error(g), Catch::Contains("partial rotary embeddings are not supported"));
    g = base();
    g.kvs.push_back(kv_str("llama.rope.scaling.type", "yarn"));
    CHECK_THAT(convert_error(g), Catch::Contains("RoPE scaling 'yarn'"));
    g = base();
    CHECK_THAT(convert_error(g),
               Catch::Contains("tensor for 'layers.0.attn_norm' (shape [64]) is missing"));
    g = base();
    g.tensors.push_back({"blk.0.attn_rot_embd", {64}, 0, std::vector<uint8_t>(256, 0), {}});
    CHECK_THAT(convert_error(g),
               Catch::Contains("tensor 'blk.0.attn_rot_embd': unexpected tensor"));
    // Phi-3: its 128k models' longrope factors, and a fused attn_qkv that is not there.
    auto phi3 = [&] {
        TestGguf p = base();
        for (TestKv& kv : p.kvs)
            if (kv.key.starts_with("llama.")) kv.key = "phi3." + kv.key.substr(6);
        p.kvs[0] = kv_str("general.architecture", "phi3");
        p.tensors.push_back({"blk.0.attn_norm.weight", {64}, 0, std::vector<uint8_t>(256, 0), {}});
        return p;
    };
    g = phi3();
    g.tensors.push_back({"rope_factors_long.weight", {8}, 0, std::vector<uint8_t>(32, 0), {}});
    CHECK_THAT(convert_error(g), Catch::Contains("tensor 'rope_factors_long.weight': Phi-3's "
                                                 "longrope / su RoPE scaling"));
    CHECK_THAT(convert_error(phi3()),
               Catch::Contains("tensor 'blk.0.attn_qkv.weight' (shape [192, 64], holding "
                               "'layers.0.attn.q') is missing"));
    g = base();
    g.tensors[0].ne = {32, 8};
    g.tensors[0].data.resize(32 * 8 * 4);
    CHECK_THAT(convert_error(g),
               Catch::Contains("tensor 'token_embd.weight': shape [8, 32] but the "
                               "metadata implies [8, 64]"));
}

TEST_CASE("GGUF tokenizer metadata: unknown names are refused, llama vocabularies map", "[gguf]") {
    ScratchDir dir("gguf-tokenizer");
    auto schema_error = [&](const TestGguf& g) {
        write_file(dir / "t.gguf", g.bytes());
        try {
            tokenizer_schema_from_gguf(GgufFile((dir / "t.gguf").string()));
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    std::vector<std::string> tokens = {"a", "b", "ab"};
    TestGguf g;
    g.kvs = {kv_str("tokenizer.ggml.model", "gpt2"), kv_str_array("tokenizer.ggml.tokens", tokens),
             kv_str_array("tokenizer.ggml.merges", {"a b"}),
             kv_str("tokenizer.ggml.pre", "deepseek-llm")};
    CHECK_THAT(schema_error(g),
               Catch::Contains("tokenizer.ggml.pre 'deepseek-llm' is not a pre-tokenizer "
                               "qforge knows (known: gpt-2,"));
    g.kvs.pop_back();
    CHECK_THAT(schema_error(g), Catch::Contains("tokenizer.ggml.pre is absent"));
    g.kvs.push_back(kv_str("tokenizer.ggml.pre", "llama-bpe"));
    g.kvs.push_back(kv_str_array("tokenizer.ggml.merges", {"a c"}));
    CHECK_THAT(schema_error(g), Catch::Contains("appears twice"));
    g.kvs.pop_back();
    g.kvs[2] = kv_str_array("tokenizer.ggml.merges", {"a c"});
    CHECK_THAT(schema_error(g),
               Catch::Contains("merge 0 \"a c\" names \"c\", which is not a token"));
    g.kvs[2] = kv_str_array("tokenizer.ggml.merges", {"a b"});
    g.kvs[0] = kv_str("tokenizer.ggml.model", "bert");
    CHECK_THAT(schema_error(g), Catch::Contains("tokenizer.ggml.model 'bert' is not supported"));
    g.kvs[0] = kv_str("tokenizer.ggml.model", "gpt2");
    g.kvs.push_back(kv_u32("tokenizer.ggml.bos_token_id", 3));
    CHECK_THAT(schema_error(g),
               Catch::Contains("tokenizer.ggml.bos_token_id = 3 is not a token id (3 tokens)"));
    g.kvs.pop_back();
    // The Llama 3 group ignores merges and adds BOS by default (llama.cpp's settings).
    g.kvs.push_back(kv_u32("tokenizer.ggml.bos_token_id", 2));
    write_file(dir / "t.gguf", g.bytes());
    const auto s = tokenizer_schema_from_gguf(GgufFile((dir / "t.gguf").string()));
    CHECK(s.at("bpe").at("ignore_merges") == true);
    CHECK(s.at("add_bos") == true);
    CHECK(s.at("pre_tokenizer").at("split_regexes") == nlohmann::json::array({"llama-bpe"}));

    // A SentencePiece ("llama") vocabulary: merges from scores, the meta space, byte fallback.
    TestGguf spm;
    const std::vector<std::string> pieces = {
        "<unk>", "<s>", "</s>", "\xe2\x96\x81", "h", "i", "\xe2\x96\x81h", "\xe2\x96\x81hi", "hi"};
    std::vector<uint8_t> scores_payload;
    put_u32(scores_payload, kF32);
    put_u64(scores_payload, pieces.size());
    for (float sc : {0.f, 0.f, 0.f, -1.f, -2.f, -3.f, -4.f, -5.f, -6.f}) {
        uint32_t b;
        std::memcpy(&b, &sc, 4);
        put_u32(scores_payload, b);
    }
    spm.kvs = {kv_str("tokenizer.ggml.model", "llama"),
               kv_str_array("tokenizer.ggml.tokens", pieces),
               TestKv{"tokenizer.ggml.scores", kArr, scores_payload},
               kv_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1, 1}),
               kv_u32("tokenizer.ggml.bos_token_id", 1),
               kv_u32("tokenizer.ggml.eos_token_id", 2)};
    write_file(dir / "spm.gguf", spm.bytes());
    const auto ss = tokenizer_schema_from_gguf(GgufFile((dir / "spm.gguf").string()));
    CHECK(ss.at("model") == "bpe_sentencepiece");
    // "▁h" (score -4) before "▁hi" (-5) before "hi" (-6); "▁hi" splits two ways, by ids.
    CHECK(ss.at("merges") ==
          nlohmann::json::array({"\xe2\x96\x81 h", "\xe2\x96\x81 hi", "\xe2\x96\x81h i", "h i"}));
    const Tokenizer tok = Tokenizer::from_schema(ss, "spm");
    CHECK(tok.encode("hi hi", true) == std::vector<int32_t>{1, 7, 7});
    CHECK(tok.decode(std::vector<int32_t>{1, 7, 7}, true) == "hi hi");
}

TEST_CASE("GGUF pre-tokenizers: llama.cpp's GPT-2 pattern splits as the original", "[gguf]") {
    // llama.cpp runs the GPT-2 group (gpt-2, smollm, ...) with tokenizer.json's pattern minus its
    // final `|\s+`; qforge stores the original. Both must cut every fixture text the same way.
    const std::string llama_cpp_gpt2 =
        R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
    for (const bool digits : {false, true}) {
        PretokenizerSpec original, llama_cpp;
        original.byte_level = llama_cpp.byte_level = true;
        original.individual_digits = llama_cpp.individual_digits = digits;
        original.split_regexes = {"gpt-2"};
        llama_cpp.split_regexes = {llama_cpp_gpt2};
        const Pretokenizer a(original), b(llama_cpp);
        std::vector<std::string> texts = {"a\t\tb", "x \n\n y", "\u3000z", " \t ", "end  "};
        for (const auto& ft : load_fixture_texts(std::nullopt)) texts.push_back(ft.text);
        for (const auto& text : texts) {
            INFO("text " << quoted(text));
            std::vector<std::string> wa, wb;
            a.split(text, wa);
            b.split(text, wb);
            CHECK(wa == wb);
        }
    }
}

}  // namespace gguf_convert_test
