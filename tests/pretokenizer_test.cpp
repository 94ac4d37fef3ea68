// The regex pre-tokenizer against the reference (PyPI `tokenizers`, fixtures written by
// scripts/make_tokenizer_fixtures.py): words of every fixture text for every family's
// pre_tokenizer and for the extra configurations (each named regex, RoBERTa's prefix space,
// Digits variants, literal and empty-matching splits); the ByteLevel alphabet; the named-pattern
// table; the schema JSON; and a catalogue of malformed pre_tokenizer objects.
#include "tokenizer/pretokenizer.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <set>

#include "core/error.hpp"
#include "tokenizer_fixtures.hpp"

namespace pretokenizer_test {

using namespace qforge;
using namespace qforge::test;
using nlohmann::json;

namespace {

std::vector<std::string> split_words(const Pretokenizer& p, const std::string& text) {
    std::vector<std::string> words;
    p.split(text, words);
    return words;
}

// Checks the words of every text against `expected` (text name -> words); returns how many
// texts were compared.
size_t check_words(const std::string& config, const json& pre_tokenizer, const json& expected,
                   const std::vector<FixtureText>& texts) {
    const PretokenizerSpec spec = pretokenizer_spec_from_hf(pre_tokenizer, config);
    CHECK(pretokenizer_spec_from_json(pretokenizer_spec_to_json(spec), config) == spec);
    const Pretokenizer p(spec);
    size_t compared = 0;
    for (const auto& t : texts) {
        const auto want = expected.at(t.name).get<std::vector<std::string>>();
        const auto got = split_words(p, t.text);
        INFO(config << ", text '" << t.name << "': " << first_difference(got, want, quoted));
        CHECK(got == want);
        ++compared;
    }
    return compared;
}

void check_all_configs(const std::vector<FixtureText>& texts) {
    size_t compared = 0;
    for (const auto& family : kTokenizerFamilies) {
        const json expected = read_json_file(kTokenizerFixtures / family / "expected.json");
        if (!expected.at("cases").at(0).contains("words")) continue;  // no regex pre-tokenizer
        json by_text = json::object();
        for (const auto& c : expected.at("cases"))
            by_text[c.at("name").get<std::string>()] = c.at("words");
        compared += check_words(family, expected.at("pre_tokenizer"), by_text, texts);
    }
    const json configs = read_json_file(kTokenizerFixtures / "pretokenizer_expected.json");
    for (const auto& [name, cfg] : configs.items()) {
        compared += check_words(name, cfg.at("pre_tokenizer"), cfg.at("words"), texts);
    }
    CHECK(compared >= texts.size() * 20);  // every family and configuration ran
}

}  // namespace

TEST_CASE("pre-tokenizer words equal the reference on the inline fixture texts", "[pretokenizer]") {
    check_all_configs(load_fixture_texts(std::nullopt));
}

TEST_CASE("pre-tokenizer words equal the reference on the English prose excerpts",
          "[pretokenizer]") {
    QF_REQUIRE_SHARED_DATA(shared);
    auto texts = load_fixture_texts(shared);
    std::erase_if(texts, [](const FixtureText& t) { return !t.from_shared; });
    REQUIRE(texts.size() == 4);
    check_all_configs(texts);
}

TEST_CASE("named regexes match the reference's patterns and round trip", "[pretokenizer]") {
    const json configs = read_json_file(kTokenizerFixtures / "pretokenizer_expected.json");
    std::set<std::string> fixture_names;
    for (const auto& [name, cfg] : configs.items()) {
        if (!cfg.contains("pattern_name")) continue;
        const auto pattern = cfg.at("pattern").get<std::string>();
        const auto pattern_name = cfg.at("pattern_name").get<std::string>();
        INFO(name);
        CHECK(pretokenizer_regex_name(pattern) == pattern_name);
        CHECK(pretokenizer_regex_by_name(pattern_name) == pattern);
        // A Split with a known pattern is stored by name.
        const auto spec = pretokenizer_spec_from_hf(cfg.at("pre_tokenizer"), name);
        CHECK(spec.split_regexes == std::vector<std::string>{pattern_name});
        fixture_names.insert(pattern_name);
    }
    for (const auto& name : pretokenizer_regex_names()) {
        INFO(name);
        CHECK(fixture_names.count(name) == 1);  // every table entry is checked by the reference
        const auto pattern = pretokenizer_regex_by_name(name);
        REQUIRE(pattern);
        CHECK(pretokenizer_regex_name(*pattern) == name);
    }
    CHECK(pretokenizer_regex_by_name("gpt2") == pretokenizer_regex_by_name("gpt-2"));
    CHECK(pretokenizer_regex_by_name("llama3") == pretokenizer_regex_by_name("llama-bpe"));
    CHECK_FALSE(pretokenizer_regex_by_name("no-such-family"));
    CHECK_FALSE(pretokenizer_regex_name("\\s+"));

    // A custom pattern that spells a name is wrapped so that it is not taken for that name.
    const json literal_name = {{"type", "Split"},
                               {"pattern", {{"Regex", "qwen2"}}},
                               {"behavior", "Isolated"},
                               {"invert", false}};
    const auto spec = pretokenizer_spec_from_hf(literal_name, "t.json");
    CHECK(spec.split_regexes == std::vector<std::string>{"(?:qwen2)"});
    CHECK(split_words(Pretokenizer(spec), "aqwen2b") ==
          std::vector<std::string>{"a", "qwen2", "b"});

    // llama.cpp's tokenizer.ggml.pre names.
    const auto smollm = pretokenizer_spec_for_gguf_pre("smollm");
    REQUIRE(smollm);
    CHECK(smollm->individual_digits);
    CHECK(smollm->byte_level);
    CHECK(smollm->split_regexes == std::vector<std::string>{"gpt-2"});
    CHECK(pretokenizer_spec_for_gguf_pre("llama-bpe")->split_regexes ==
          std::vector<std::string>{"llama-bpe"});
    CHECK(pretokenizer_spec_for_gguf_pre("qwen2")->split_regexes ==
          std::vector<std::string>{"qwen2"});
    CHECK_FALSE(pretokenizer_spec_for_gguf_pre("deepseek-llm"));
}

TEST_CASE("byte-level mapping equals the reference alphabet and round trips", "[pretokenizer]") {
    const json fixture = read_json_file(kTokenizerFixtures / "byte_level_alphabet.json");
    const auto alphabet = fixture.at("alphabet").get<std::set<std::string>>();
    REQUIRE(alphabet.size() == 256);
    // The trained GPT-2-style vocabulary holds the whole alphabet (initial_alphabet).
    const json vocab =
        read_json_file(kTokenizerFixtures / "gpt2" / "tokenizer.json").at("model").at("vocab");

    std::set<std::string> mapped;
    std::string all_bytes;
    for (int b = 0; b < 256; ++b) {
        const std::string byte(1, static_cast<char>(b));
        const std::string ch = byte_level_encode(byte);
        INFO("byte " << b);
        const auto& want = fixture.at("byte_to_char").at(std::to_string(b));
        if (!want.is_null()) CHECK(ch == want.get<std::string>());
        CHECK(alphabet.count(ch) == 1);
        CHECK(vocab.contains(ch));
        CHECK(byte_level_decode(ch) == byte);
        mapped.insert(ch);
        all_bytes += byte;
    }
    CHECK(mapped == alphabet);                    // a bijection onto the reference alphabet
    CHECK(byte_level_encode(" ") == "\xC4\xA0");  // 'Ġ'
    CHECK(byte_level_decode(byte_level_encode(all_bytes)) == all_bytes);
    CHECK(byte_level_encode("") == "");

    CHECK_THROWS_AS(byte_level_decode("\xC5\x84"), Error);      // U+0144: past the alphabet
    CHECK_THROWS_AS(byte_level_decode("\xE4\xB8\xAD"), Error);  // a CJK character
    CHECK_THROWS_AS(byte_level_decode("\xC4"), Error);          // truncated
    CHECK_THROWS_AS(byte_level_decode("\xC1\xA1"), Error);      // overlong 'a'
    CHECK_THROWS_AS(byte_level_decode(" "), Error);             // space is 'Ġ' in the alphabet
}

TEST_CASE("pre-tokenizer spec: null, JSON round trip and Digits placement", "[pretokenizer]") {
    const auto none = pretokenizer_spec_from_hf(json(nullptr), "t.json");
    CHECK(none == PretokenizerSpec{});
    CHECK(split_words(Pretokenizer(none), "a b  c") == std::vector<std::string>{"a b  c"});
    CHECK(split_words(Pretokenizer(none), "").empty());

    const json smollm = {{"type", "Sequence"},
                         {"pretokenizers",
                          {{{"type", "Digits"}, {"individual_digits", true}},
                           {{"type", "ByteLevel"},
                            {"add_prefix_space", false},
                            {"trim_offsets", true},
                            {"use_regex", true}}}}};
    const auto spec = pretokenizer_spec_from_hf(smollm, "t.json");
    CHECK(spec.individual_digits);
    CHECK(spec.byte_level);
    CHECK_FALSE(spec.add_prefix_space);
    CHECK(spec.split_regexes == std::vector<std::string>{"gpt-2"});
    const json j = pretokenizer_spec_to_json(spec);
    CHECK(j.at("split_regexes") == json::array({"gpt-2"}));
    CHECK(pretokenizer_spec_from_json(j, "x.qf") == spec);

    // ByteLevel's use_regex defaults to true, as in HF.
    const json bare = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}};
    CHECK(pretokenizer_spec_from_hf(bare, "t.json").split_regexes ==
          std::vector<std::string>{"gpt-2"});

    // Move leaves a usable object behind in the destination.
    Pretokenizer a(spec);
    Pretokenizer b = std::move(a);
    CHECK(split_words(b, "x12") == std::vector<std::string>{"x", "1", "2"});
}

