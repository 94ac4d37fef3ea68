// Tokenizer building blocks (UTF-8 cleaning, the heap BPE merge against its O(n^2) reference,
// added-token matching) and the tokenizer.json catalogue of hostile inputs.
#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.hpp"
#include "test_support.hpp"
#include "tokenizer/added_tokens.hpp"
#include "tokenizer/bpe_merge.hpp"
#include "tokenizer/source.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer/utf8.hpp"

namespace tokenizer_test {

using namespace qforge;
using nlohmann::json;

TEST_CASE("sanitize_utf8 replaces each maximal subpart by one U+FFFD, as Python's errors=replace",
          "[tokenizer]") {
    const std::string r = "\xef\xbf\xbd";
    // Expected values are Python's b"...".decode("utf-8", errors="replace").
    CHECK(sanitize_utf8("plain ascii") == "plain ascii");
    CHECK(sanitize_utf8("caf\xc3\xa9") == "caf\xc3\xa9");
    CHECK(sanitize_utf8("\xff\xfe") == r + r);
    CHECK(sanitize_utf8("\xe2\x82") == r);  // truncated 3-byte sequence: one
    CHECK(sanitize_utf8("\xe2\x82"
                        "a") == r + "a");
    CHECK(sanitize_utf8("\xf0\x9f\x98") == r);          // truncated 4-byte sequence: one
    CHECK(sanitize_utf8("\xed\xa0\x80") == r + r + r);  // surrogate: ED then two continuations
    CHECK(sanitize_utf8("\xc0\xaf") == r + r);          // overlong
    CHECK(sanitize_utf8("\xf4\x90\x80\x80") == r + r + r + r);  // past U+10FFFF
    CHECK(sanitize_utf8("\x80") == r);
    CHECK(sanitize_utf8(std::string("a\0b", 3)) == std::string("a\0b", 3));
}

TEST_CASE("bpe_merge (heap) equals the O(n^2) reference on random words and tables",
          "[tokenizer]") {
    std::mt19937 rng(42);
    for (int trial = 0; trial < 200; ++trial) {
        MergeTable table;
        const int alphabet = 3 + trial % 5;
        int32_t next_id = alphabet;
        // Random merges with repeated priorities, so ties (leftmost wins) are exercised.
        for (int m = 0; m < 30; ++m) {
            const auto l = static_cast<int32_t>(rng() % static_cast<unsigned>(next_id));
            const auto r = static_cast<int32_t>(rng() % static_cast<unsigned>(next_id));
            table.add(l, r, static_cast<double>(rng() % 7), next_id++);
        }
        for (size_t len : {0u, 1u, 2u, 3u, 17u, 64u, 301u}) {
            std::vector<int32_t> word(len);
            for (auto& s : word) s = static_cast<int32_t>(rng() % static_cast<unsigned>(alphabet));
            auto fast = word, slow = word;
            bpe_merge(fast, table);
            bpe_merge_reference(slow, table);
            INFO("trial " << trial << " length " << len);
            REQUIRE(fast == slow);
        }
    }
}

// 2^18 symbols: the heap takes milliseconds (seconds under ASan in Debug); a rescan per merge
// would do ~2^36 pair checks, minutes, so the bound separates the two in any build.
TEST_CASE("bpe_merge is O(n log n) on a one-word text of 256 Ki symbols", "[tokenizer]") {
    MergeTable table;  // a -> aa -> aaaa ... : every level merges the whole word
    for (int32_t k = 0; k < 17; ++k) table.add(k, k, k, k + 1);
    std::vector<int32_t> word(1 << 18, 0);
    const auto t0 = std::chrono::steady_clock::now();
    bpe_merge(word, table);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(word.size() == 2);  // 2^18 symbols -> two of 2^17
    CHECK(s < 10.0);
}

TEST_CASE("added tokens: leftmost-longest match, lstrip and rstrip", "[tokenizer]") {
    AddedTokenMatcher m({{10, "<s>", true},
                         {11, "<s>x", true},
                         {12, "<mask>", true, /*lstrip=*/true, /*rstrip=*/true}});
    std::vector<AddedTokenMatcher::Segment> segs;
    const std::string text = "a<s>xb <s> c  <mask>  d";
    m.split(text, segs);
    std::vector<std::pair<std::string, int32_t>> got;
    for (const auto& s : segs) got.push_back({text.substr(s.begin, s.end - s.begin), s.id});
    const std::vector<std::pair<std::string, int32_t>> want = {
        {"a", -1},  {"<s>x", 11},       {"b ", -1}, {"<s>", 10},
        {" c", -1}, {"  <mask>  ", 12}, {"d", -1}};
    CHECK(got == want);
    segs.clear();
    m.split("", segs);
    CHECK(segs.size() == 1);
}

namespace {

// A tiny SentencePiece-style tokenizer.json (Llama 2's settings), edited per hostile case.
json tiny_sp() {
    json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
    for (int b = 0; b < 256; ++b) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "<0x%02X>", b);
        vocab[hex] = 3 + b;
    }
    int id = 259;
    for (const char* p : {"\xe2\x96\x81", "a", "b",
                          "\xe2\x96\x81"
                          "a",
                          "ab",
                          "\xe2\x96\x81"
                          "ab"})
        vocab[p] = id++;
    return {
        {"model",
         {{"type", "BPE"},
          {"vocab", vocab},
          {"merges",
           {"\xe2\x96\x81 a", "a b",
            "\xe2\x96\x81"
            "a b"}},
          {"unk_token", "<unk>"},
          {"byte_fallback", true},
          {"fuse_unk", true}}},
        {"normalizer",
         {{"type", "Sequence"},
          {"normalizers",
           {{{"type", "Prepend"}, {"prepend", "\xe2\x96\x81"}},
            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xe2\x96\x81"}}}}}},
        {"pre_tokenizer", nullptr},
        {"added_tokens",
         {{{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
          {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}}},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders",
           {{{"type", "Replace"}, {"pattern", {{"String", "\xe2\x96\x81"}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}},
            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
        {"post_processor",
         {{"type", "TemplateProcessing"},
          {"single",
           {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}}};
}

}  // namespace

TEST_CASE("a hand-made SentencePiece tokenizer.json: merges, byte fallback, decode",
          "[tokenizer]") {
    test::ScratchDir dir("tok-sp-tiny");
    test::write_file(dir / "tokenizer.json", tiny_sp().dump());
    const Tokenizer tok = Tokenizer::load((dir / "tokenizer.json").string());
    CHECK(tok.encode("ab ab") == std::vector<int32_t>{1, 264, 264});
    CHECK(tok.encode("ab", false) == std::vector<int32_t>{264});
    CHECK(tok.encode("ba", false) == std::vector<int32_t>{259, 261, 260});  // ▁ b a: no merge
    CHECK(tok.encode("\xc3\xa9", false) ==
          std::vector<int32_t>{259, 3 + 0xc3, 3 + 0xa9});  // é: bytes
    CHECK(tok.encode("a</s>", false) == std::vector<int32_t>{262, 2});
    CHECK(tok.decode(tok.encode("ab \xc3\xa9 a"), true) == "ab \xc3\xa9 a");
    CHECK(tok.decode(std::vector<int32_t>{3 + 0xc3}) == "\xef\xbf\xbd");  // lone byte: U+FFFD
    CHECK(tok.decode_piece(1, 264) == "ab");
    CHECK(tok.decode_piece(264, 264) == " ab");
    CHECK(tok.bos_id() == 1);
    CHECK(tok.add_bos());
}

TEST_CASE("malformed tokenizer.json files fail with one Error naming the file", "[tokenizer]") {
    test::ScratchDir dir("tok-hostile");
    auto expect_error = [&](const std::string& name, const json& j, const std::string& what) {
        const auto path = dir / (name + ".json");
        test::write_file(path, j.dump());
        INFO(name);
        CHECK_THROWS_WITH(load_tokenizer_source(path.string()),
                          Catch::Contains(path.string()) && Catch::Contains(what));
    };
    json j = tiny_sp();
    j.erase("model");
    expect_error("no_model", j, "no \"model\" object");
    j = tiny_sp();
    j["model"]["type"] = "Unigram";
    expect_error("unigram", j, "unsupported tokenizer model type \"Unigram\"");
    j = tiny_sp();
    j["model"]["merges"].push_back("a zz");
    expect_error("merge_absent", j, "absent from the vocabulary");
    j = tiny_sp();
    j["model"]["merges"].push_back("b a");  // "ba" is not a token
    expect_error("merge_result_absent", j, "\"ba\", absent");
    j = tiny_sp();
    j["model"]["vocab"]["zz"] = 100000;
    expect_error("id_range", j, "out of range");
    j = tiny_sp();
    j["model"]["vocab"]["zz"] = 259;
    expect_error("dup_id", j, "is used by both");
    j = tiny_sp();
    j["added_tokens"].push_back({{"id", 265}, {"content", "a"}, {"special", false}});
    expect_error("dup_piece", j, "duplicate piece \"a\"");
    j = tiny_sp();
    j["model"]["vocab"].erase("b");
    j["model"]["merges"] = json::array();
    expect_error("gap", j, "no token has id 261");
    j = tiny_sp();
    j["normalizer"] = {{"type", "Lowercase"}};
    expect_error("normalizer", j, "unsupported normalizer");
    j = tiny_sp();
    j["normalizer"] = "NFC";
    expect_error("normalizer_type", j,
                 "key 'normalizer': expected an object, found string \"NFC\"");
    const auto bad = dir / "bad.json";
    test::write_file(bad, std::string("{\"model\": "));
    CHECK_THROWS_WITH(load_tokenizer_source(bad.string()), Catch::Contains("not valid JSON"));
    j = tiny_sp();
    json schema = load_tokenizer_source(
        (test::write_file(dir / "ok.json", j.dump()), (dir / "ok.json").string()));
    schema["schema_version"] = 1;
    CHECK_THROWS_WITH(Tokenizer::from_schema(schema, "x.qf"), Catch::Contains("reconvert"));
    // A 100 KB piece in a message is cut to its first 60 bytes and its size: one short line.
    j = tiny_sp();
    const std::string huge(100000, 'a');
    j["model"]["merges"].push_back(huge + " zz");
    const auto path = dir / "huge_merge.json";
    test::write_file(path, j.dump());
    try {
        load_tokenizer_source(path.string());
        FAIL("a merge naming an absent piece was accepted");
    } catch (const qforge::Error& e) {
        const std::string what = e.what();
        CHECK_THAT(what, Catch::Contains("... (100000 bytes)") && Catch::Contains("absent"));
        CHECK(what.size() < 2 * path.string().size() + 400);
    }
}

}  // namespace tokenizer_test
