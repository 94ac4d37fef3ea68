// Streamed text (serve/text_stream.hpp): stop strings split across tokens are never sent, and a
// character split across byte tokens is sent whole.
#include <catch2/catch.hpp>
#include <random>

#include "serve/text_stream.hpp"

namespace serve_text_stream_test {

using qforge::serve::TextStream;
using qforge::serve::utf8_complete_prefix;

TEST_CASE("text stream: stop strings across pieces, UTF-8 held until whole", "[serve]") {
    TextStream t({"END", "xy"});
    std::string out = t.add("hello E");
    out += t.add("N");
    CHECK(out == "hello ");  // "EN" might start "END": held
    out += t.add("D and more");
    CHECK(t.stopped());
    CHECK(out == "hello ");
    CHECK(t.add("later").empty());

    TextStream u({});
    const std::string euro = "\xE2\x82\xAC";  // U+20AC in three bytes
    CHECK(u.add("a" + euro.substr(0, 1)) == "a");
    CHECK(u.add(euro.substr(1, 1)).empty());
    CHECK(u.add(euro.substr(2, 1)) == euro);
    CHECK(u.add("b\xE2").empty() == false);  // "b" goes, the lead byte waits
    CHECK(u.finish() == "\xE2");

    CHECK(utf8_complete_prefix("ab") == 2);
    CHECK(utf8_complete_prefix("a\xC3") == 1);
    CHECK(utf8_complete_prefix("a\xC3\xA9") == 3);
    CHECK(utf8_complete_prefix("\xF0\x9F\x98") == 0);
    CHECK(utf8_complete_prefix("\x80") == 1);  // malformed: counted whole (replaced as JSON)

    TextStream early({"ab"});
    CHECK(early.add("xa") == "x");
    CHECK(early.add("c") == "ac");  // "a" was held only while it could start "ab"
    CHECK(early.add("a") == "");
    CHECK(early.finish() == "a");
}

// The held-back tail against the definition, tried length by length: the longest tail of the
// text so far that starts some stop string; on random texts and stop strings over two letters
// (where tails and starts overlap most).
TEST_CASE("text stream: the held-back tail is the longest start of a stop string", "[serve]") {
    std::mt19937 rng(7);
    auto word = [&](size_t n) {
        std::string w;
        for (size_t i = 0; i < n; ++i) w += "ab"[rng() % 2];
        return w;
    };
    for (int trial = 0; trial < 300; ++trial) {
        std::vector<std::string> stops;
        for (size_t i = 0, n = 1 + rng() % 3; i < n; ++i) stops.push_back(word(2 + rng() % 7));
        TextStream t(stops);
        std::string text, sent;
        while (!t.stopped() && text.size() < 40) {
            const std::string piece = word(1 + rng() % 3);
            text += piece;
            sent += t.add(piece);
            if (t.stopped()) break;
            size_t keep = 0;
            for (const auto& s : stops)
                for (size_t k = std::min(text.size(), s.size() - 1); k > keep; --k)
                    if (text.compare(text.size() - k, k, s, 0, k) == 0) {
                        keep = k;
                        break;
                    }
            INFO("stops " << stops[0] << " text " << text);
            CHECK(sent == text.substr(0, text.size() - keep));
        }
        if (t.stopped()) {
            size_t first = std::string::npos;
            for (const auto& s : stops) first = std::min(first, text.find(s));
            CHECK(sent == text.substr(0, first));
        }
    }
}

}  // namespace serve_text_stream_test
