// GGUF export checked against the independent reader: tests/data/gguf/export_tiny.gguf (written
// by `qforge export --format gguf`) as llama.cpp's Python package `gguf` read it
// (export_tiny.json, scripts/make_gguf_export_fixtures.py): every metadata key with its type and
// value, every tensor's name, ggml type, shape and size as qforge's reader sees them, and the
// package's numpy dequantization of every tensor (hashed as float32, in Hugging Face row order)
// equal bit for bit to qforge's values of the same file converted with --keep-quant. The
// committed file is also what the exporter writes today, byte for byte.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "core/half.hpp"
#include "core/hash.hpp"
#include "formats/architectures.hpp"
#include "formats/gguf.hpp"
#include "formats/gguf_writer.hpp"
#include "formats/qf.hpp"
#include "test_support.hpp"
#include "tokenizer/gguf_writer.hpp"
#include "tokenizer/source.hpp"

namespace gguf_export_reference_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

const fs::path kGgufFixtures = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "gguf";

// The command lines that made export_tiny.gguf (tests/data/gguf/README.md repeats them).
const std::string kRecipe = "--qtype q4s_g32 --tensor-type mlp.down=f16 --tensor-type attn.v=bf16";

void run_ok(const std::string& args) {
    const auto r = run_qforge(args + " -q");
    INFO(args << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
}

// A tensor's values as float32, whatever its stored type.
std::vector<float> values_of(const QfFile& qf, const QfTensorInfo& t) {
    std::vector<uint8_t> scratch;
    const auto bytes = qf.tensor_bytes(t, scratch);
    const uint64_t rows = t.shape[0], k = t.shape.size() == 2 ? t.shape[1] : 1;
    std::vector<float> out(rows * k);
    for (uint64_t i = 0; i < out.size() && qtype_traits(t.qtype).is_float; ++i) {
        uint16_t h;
        switch (t.qtype) {
            case QType::f32:
                std::memcpy(&out[i], bytes.data() + 4 * i, 4);
                break;
            case QType::f16:
                std::memcpy(&h, bytes.data() + 2 * i, 2);
                out[i] = f16_to_f32(h);
                break;
            default:
                std::memcpy(&h, bytes.data() + 2 * i, 2);
                out[i] = bf16_to_f32(h);
                break;
        }
    }
    if (qtype_is_quantized(t.qtype)) {
        const uint64_t row_bytes = *qtype_row_bytes(t.qtype, k);
        for (uint64_t r = 0; r < rows; ++r)
            dequantize_row_ref(t.qtype, bytes.data() + r * row_bytes, k, out.data() + r * k);
    }
    return out;
}

// Our name of a llama.cpp tensor name, through the architecture table.
std::string our_name(Architecture arch, const std::string& gguf_name) {
    for (const TensorRow& row : tensor_rows(arch)) {
        uint64_t layer = 0;
        if (match_tensor_pattern(row.gguf_pattern, gguf_name, &layer))
            return tensor_name_for_layer(row.name_pattern, layer);
    }
    FAIL("no row for " << gguf_name);
    return {};
}

void check_metadata(const GgufFile& g, const nlohmann::json& expected) {
    CHECK(g.metadata().size() == expected.size());
    for (const auto& [key, e] : expected.items()) {
        INFO(key);
        const GgufValue* v = g.find(key);
        REQUIRE(v != nullptr);
        const std::string type = e.at("type");
        if (type == "ARRAY") {
            CHECK(v->size() == e.at("length").get<uint64_t>());
            REQUIRE(e.contains("values"));  // the fixtures' arrays are short enough to list
            const std::string el = e.at("element_type");
            if (el == "STRING") CHECK(v->strings == e.at("values").get<std::vector<std::string>>());
            if (el == "INT32") CHECK(v->ints == e.at("values").get<std::vector<int64_t>>());
            if (el == "FLOAT32") CHECK(v->floats == e.at("values").get<std::vector<double>>());
            CHECK(v->element_type == (el == "STRING"  ? GgufValueType::string
                                      : el == "INT32" ? GgufValueType::int32
                                                      : GgufValueType::float32));
            continue;
        }
        if (type == "STRING") CHECK(*g.get_string(key) == e.at("value").get<std::string>());
        if (type == "UINT32") CHECK(*g.get_uint(key) == e.at("value").get<uint64_t>());
        if (type == "FLOAT32") CHECK(*g.get_float(key) == e.at("value").get<double>());
        if (type == "BOOL") CHECK(*g.get_bool(key) == e.at("value").get<bool>());
        CHECK(v->type == (type == "STRING"    ? GgufValueType::string
                          : type == "UINT32"  ? GgufValueType::uint32
                          : type == "FLOAT32" ? GgufValueType::float32
                                              : GgufValueType::boolean));
    }
}

}  // namespace

