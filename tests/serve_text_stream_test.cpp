// Streamed text (serve/text_stream.hpp): stop strings split across tokens are never sent, and a
// character split across byte tokens is sent whole.
#include <catch2/catch.hpp>

#include "serve/text_stream.hpp"

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
