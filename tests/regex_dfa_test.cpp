// runtime/regex_dfa.hpp against Python's re (tests/data/regex/fullmatch.json, written by
// scripts/make_regex_fixtures.py): every fixture text is taken whole exactly when
// re.fullmatch(pattern, text, re.ASCII) takes it, and no prefix of a taken text is a dead end;
// patterns re refuses are refused, and so are those a finite automaton cannot follow. Random
// walks over the bytes a DFA allows never reach a dead end. The token layer
// (runtime/token_constraint.hpp) over real vocabularies: the mask is each token tried alone,
// and constrained random token walks end in whole matches.
#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "runtime/regex_dfa.hpp"
#include "runtime/token_constraint.hpp"
#include "test_support.hpp"
#include "tokenizer/tokenizer.hpp"

namespace regex_dfa_test {

using namespace qforge;

namespace {

nlohmann::json fixtures() {
    std::ifstream in(test::fixture("regex/fullmatch.json"));
    return nlohmann::json::parse(in);
}

// A random walk from the start over the bytes the DFA allows, `len` bytes or until it is
// finished; every state on the way can still reach a match (else the walk would be stuck).
std::string walk(const RegexDfa& d, std::mt19937& rng, size_t len) {
    uint32_t s = d.start();
    std::string text;
    while (text.size() < len && !d.finished(s)) {
        std::vector<uint8_t> ok;
        for (int b = 0; b < 256; ++b)
            if (d.next(s, static_cast<uint8_t>(b)) != RegexDfa::kDead)
                ok.push_back(static_cast<uint8_t>(b));
        INFO(text);
        if (ok.empty()) break;
        const uint8_t b = ok[rng() % ok.size()];
        s = d.next(s, b);
        text += static_cast<char>(b);
    }
    return text;
}

}  // namespace

TEST_CASE("regex: whole matches are Python re.fullmatch's (re.ASCII) on its fixtures", "[regex]") {
    const nlohmann::json f = fixtures();
    size_t taken = 0, refused = 0;
    for (const auto& entry : f["patterns"]) {
        const std::string pattern = entry["pattern"];
        INFO("pattern " << pattern);
        const RegexDfa d = RegexDfa::compile(pattern, "pattern");
        for (const auto& c : entry["cases"]) {
            const std::string text = c[0];
            const bool expected = c[1];
            INFO("text '" << text << "' re takes it: " << expected);
            CHECK(d.matches(text) == expected);
            if (!expected) {
                ++refused;
                continue;
            }
            ++taken;
            uint32_t s = d.start();  // no prefix of a match is a dead end
            for (char ch : text) {
                s = d.next(s, static_cast<uint8_t>(ch));
                REQUIRE(s != RegexDfa::kDead);
            }
        }
    }
    CHECK(taken > 300);  // the fixtures hold both kinds in numbers
    CHECK(refused > 1500);
}

TEST_CASE("regex: patterns re refuses, and those an automaton cannot follow, are errors",
          "[regex]") {
    const nlohmann::json f = fixtures();
    for (const auto& p : f["python_refuses"]) {
        INFO("pattern " << p.get<std::string>());
        CHECK_THROWS_AS(RegexDfa::compile(p.get<std::string>(), "guided_regex"), Error);
        CHECK_THROWS_WITH(RegexDfa::compile(p.get<std::string>(), "guided_regex"),
                          Catch::StartsWith("guided_regex: "));
    }
    for (const auto& r : f["refused"]) {
        INFO("pattern " << r["pattern"].get<std::string>());
        CHECK_THROWS_WITH(
            RegexDfa::compile(r["pattern"].get<std::string>(), "guided_regex"),
            Catch::StartsWith("guided_regex: ") && Catch::Contains(r["error"].get<std::string>()));
    }
    // Bounds: the pattern's length, the automata's sizes (a request never stalls the server).
    CHECK_THROWS_WITH(RegexDfa::compile(std::string(RegexDfa::kMaxPatternBytes + 1, 'a'), "r"),
                      Catch::Contains("longer than"));
    CHECK_THROWS_WITH(RegexDfa::compile("((((a{1000}){1000}){1000}){1000})", "r"),
                      Catch::Contains("too large"));
    CHECK_THROWS_WITH(RegexDfa::compile("[ab]*a[ab]{20}", "r"), Catch::Contains("too complex"));
    CHECK_THROWS_WITH(RegexDfa::compile(std::string(RegexDfa::kMaxGroupDepth + 1, '(') + "a" +
                                            std::string(RegexDfa::kMaxGroupDepth + 1, ')'),
                                        "r"),
                      Catch::Contains("nest deeper"));
    CHECK_THROWS_WITH(RegexDfa::compile("a\xff", "r"), Catch::Contains("not valid UTF-8"));
    CHECK_NOTHROW(RegexDfa::compile(std::string(RegexDfa::kMaxGroupDepth, '(') + "a" +
                                        std::string(RegexDfa::kMaxGroupDepth, ')'),
                                    "r"));
}

TEST_CASE("regex: random walks over allowed bytes never dead-end, and finish as matches",
          "[regex]") {
    const nlohmann::json f = fixtures();
    std::mt19937 rng(7);
    for (const auto& entry : f["patterns"]) {
        const std::string pattern = entry["pattern"];
        INFO("pattern " << pattern);
        const RegexDfa d = RegexDfa::compile(pattern, "pattern");
        for (int i = 0; i < 20; ++i) {
            const std::string text = walk(d, rng, rng() % 24);
            INFO("walk '" << text << "'");
            const uint32_t s = d.walk(d.start(), text);
            REQUIRE(s != RegexDfa::kDead);
            if (d.finished(s)) CHECK(d.accepting(s));
        }
    }
}

TEST_CASE("regex: a choice takes exactly its texts", "[regex]") {
    const std::vector<std::string> texts = {"positive", "negative", "neutral", "pos", "", "😀é"};
    const RegexDfa d = RegexDfa::choice(texts, "guided_choice");
    for (const std::string& t : texts) {
        INFO(t);
        CHECK(d.matches(t));
    }
    for (const char* t : {"posit", "positives", "neg", "Positive", "😀", "é"}) {
        INFO(t);
        CHECK(!d.matches(t));
    }
    CHECK(d.finished(d.walk(d.start(), "negative")));
    CHECK(!d.finished(d.walk(d.start(), "pos")));  // "positive" may follow
    CHECK(d.walk(d.start(), "x") == RegexDfa::kDead);
    // Characters that are syntax in a pattern are themselves in a choice.
    CHECK(RegexDfa::choice({"a.b", "(c)*"}, "c").matches("(c)*"));
    CHECK(!RegexDfa::choice({"a.b"}, "c").matches("axb"));
    CHECK_THROWS_WITH(RegexDfa::choice({}, "guided_choice"), Catch::Contains("at least one"));
    CHECK_THROWS_WITH(RegexDfa::choice({"ok", "\xc3"}, "guided_choice"),
                      Catch::Contains("guided_choice[1]: is not valid UTF-8"));
}

TEST_CASE("token constraint: a pattern's mask is each token tried alone, and walks end in matches",
          "[regex]") {
    std::mt19937 rng(29);
    for (const char* path :
         {"tokenizers/smollm2/tokenizer.json", "tokenizers/llama2/tokenizer.json"}) {
        INFO(path);
        const Tokenizer tok = Tokenizer::load(test::fixture(path).string());
        const auto texts = std::make_shared<const TokenTexts>(tok);
        const std::vector<int32_t> stops = tok.stop_ids();  // (returned by value)
        for (const std::string pattern :
             {"\\d{3}-\\d{4}", "(yes|no|maybe)", "[A-Z][a-z]+( [a-z]+){0,3}\\.",
              "\\{\"name\": \"\\w+\", \"age\": \\d{1,3}\\}", "[^\\n]{0,40}"}) {
            INFO("pattern " << pattern);
            const RegexDfa dfa = RegexDfa::compile(pattern, "pattern");
            const auto grammar =
                std::make_shared<const TokenGrammar>(TokenGrammar{dfa, texts, stops});
            for (int run = 0; run < 3; ++run) {
                TokenMatcher m(grammar);
                std::vector<float> logits(tok.vocab_size());
                std::string text;
                for (int step = 0; step < 64; ++step) {
                    std::fill(logits.begin(), logits.end(), 0.0f);
                    const size_t count = m.mask(logits);
                    std::vector<int32_t> allowed;
                    for (size_t i = 0; i < logits.size(); ++i) {
                        const bool alone = m.allows(static_cast<int32_t>(i));
                        INFO("id " << i << " text " << texts->text[i]);
                        REQUIRE((logits[i] == 0.0f) == alone);
                        if (alone) allowed.push_back(static_cast<int32_t>(i));
                    }
                    REQUIRE(count == allowed.size());
                    REQUIRE(!allowed.empty());  // never stuck
                    const int32_t id = allowed[rng() % allowed.size()];
                    const bool stop = std::find(stops.begin(), stops.end(), id) != stops.end();
                    if (stop) break;
                    m.accept(id);
                    text += texts->text[static_cast<size_t>(id)];
                    if (m.finished()) break;
                }
                INFO("text '" << text << "'");
                if (m.complete()) CHECK(dfa.matches(text));
                CHECK(dfa.walk(dfa.start(), text) != RegexDfa::kDead);
            }
        }
    }
}

}  // namespace regex_dfa_test