TEST_CASE("GGUF export: the gguf package reads the file and dequantizes it to qforge's values",
          "[gguf][export][interop]") {
    const fs::path committed = kGgufFixtures / "export_tiny.gguf";
    const auto expected = nlohmann::json::parse(read_file(kGgufFixtures / "export_tiny.json"));
    ScratchDir dir("gguf-export-reference");

    // The committed file is what the exporter writes now.
    const fs::path flt = dir / "m.qf", quant = dir / "export_tiny.qf",
                   out = dir / "export_tiny.gguf";
    run_ok("convert " + q(fixture("hf_models/llama_gqa_untied")) + " -o " + q(flt));
    run_ok("quantize " + q(flt) + " -o " + q(quant) + " " + kRecipe);
    run_ok("export " + q(quant) + " --format gguf -o " + q(out));
    CHECK(read_file(out) == read_file(committed));

    const GgufFile g(committed.string());
    check_metadata(g, expected.at("metadata"));
    const auto& tensors = expected.at("tensors");
    REQUIRE(g.tensors().size() == tensors.size());
    const fs::path back = dir / "back.qf";
    run_ok("convert " + q(committed) + " --keep-quant -o " + q(back));
    const QfFile qf(back.string());
    for (size_t i = 0; i < tensors.size(); ++i) {
        const GgufTensorInfo& t = g.tensors()[i];
        const auto& e = tensors[i];
        INFO(t.name);
        CHECK(t.name == e.at("name").get<std::string>());
        CHECK(ggml_type_traits(t.type).name == e.at("type").get<std::string>());
        CHECK(t.ne == e.at("ne").get<std::vector<uint64_t>>());
        CHECK(t.bytes == e.at("bytes").get<uint64_t>());
        const std::vector<float> v = values_of(qf, qf.at(our_name(qf.config().arch, t.name)));
        const std::string hash =
            xxh3_64_tag({reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
        CHECK(hash == "xxh3-64:" + e.at("values_xxh3_64").get<std::string>());
        for (size_t j = 0; j < e.at("first").size(); ++j)
            CHECK(double(v[j]) == e.at("first")[j].get<double>());
    }
}

// The llama2.c vocabulary (tests/data/quant_checkpoints/tok512.bin) as tokenizer.ggml.* metadata
// alone, as the package read it: tokens, scores and token types element by element, the special
// ids and flags. The committed file is what the writer makes today; to regenerate both after a
// deliberate change, run this test with QFORGE_UPDATE_GGUF_FIXTURES=1, then the script.
TEST_CASE("GGUF export: the gguf package reads the tokenizer metadata as written",
          "[gguf][export][interop][tokenizer]") {
    const fs::path committed = kGgufFixtures / "export_tok512.gguf";
    ScratchDir dir("gguf-export-reference-tok");
    const fs::path vocab = fixture("quant_checkpoints/tok512.bin"), out = dir / "tok.gguf";
    {
        GgufWriter w(out.string());
        GgufTokenizerMetadata meta =
            gguf_tokenizer_metadata(load_tokenizer_source(vocab.string()), vocab.string());
        for (GgufKeyValue& kv : meta.keys) w.add(std::move(kv.key), std::move(kv.value));
        w.finish();
    }
    if (std::getenv("QFORGE_UPDATE_GGUF_FIXTURES"))
        fs::copy_file(out, committed, fs::copy_options::overwrite_existing);
    CHECK(read_file(out) == read_file(committed));
    const auto expected = nlohmann::json::parse(read_file(kGgufFixtures / "export_tok512.json"));
    const GgufFile g(committed.string());
    check_metadata(g, expected.at("metadata"));
    CHECK(g.tensors().empty());
    CHECK(expected.at("tensors").empty());
}

}  // namespace gguf_export_reference_test
