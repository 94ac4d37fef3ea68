// llama2.c vocabulary (stories260K's tok512.bin): run.c's encode ids exactly, decode round trip,
// the schema it maps to, and the tokenize subcommand.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_support.hpp"
#include "test_support.hpp"
#include "tokenizer/source.hpp"
#include "tokenizer/tokenizer.hpp"

namespace tokenizer_llama2c_test {

using namespace qforge;
using nlohmann::json;

namespace {

std::string slurp(const std::filesystem::path& p, size_t limit = SIZE_MAX) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    return s.substr(0, std::min(limit, s.size()));
}

// The first differing position with a few ids of context on each side, or "" when equal.
std::string first_difference(const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                             const Tokenizer& tok) {
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    if (i == got.size() && i == want.size()) return "";
    std::ostringstream ss;
    ss << "first difference at position " << i << " (got " << got.size() << " ids, want "
       << want.size() << "):";
    auto show = [&](const char* name, const std::vector<int32_t>& v) {
        ss << "\n  " << name << ":";
        for (size_t k = i >= 3 ? i - 3 : 0; k < std::min(v.size(), i + 4); ++k)
            ss << (k == i ? " [" : " ") << v[k] << " " << json(std::string(tok.piece(v[k]))).dump()
               << (k == i ? "]" : "");
    };
    show("got ", got);
    show("want", want);
    return ss.str();
}

}  // namespace

TEST_CASE("llama2c tokenizer reproduces run.c's encode ids for every golden input", "[tokenizer]") {
    QF_REQUIRE_SHARED_DATA(shared);
    const auto dir = shared / "stories260K";
    const Tokenizer tok = Tokenizer::load((dir / "tok512.bin").string());
    const json golden = json::parse(slurp(dir / "reference" / "tokenizer_golden.json"));
    REQUIRE(golden["cases"].size() == 4);
    for (const json& c : golden["cases"]) {
        const std::string source = c["source"];
        std::string text;
        if (c.contains("text_utf8")) {
            text = c["text_utf8"];
        } else {  // "first 2000 bytes of <folder>/<file>"
            const std::string rel = source.substr(source.rfind(' ') + 1);
            text = slurp(shared / rel, c["n_bytes"].get<size_t>());
        }
        REQUIRE(text.size() == c["n_bytes"].get<size_t>());
        const auto want = c["ids_bos_no_eos"].get<std::vector<int32_t>>();
        const auto got = tok.encode(text);
        INFO(source);
        INFO(first_difference(got, want, tok));
        CHECK(got == want);
    }
}

TEST_CASE("llama2c decode(encode(x)) == x on valid UTF-8, and run.c's decode rules",
          "[tokenizer]") {
    QF_REQUIRE_SHARED_DATA(shared);
    const Tokenizer tok = Tokenizer::load((shared / "stories260K" / "tok512.bin").string());
    const std::vector<std::string> texts = {
        "Once upon a time",
        " leading space",
        "Hello  world!\n\nIt\u2019s 3.14 \u00e9t\u00e9 \u4e2d\u6587",
        "tabs\there   end ",
        "emoji \U0001F600 and \u20ac",
        "x",
        "  two",
        "\n"};
    for (const std::string& t : texts) {
        const auto ids = tok.encode(t);
        CHECK(tok.decode(ids, /*skip_special=*/true) == t);
    }
    CHECK(tok.decode(tok.encode(slurp(
                         shared / "tinystories-val-sample" / "tinystories_val_sample.txt", 50000)),
                     true) ==
          slurp(shared / "tinystories-val-sample" / "tinystories_val_sample.txt", 50000));
    CHECK(tok.encode("").size() == 1);  // BOS only: no dummy prefix for empty text
    CHECK(tok.encode("", false).empty());
    CHECK(tok.bos_id() == 1);
    CHECK(tok.eos_id() == 2);
    CHECK(tok.stop_ids() == std::vector<int32_t>{1});  // run.c stops when the model emits BOS
    CHECK(tok.decode_piece(1, 403) == "Once");         // leading space stripped after BOS
    CHECK(tok.decode_piece(403, 407) == " upon");
    CHECK(tok.decode_piece(403, 3 + 0xe4) == "\xe4");  // <0xE4> is the raw byte
    CHECK(tok.is_special(1));
    CHECK_FALSE(tok.is_special(403));
    // Invalid UTF-8 is replaced by U+FFFD (one per maximal subpart) before encoding.
    CHECK(tok.encode("a\xff"
                     "b") == tok.encode("a\xef\xbf\xbd"
                                        "b"));
    CHECK(tok.encode("a\xe4\xb8") == tok.encode("a\xef\xbf\xbd"));
}

