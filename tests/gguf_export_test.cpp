// `qforge export --format gguf` is the exact inverse of `convert --keep-quant`: every exportable
// qtype, on the GQA (untied), tied-embedding and qwen2-bias fixture models, converts back to a
// .qf with the same tensors byte for byte; the tokenizer families give the same token ids
// through GGUF metadata; what GGUF cannot hold bit for bit is refused by name, leaving nothing.
#include "convert/gguf_export.hpp"

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "formats/gguf.hpp"
#include "formats/gguf_writer.hpp"
#include "formats/qf.hpp"
#include "sources/gguf_keep_quant.hpp"
#include "test_support.hpp"
#include "tokenizer/gguf_writer.hpp"
#include "tokenizer/source.hpp"
#include "tokenizer/source_gguf.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer_fixtures.hpp"

namespace gguf_export_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

void run_ok(const std::string& args) {
    const auto r = run_qforge(args + " -q");
    INFO(args << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
}

// Every tensor of `b` has `a`'s name, type, shape and bytes, and neither has more.
void check_tensor_identical(const fs::path& a_path, const fs::path& b_path) {
    const QfFile a(a_path.string()), b(b_path.string());
    REQUIRE(a.tensors().size() == b.tensors().size());
    std::vector<uint8_t> sa, sb;
    for (const QfTensorInfo& t : a.tensors()) {
        INFO(t.name);
        const QfTensorInfo& u = b.at(t.name);
        CHECK(qtype_traits(u.qtype).name == qtype_traits(t.qtype).name);
        CHECK(u.shape == t.shape);
        const auto x = a.tensor_bytes(t, sa), y = b.tensor_bytes(u, sb);
        REQUIRE(x.size() == y.size());
        CHECK(std::equal(x.begin(), x.end(), y.begin()));
    }
}

// The fixture model `name` quantized with `recipe`, exported, converted back with --keep-quant.
void check_round_trip(const ScratchDir& dir, const std::string& name, const std::string& recipe) {
    INFO(name << " " << recipe);
    const fs::path model = fixture("hf_models/" + name);
    const fs::path flt = dir / (name + ".qf"), quant = dir / (name + "_q.qf"),
                   gguf = dir / (name + ".gguf"), back = dir / (name + "_back.qf");
    if (!fs::exists(flt)) run_ok("convert " + q(model) + " -o " + q(flt));
    run_ok("quantize " + q(flt) + " -o " + q(quant) + " " + recipe);
    run_ok("export " + q(quant) + " --format gguf -o " + q(gguf));
    run_ok("convert " + q(gguf) + " --keep-quant -o " + q(back));
    check_tensor_identical(quant, back);
}

}  // namespace

TEST_CASE("GGUF export: every exportable type converts back tensor-identical", "[gguf][export]") {
    ScratchDir dir("gguf-export-roundtrip");
    // intermediate 86 is no multiple of 32: the down projections stay float.
    const std::string down = " --tensor-type mlp.down=f16";
    check_round_trip(dir, "llama_gqa_untied", "--qtype q4s_g32" + down);
    check_round_trip(dir, "llama_gqa_untied", "--qtype q8_g32 --tensor-type attn.o=bf16" + down);
    check_round_trip(dir, "qwen2_bias_tied", "--qtype q4s_g32" + down);
    check_round_trip(dir, "qwen2_bias_tied", "--qtype f16");
    check_round_trip(dir, "llama_gqa_untied", "--qtype f32");
}

// A model without a tokenizer carries llama.cpp's own "no vocabulary" marker (its loader reads
// tokenizer.ggml.model = none with <arch>.vocab_size placeholder tokens), and converts back to a
// .qf without one.
TEST_CASE("GGUF export: a model without a tokenizer says tokenizer.ggml.model none",
          "[gguf][export]") {
    ScratchDir dir("gguf-export-no-vocab");
    const fs::path flt = dir / "m.qf", gguf = dir / "m.gguf", back = dir / "back.qf";
    run_ok("convert " + q(fixture("hf_models/llama_gqa_untied")) + " -o " + q(flt));
    const QfFile qf(flt.string());
    REQUIRE_FALSE(qf.has_tokenizer());
    run_ok("export " + q(flt) + " --format gguf -o " + q(gguf));
    const GgufFile g(gguf.string());
    const std::string* model = g.get_string("tokenizer.ggml.model");
    REQUIRE(model);
    CHECK(*model == "none");
    CHECK(g.get_uint("llama.vocab_size") == qf.config().vocab_size);
    CHECK(g.get_string_array("tokenizer.ggml.tokens") == nullptr);
    run_ok("convert " + q(gguf) + " -o " + q(back));
    CHECK_FALSE(QfFile(back.string()).has_tokenizer());
}

