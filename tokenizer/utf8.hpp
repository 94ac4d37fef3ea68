// UTF-8 helpers for the tokenizer: input cleaning with Python's errors="replace" rule, code point
// stepping, and the whitespace test that added-token lstrip/rstrip use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qforge {

// U+FFFD, what a byte that is not UTF-8 decodes to.
inline constexpr std::string_view kReplacement = "\xef\xbf\xbd";

// `s` with every ill-formed sequence replaced by U+FFFD, one replacement per maximal subpart
// (Unicode 15, section 3.9, "U+FFFD substitution of maximal subparts"): the rule Python's
// bytes.decode("utf-8", errors="replace") and Rust's String::from_utf8_lossy both follow, so
// b"\xe2\x82" becomes one U+FFFD and b"\xff\xfe" two. Valid input is returned unchanged.
std::string sanitize_utf8(std::string_view s);

// Length in bytes of the valid sequence starting at s[i], or 0 when none starts there.
size_t utf8_sequence_length(std::string_view s, size_t i);

// The code point of the valid sequence of `len` bytes at s[i].
uint32_t utf8_decode_at(std::string_view s, size_t i, size_t len);

void append_utf8(std::string& out, uint32_t cp);

// Unicode White_Space (PropList.txt), which Rust's char::is_whitespace tests.
bool is_unicode_whitespace(uint32_t cp);

}  // namespace qforge