TEST_CASE("llama2c vocabulary maps into the normalized schema", "[tokenizer]") {
    QF_REQUIRE_SHARED_DATA(shared);
    const json s = load_tokenizer_source((shared / "stories260K" / "tok512.bin").string());
    CHECK(s["schema_version"] == kTokenizerSchemaVersion);
    CHECK(s["model"] == "llama2c");
    CHECK(s["pieces"].size() == 512);
    CHECK(s["scores"].size() == 512);
    CHECK(s["token_types"][0] == "unknown");
    CHECK(s["token_types"][1] == "special");
    CHECK(s["token_types"][3] == "byte");
    CHECK(s["token_types"][259] == "normal");
    CHECK(s["add_bos"] == true);
    CHECK(s["add_eos"] == false);
    // find_tokenizer: the llama2.c checkpoint's folder, and hf/ one folder below it.
    CHECK(find_tokenizer((shared / "stories260K" / "stories260K.bin").string()).value() ==
          (shared / "stories260K" / "tok512.bin").string());
    CHECK(find_tokenizer((shared / "stories260K" / "hf").string()).value() ==
          (shared / "stories260K" / "tok512.bin").string());
}

TEST_CASE("llama2c vocabulary: hostile files fail with one line naming the file", "[tokenizer]") {
    test::ScratchDir dir("tok-llama2c-bad");
    auto write = [&](const std::string& name,
                     const std::vector<std::pair<float, std::string>>& recs, int32_t max_len = 8) {
        std::string bytes(reinterpret_cast<const char*>(&max_len), 4);
        for (const auto& [score, piece] : recs) {
            const auto len = static_cast<int32_t>(piece.size());
            bytes.append(reinterpret_cast<const char*>(&score), 4)
                .append(reinterpret_cast<const char*>(&len), 4)
                .append(piece);
        }
        test::write_file(dir / name, bytes);
        return (dir / name).string();
    };
    std::vector<std::pair<float, std::string>> ok = {{0, "<unk>"}, {0, "<s>"}, {0, "</s>"}};
    for (int b = 0; b < 256; ++b) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "<0x%02X>", b);
        ok.push_back({0, hex});
    }
    ok.push_back({-1, " "});
    CHECK_NOTHROW(Tokenizer::load(write("ok.bin", ok)));
    auto dup = ok;
    dup.push_back({-2, " "});
    CHECK_THROWS_WITH(Tokenizer::load(write("dup.bin", dup)),
                      Catch::Contains("dup.bin") && Catch::Contains("duplicate piece"));
    CHECK_THROWS_WITH(Tokenizer::load(write("few.bin", {{0, "a"}})),
                      Catch::Contains("at least 259"));
    auto bad = ok;
    bad.push_back({0, "\xff"});
    CHECK_THROWS_WITH(Tokenizer::load(write("utf8.bin", bad)), Catch::Contains("not valid UTF-8"));
    CHECK_THROWS_WITH(Tokenizer::load(write("long.bin", ok, 0)),
                      Catch::Contains("max_token_length"));
}

TEST_CASE("qforge tokenize prints tokens, ids and counts for a llama2.c vocabulary",
          "[tokenizer][cli]") {
    QF_REQUIRE_SHARED_DATA(shared);
    const std::string tok = (shared / "stories260K" / "tok512.bin").string();
    auto r = test::run_qforge("tokenize '" + tok + "' -p 'Once upon a time' --ids");
    CHECK(r.exit_code == 0);
    CHECK(r.output == "1 403 407 261 378\n");
    r = test::run_qforge("tokenize '" + tok + "' -p 'Once upon a time' --count");
    CHECK(r.output == "5\n");
    r = test::run_qforge("tokenize '" + tok + "' -p 'Once upon a time'");
    CHECK_THAT(r.output, Catch::Contains("403  \" Once\""));
    r = test::run_qforge("tokenize '" + tok + "' -p 'Once upon a time' --json");
    CHECK(json::parse(r.output)["ids"] == json::array({1, 403, 407, 261, 378}));
    r = test::run_qforge("tokenize '" + tok + "'");
    CHECK(r.exit_code == 2);  // a usage error
    CHECK_THAT(r.output, Catch::Contains("-p/--prompt TEXT or -f/--file FILE"));
}

}  // namespace tokenizer_llama2c_test