// llama.cpp's own mixed-type file with its byte-level BPE tokenizer and chat template: its kept
// conversion (Q8_0/Q4_0 packed, F16/BF16 as stored, the rest f32) exports and converts back with
// the same tensors and the same tokenizer schema.
TEST_CASE("GGUF export: a kept GGUF conversion exports to the same model and tokenizer",
          "[gguf][export]") {
    ScratchDir dir("gguf-export-tiny");
    const fs::path kept = dir / "kept.qf", gguf = dir / "again.gguf", back = dir / "back.qf";
    run_ok("convert " + q(fixture("gguf/tiny_llama.gguf")) + " --keep-quant -o " + q(kept));
    run_ok("export " + q(kept) + " --format gguf -o " + q(gguf));
    run_ok("convert " + q(gguf) + " --keep-quant -o " + q(back));
    check_tensor_identical(kept, back);
    const QfFile a(kept.string()), b(back.string());
    CHECK(b.tokenizer() == a.tokenizer());
    CHECK(b.model() == a.model());
}

TEST_CASE("GGUF export: llama q/k rows are in llama.cpp's adjacent-pair order", "[gguf][export]") {
    ScratchDir dir("gguf-export-rope");
    const fs::path flt = dir / "m.qf", gguf = dir / "m.gguf";
    run_ok("convert " + q(fixture("hf_models/llama_gqa_untied")) + " -o " + q(flt));
    run_ok("export " + q(flt) + " --format gguf -o " + q(gguf));
    const QfFile qf(flt.string());
    const GgufFile g(gguf.string());
    const ModelConfig& c = qf.config();
    CHECK(g.get_string("general.architecture") != nullptr);
    CHECK(*g.get_string("general.architecture") == "llama");
    CHECK(g.get_uint("llama.attention.head_count_kv") == c.num_kv_heads);
    CHECK(g.get_uint("llama.rope.dimension_count") == c.head_dim);
    CHECK_FALSE(g.get_uint("llama.attention.key_length"));  // head_dim * heads == hidden
    // Row 2i + j of each head in the file is row j * head_dim / 2 + i of the Hugging Face layout
    // (convert_hf_to_gguf.py's permute, written out here rather than through the exporter).
    std::vector<uint8_t> scratch;
    const QfTensorInfo& k = qf.at("layers.1.attn.k");
    const auto hf = qf.tensor_bytes(k, scratch);
    const GgufTensorInfo* gk = g.find_tensor("blk.1.attn_k.weight");
    REQUIRE(gk != nullptr);
    REQUIRE(gk->type == GgmlType::f32);
    const auto file = g.tensor_data(*gk);
    const uint64_t row = k.shape[1] * 4, half = c.head_dim / 2;
    for (uint64_t h = 0; h < c.num_kv_heads; ++h)
        for (uint64_t i = 0; i < half; ++i)
            for (uint64_t j = 0; j < 2; ++j) {
                const uint64_t in_file = h * c.head_dim + 2 * i + j,
                               in_hf = h * c.head_dim + j * half + i;
                CHECK(std::equal(file.begin() + static_cast<std::ptrdiff_t>(in_file * row),
                                 file.begin() + static_cast<std::ptrdiff_t>((in_file + 1) * row),
                                 hf.begin() + static_cast<std::ptrdiff_t>(in_hf * row)));
            }
}