TEST_CASE("malformed pre_tokenizer JSON is an error naming the file and the problem",
          "[pretokenizer]") {
    const json byte_level = {
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};
    const json split = {{"type", "Split"},
                        {"pattern", {{"Regex", "\\s+"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
    auto with = [](json j, const std::string& key, json value) {
        if (value.is_null())
            j.erase(key);
        else
            j[key] = std::move(value);
        return j;
    };
    auto seq = [](std::vector<json> steps) {
        return json{{"type", "Sequence"}, {"pretokenizers", steps}};
    };
    const std::vector<std::pair<json, std::string>> cases = {
        {{{"type", "Whitespace"}}, "'Whitespace' is not supported"},
        {{{"type", "BertPreTokenizer"}}, "'BertPreTokenizer' is not supported"},
        {{{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}}, "SentencePiece"},
        {json::array(), "expected an object"},
        {{{"pattern", "x"}}, "expected an object with a string 'type'"},
        {with(split, "behavior", "Removed"), "behavior \"Removed\" is not supported"},
        {with(split, "behavior", "Contiguous"), "behavior \"Contiguous\""},
        {with(split, "invert", true), "invert = true"},
        {with(split, "invert", nullptr), "missing field 'invert'"},
        {with(split, "pattern", nullptr), "missing field 'pattern'"},
        {with(split, "pattern", {{"Regex", "(unclosed"}}), "regex /(unclosed/"},
        {with(split, "pattern", {{"Glob", "*"}}), "must be {\"Regex\""},
        {with(byte_level, "add_prefix_space", nullptr), "missing field 'add_prefix_space'"},
        {with(byte_level, "use_regex", "yes"), "'use_regex' must be a boolean"},
        {{{"type", "Digits"}}, "missing field 'individual_digits'"},
        {{{"type", "Sequence"}}, "missing field 'pretokenizers'"},
        {{{"type", "Sequence"}, {"pretokenizers", 3}}, "must be an array"},
        {seq({byte_level, split}), "a Split step after ByteLevel"},
        {seq({split, with(byte_level, "add_prefix_space", true)}), "add_prefix_space = true after"},
    };
    for (const auto& [pre, expect] : cases) {
        INFO(pre.dump());
        try {
            pretokenizer_spec_from_hf(pre, "models/x/tokenizer.json");
            FAIL("no error");
        } catch (const Error& e) {
            CHECK(e.file() == "models/x/tokenizer.json");
            CHECK_THAT(e.what(), Catch::Contains(expect));
        }
    }

    const json good = pretokenizer_spec_to_json(PretokenizerSpec{{"gpt-2"}, false, true, false});
    const std::vector<std::pair<json, std::string>> schema_cases = {
        {json::array(), "expected an object"},
        {with(good, "extra", 1), "unknown key 'extra'"},
        {with(good, "byte_level", 1), "'byte_level' must be a boolean"},
        {with(good, "individual_digits", nullptr), "'individual_digits' must be a boolean"},
        {with(good, "split_regexes", "gpt-2"), "'split_regexes' must be an array"},
        {with(good, "split_regexes", {""}), "non-empty strings"},
        {with(good, "split_regexes", {"[a-"}), "regex /[a-/"},
        {with(with(good, "byte_level", false), "add_prefix_space", true),
         "add_prefix_space needs byte_level"},
    };
    for (const auto& [j, expect] : schema_cases) {
        INFO(j.dump());
        try {
            pretokenizer_spec_from_json(j, "m.qf");
            FAIL("no error");
        } catch (const Error& e) {
            CHECK(e.file() == "m.qf");
            CHECK_THAT(e.what(), Catch::Contains(expect));
        }
    }
}

// Throughput of the split alone on the Brown corpus; hidden (run with "[bench]").
TEST_CASE("pre-tokenizer throughput on the Brown corpus", "[.][bench]") {
    QF_REQUIRE_SHARED_DATA(shared);
    const auto bytes = read_file(shared / "brown-corpus" / "brown.txt");
    const std::string text(bytes.begin(), bytes.end());
    for (const char* family : {"gpt2", "llama3", "qwen2", "smollm2"}) {
        const json pre =
            read_json_file(kTokenizerFixtures / family / "expected.json").at("pre_tokenizer");
        const Pretokenizer p(pretokenizer_spec_from_hf(pre, family));
        std::vector<std::string> words;
        const auto t0 = std::chrono::steady_clock::now();
        p.split(text, words);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("%-8s %8zu words  %6.1f MB/s\n", family, words.size(),
                    static_cast<double>(text.size()) / s / 1e6);
    }
}

}  // namespace pretokenizer_test
