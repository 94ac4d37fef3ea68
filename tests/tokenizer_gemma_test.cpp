// Gemma's tokenizer rules on a vocabulary small enough to commit: tests/data/gguf/
// tiny_gemma_tokenizer.gguf (a "gemma3" GGUF with Gemma's token layout and no tensors) against
// transformers' tokenizer built from it and PyPI `tokenizers` reading the tokenizer.json that
// transformers saved (scripts/make_gemma3_fixtures.py). The rules: whitespace tokens stored with
// real spaces are the "▁" pieces merges build; merges are ranked by position, not score; no
// dummy prefix; control tokens and user-defined ones ("\n" runs, tabs, HTML tags) are matched
// whole; byte fallback. Both of qforge's paths are checked: the GGUF's metadata and the saved
// tokenizer.json (a Split at " " after the normalizer has replaced every space).
#include <catch2/catch.hpp>
#include <filesystem>

#include "formats/gguf.hpp"
#include "test_support.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/source_gguf.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer_fixtures.hpp"

namespace tokenizer_gemma_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

const fs::path kTiny = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "gguf";

void check_cases(const Tokenizer& tok, const nlohmann::json& ref) {
    CHECK(tok.vocab_size() == ref.at("vocab_size").get<size_t>());
    CHECK(tok.bos_id() == 2);
    CHECK(tok.eos_id() == 1);
    CHECK(tok.add_bos());
    auto show = [&](int32_t id) { return quoted(std::string(tok.piece(id))); };
    for (const auto& [name, c] : ref.at("cases").items()) {
        INFO("text " << name);
        const std::string text = c.at("text");
        CHECK(first_difference(tok.encode(text, true), c.at("ids").get<std::vector<int32_t>>(),
                               show) == "");
        const auto plain = tok.encode(text, false);
        CHECK(plain == c.at("ids_no_special").get<std::vector<int32_t>>());
        CHECK(tok.decode(plain, false) == c.at("decoded").get<std::string>());
    }
}

}  // namespace

TEST_CASE("Gemma tokenizer rules: GGUF metadata equals the references", "[tokenizer][gemma]") {
    const auto ref = read_json_file(kTiny / "tiny_gemma_tokenizer.json");
    const fs::path path = kTiny / "tiny_gemma_tokenizer.gguf";
    const GgufFile file(path.string());
    const nlohmann::json schema = tokenizer_schema_from_gguf(file);
    // The merges transformers derived, as many (their order is what the ids check).
    CHECK(schema.at("merges").size() == ref.at("merges").get<size_t>());
    const Tokenizer tok = Tokenizer::from_schema(schema, path.string());
    check_cases(tok, ref);
    // The GGUF carries no chat template: generation stops at EOS only, and with Gemma 3's
    // template given (generate --chat-template) also at the <end_of_turn> it writes.
    CHECK(tok.stop_ids() == std::vector<int32_t>{1});
    const auto bytes =
        read_file(fs::path(QFORGE_SOURCE_DIR) / "scripts" / "chat_templates" / "gemma3.jinja");
    CHECK(chat_stop_ids(tok, std::string(bytes.begin(), bytes.end())) ==
          std::vector<int32_t>{1, 7});
    CHECK(chat_stop_ids(tok, "{{ messages[0]['content'] }}") == std::vector<int32_t>{1});
}

TEST_CASE("Gemma tokenizer rules: the tokenizer.json transformers saves reads the same",
          "[tokenizer][gemma]") {
    const auto ref = read_json_file(kTiny / "tiny_gemma_tokenizer.json");
    ScratchDir dir("gemma-tokenizer-json");
    write_file(dir / "tokenizer.json", ref.at("tokenizer_json").dump());
    write_file(dir / "tokenizer_config.json", ref.at("tokenizer_config_json").dump());
    check_cases(Tokenizer::load((dir / "tokenizer.json").string()), ref);
}

}  // namespace tokenizer_gemma_test