TEST_CASE("GGUF export: types without a bit-exact GGUF form are refused by name",
          "[gguf][export]") {
    ScratchDir dir("gguf-export-refused");
    const fs::path flt = dir / "m.qf";
    run_ok("convert " + q(fixture("hf_models/llama_gqa_untied")) + " -o " + q(flt));
    for (const auto& [qtype, nearest] : {std::pair{"q4_g32", "q4s_g32"},
                                         {"q4_g128", "q4s_g32"},
                                         {"q3_g32", "q4s_g32"},
                                         {"q8", "q8_g32"},
                                         {"q4s_g128", "q4s_g32"},
                                         {"q4nl_g32", "q4s_g32"}}) {
        INFO(qtype);
        const fs::path quant = dir / (std::string(qtype) + ".qf"),
                       out = dir / (std::string(qtype) + ".gguf");
        run_ok("quantize " + q(flt) + " -o " + q(quant) + " --qtype " + qtype +
               " --tensor-type mlp.down=f16");
        const auto r = run_qforge("export " + q(quant) + " --format gguf -o " + q(out));
        CHECK(r.exit_code != 0);
        CHECK_THAT(r.output, Catch::Contains(std::string("type ") + qtype) &&
                                 Catch::Contains(std::string("--qtype ") + nearest) &&
                                 Catch::Contains("tensor 'embed'"));
        CHECK_FALSE(fs::exists(out));
    }
    // A Q4_0 row must be whole blocks of 32.
    const fs::path odd = dir / "odd.qf";
    run_ok("quantize " + q(flt) + " -o " + q(odd) + " --qtype q4s_g32");
    const auto r = run_qforge("export " + q(odd) + " --format gguf -o " + q(dir / "odd.gguf"));
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.output, Catch::Contains("mlp.down") && Catch::Contains("blocks of 32"));
    // The output checks of every writing command, before any work.
    for (const auto& [output, message] : {std::pair{q(flt), "is the input"},
                                          {std::string("/dev/null"), "a character device"},
                                          {q(dir / "no" / "m.gguf"), "does not exist"},
                                          {std::string("''"), "output path is empty"}}) {
        const auto refused = run_qforge("export " + q(flt) + " --format gguf -o " + output);
        INFO(refused.output);
        CHECK(refused.exit_code == 1);
        CHECK_THAT(refused.output, Catch::Contains(message));
    }
    // A full disk while writing (ulimit -f: 8 KiB files): the error names the output and
    // nothing is left in its directory.
    const auto before = std::distance(fs::directory_iterator(dir.path()), {});
    const auto full = run_qforge("export " + q(flt) + " --format gguf -o " + q(dir / "full.gguf"),
                                 "ulimit -f 8;");
    INFO(full.output);
    CHECK(full.exit_code == 1);
    CHECK_THAT(full.output, Catch::Contains("full.gguf") && Catch::Contains("File too large"));
    CHECK(std::distance(fs::directory_iterator(dir.path()), {}) == before);
}

TEST_CASE("GGUF export: --json reports the file", "[gguf][export]") {
    ScratchDir dir("gguf-export-json");
    const fs::path flt = dir / "m.qf", quant = dir / "q.qf", out = dir / "m.gguf";
    run_ok("convert " + q(fixture("hf_models/qwen2_bias_tied")) + " -o " + q(flt));
    run_ok("quantize " + q(flt) + " -o " + q(quant) + " --qtype q8_g32 --tensor-type mlp.down=f16");
    const auto r = run_qforge("export " + q(quant) + " --format gguf -o " + q(out) + " --json -q");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
    CHECK(j.at("format") == "gguf");
    CHECK(j.at("file_type") == "MOSTLY_Q8_0");
    CHECK(j.at("bytes") == fs::file_size(out));
    CHECK(j.at("tensors") == GgufFile(out.string()).tensors().size());
}

// What the schema becomes when GGUF cannot say it (gguf_tokenizer_metadata's warnings), built
// here by hand: byte-level models lose their normalizer; a Metaspace pre-tokenizer becomes the
// Prepend + Replace normalizer of SentencePiece's add_space_prefix.
nlohmann::json as_gguf_can_say(nlohmann::json s) {
    const std::string space = "\xe2\x96\x81";
    if (s.at("model") == "bpe_byte_level") s["normalizer"] = nlohmann::json::array();
    if (s.at("model") == "bpe_sentencepiece" && !s.at("metaspace").is_null()) {
        s["normalizer"] = {{{"type", "prepend"}, {"prepend", space}},
                           {{"type", "replace"}, {"pattern", " "}, {"content", space}}};
        s["metaspace"] = nullptr;
    }
    return s;
}

// llama2.c texts GGUF tokenizes otherwise (the warning): special-token strings and U+2581.
bool llama2c_differs(const std::string& text) {
    for (const char* s : {"<s>", "</s>", "<unk>", "\xe2\x96\x81"})
        if (text.find(s) != std::string::npos) return true;
    return false;
}

