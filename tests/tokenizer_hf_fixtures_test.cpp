// Tokenizer::load(tokenizer.json) against the reference (PyPI `tokenizers`; fixtures written by
// scripts/make_tokenizer_fixtures.py): for every family and fixture text, the ids with and without
// special tokens are identical, invalid UTF-8 gives the ids of its U+FFFD replacement, and
// decode(encode(text)) == text wherever the reference itself round trips.
#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer_fixtures.hpp"

namespace tokenizer_hf_fixtures_test {

using namespace qforge;
using namespace qforge::test;
using nlohmann::json;

namespace {

void check_family(const std::string& family, const std::vector<FixtureText>& texts) {
    const auto dir = kTokenizerFixtures / family;
    const Tokenizer tok = Tokenizer::load((dir / "tokenizer.json").string());
    const json expected = read_json_file(dir / "expected.json");
    CHECK(tok.vocab_size() == expected.at("vocab_size").get<size_t>());
    json by_text = json::object();
    for (const auto& c : expected.at("cases")) by_text[c.at("name").get<std::string>()] = c;

    // An id shown with its piece, so that a failure reads as text.
    auto show = [&](int32_t id) {
        if (id < 0 || static_cast<size_t>(id) >= tok.vocab_size())
            return std::to_string(id) + "(?)";
        return std::to_string(id) + "=" + quoted(std::string(tok.piece(id)));
    };
    for (const auto& t : texts) {
        const json& c = by_text.at(t.name);
        const auto want = c.at("ids").get<std::vector<int32_t>>();
        const auto want_plain = c.at("ids_no_special").get<std::vector<int32_t>>();
        const auto got = tok.encode(t.text, true);
        const auto got_plain = tok.encode(t.text, false);
        INFO(family << ", text '" << t.name << "'");
        {
            INFO("add_special = true: " << first_difference(got, want, show));
            CHECK(got == want);
        }
        {
            INFO("add_special = false: " << first_difference(got_plain, want_plain, show));
            CHECK(got_plain == want_plain);
        }
        if (t.raw) {
            const auto got_raw = tok.encode(*t.raw, true);
            INFO("invalid UTF-8 bytes: " << first_difference(got_raw, want, show));
            CHECK(got_raw == want);
        }
        if (c.at("roundtrip").get<bool>()) {
            const std::string back = tok.decode(got_plain, false);
            INFO("decode(encode(x)): " << quoted(back) << " vs " << quoted(t.text));
            CHECK(back == t.text);
        }
    }
}

}  // namespace

TEST_CASE("HF tokenizers: ids equal the reference on the inline fixture texts", "[tokenizer][hf]") {
    const auto texts = load_fixture_texts(std::nullopt);
    REQUIRE(texts.size() > 20);
    for (const auto& family : kTokenizerFamilies) {
        INFO(family);
        check_family(family, texts);
    }
}

TEST_CASE("HF tokenizers: ids equal the reference on the English prose excerpts",
          "[tokenizer][hf]") {
    QF_REQUIRE_SHARED_DATA(shared);
    auto texts = load_fixture_texts(shared);
    std::erase_if(texts, [](const FixtureText& t) { return !t.from_shared; });
    REQUIRE(texts.size() == 4);
    for (const auto& family : kTokenizerFamilies) {
        INFO(family);
        check_family(family, texts);
    }
}

// Qwen3 (tests/data/tokenizers/qwen3, scripts/make_qwen3_tokenizer_fixture.py): its 26 added
// tokens, 14 special and 12 not (<think>, <tool_call>, the FIM markers), in chat, tool and FIM
// texts; decoding with skip_special drops only the special ones, as the reference does.
TEST_CASE("HF tokenizers: Qwen3's added tokens and configuration", "[tokenizer][hf][qwen3]") {
    const auto dir = kTokenizerFixtures / "qwen3";
    const Tokenizer tok = Tokenizer::load((dir / "tokenizer.json").string());
    const json expected = read_json_file(dir / "expected.json");
    CHECK_FALSE(tok.bos_id());
    CHECK_FALSE(tok.add_bos());
    REQUIRE(tok.eos_id());
    CHECK(tok.piece(*tok.eos_id()) == "<|im_end|>");
    CHECK(tok.stop_ids() == std::vector<int32_t>{*tok.eos_id()});
    CHECK(tok.chat_template().find("enable_thinking") != std::string::npos);
    int special = 0, plain = 0;
    for (int32_t id = 3000; id < static_cast<int32_t>(tok.vocab_size()); ++id)
        (tok.is_special(id) ? special : plain) += 1;
    CHECK(special == 14);
    CHECK(plain == 12);
    auto show = [&](int32_t id) { return std::to_string(id); };
    for (const auto& c : expected.at("extra")) {
        const std::string text = c.at("text");
        INFO("text " << c.at("name").get<std::string>());
        const auto ids = tok.encode(text, false);
        CHECK(first_difference(ids, c.at("ids_no_special").get<std::vector<int32_t>>(), show) ==
              "");
        CHECK(tok.encode(text, true) == c.at("ids").get<std::vector<int32_t>>());
        CHECK(tok.decode(ids, true) == c.at("decoded_skip_special").get<std::string>());
        CHECK(tok.decode(ids, false) == text);
    }
}

}  // namespace tokenizer_hf_fixtures_test