// Each tokenizer family through tokenizer.ggml.* and back encodes the fixture texts to the same
// ids as the schema it came from (as GGUF can say it), and warns where it changed.
TEST_CASE("GGUF export: tokenizers round-trip to the same token ids", "[gguf][export][tokenizer]") {
    ScratchDir dir("gguf-export-tokenizer");
    std::vector<std::pair<std::string, fs::path>> sources;
    for (const std::string& family : kTokenizerFamilies)
        sources.emplace_back(family, kTokenizerFixtures / family / "tokenizer.json");
    sources.emplace_back("llama2c", fixture("quant_checkpoints/tok512.bin"));
    const auto texts = load_fixture_texts(shared_data_dir());
    for (const auto& [family, path] : sources) {
        INFO(family);
        const nlohmann::json schema = load_tokenizer_source(path.string());
        const fs::path out = dir / (family + ".gguf");
        GgufTokenizerMetadata meta = gguf_tokenizer_metadata(schema, path.string());
        const nlohmann::json expected = as_gguf_can_say(schema);
        const bool lossy = expected != schema || family == "llama2c";
        CHECK(meta.warnings.size() == (lossy ? 1u : 0u));
        {
            GgufWriter w(out.string());
            for (GgufKeyValue& kv : meta.keys) w.add(std::move(kv.key), std::move(kv.value));
            w.finish();
        }
        const nlohmann::json back = tokenizer_schema_from_gguf(GgufFile(out.string()));
        // run.c's pieces hold spaces where SentencePiece's (and GGUF's) hold U+2581.
        if (family != "llama2c") CHECK(back.at("pieces") == schema.at("pieces"));
        CHECK(back.at("bos_id") == schema.at("bos_id"));
        CHECK(back.at("eos_id") == schema.at("eos_id"));
        CHECK(back.at("add_bos") == schema.at("add_bos"));
        CHECK(back.at("chat_template") == schema.at("chat_template"));
        const Tokenizer a = Tokenizer::from_schema(expected, "original"),
                        b = Tokenizer::from_schema(back, "through GGUF");
        size_t compared = 0;
        for (const FixtureText& t : texts) {
            if (family == "llama2c" && llama2c_differs(t.text)) continue;
            INFO(t.name);
            CHECK(b.encode(t.text) == a.encode(t.text));
            ++compared;
        }
        CHECK(compared >= texts.size() / 2);
    }
}

// stories260K (llama2.c vocabulary, hidden_dim 172 kept f16) in plain Q4_0: the converted-back
// model is tensor-identical and its perplexity is the quantized model's, digit for digit.
TEST_CASE("GGUF export: stories260K q4s_g32 round-trips with the same perplexity",
          "[gguf][export][stories]") {
    QF_REQUIRE_SHARED_DATA(data);
    ScratchDir dir("gguf-export-stories");
    const fs::path flt = convert_stories(data, "hf", dir), quant = dir / "q.qf",
                   gguf = dir / "s.gguf", back = dir / "back.qf", text = dir / "text.txt";
    run_ok("quantize " + q(flt) + " -o " + q(quant) +
           " --qtype q4s_g32 --tensor-type mlp.down=f16");
    run_ok("export " + q(quant) + " --format gguf -o " + q(gguf));
    run_ok("convert " + q(gguf) + " --keep-quant -o " + q(back));
    check_tensor_identical(quant, back);
    CHECK(QfFile(back.string()).tokenizer().at("model") == "bpe_sentencepiece");
    write_file(text, tinystories_head(data).substr(0, 4000));
    auto ppl = [&](const fs::path& m) {
        const auto r = run_qforge("ppl " + q(m) + " -f " + q(text) + " --ctx 64 --json -q");
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
        return nlohmann::json::parse(r.output.substr(r.output.find('{'))).at("ppl").get<double>();
    };
    CHECK(ppl(back) == ppl(quant));
}

// A vocabulary with fewer tokens than embedding rows is padded as llama.cpp's converter pads it,
// so llama.cpp (and the reader) find one token per row; the padding never tokenizes.
TEST_CASE("GGUF export: a short vocabulary is padded with unused [PAD] tokens",
          "[gguf][export][tokenizer]") {
    ScratchDir dir("gguf-export-pad");
    const fs::path path = kTokenizerFixtures / "gpt2" / "tokenizer.json";
    const nlohmann::json schema = load_tokenizer_source(path.string());
    const size_t n = schema.at("pieces").size();
    GgufTokenizerMetadata meta = gguf_tokenizer_metadata(schema, path.string(), n + 3);
    REQUIRE(meta.warnings.size() == 1);
    CHECK_THAT(meta.warnings[0], Catch::Contains("padded"));
    const fs::path out = dir / "pad.gguf";
    {
        GgufWriter w(out.string());
        for (GgufKeyValue& kv : meta.keys) w.add(std::move(kv.key), std::move(kv.value));
        w.finish();
    }
    const GgufFile g(out.string());
    const auto* tokens = g.get_string_array("tokenizer.ggml.tokens");
    REQUIRE(tokens != nullptr);
    REQUIRE(tokens->size() == n + 3);
    CHECK((*tokens)[n + 2] == "[PAD" + std::to_string(n + 2) + "]");
    CHECK(g.get_int_array("tokenizer.ggml.token_type")[n] == 5);
    const Tokenizer a = Tokenizer::from_schema(schema, "original"),
                    b = Tokenizer::from_schema(tokenizer_schema_from_gguf(g), "padded");
    for (const FixtureText& t : load_fixture_texts(std::nullopt)) {
        INFO(t.name);
        CHECK(b.encode(t.text) == a.encode(t.text));
    }
}

}  // namespace gguf_export_test
