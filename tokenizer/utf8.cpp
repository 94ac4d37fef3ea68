#include "tokenizer/utf8.hpp"

namespace qforge {

namespace {

// Bounds for the second byte of a sequence (Unicode Table 3-7, "Well-Formed UTF-8 Byte
// Sequences"): E0 needs A0..BF, ED needs 80..9F (no surrogates), F0 needs 90..BF (no overlongs),
// F4 needs 80..8F (nothing past U+10FFFF); every other continuation byte is 80..BF.
struct LeadByte {
    uint8_t length;  // 0: cannot start a sequence
    uint8_t second_lo, second_hi;
};

LeadByte lead_byte(uint8_t c) {
    if (c < 0x80) return {1, 0, 0};
    if (c >= 0xc2 && c <= 0xdf) return {2, 0x80, 0xbf};
    if (c == 0xe0) return {3, 0xa0, 0xbf};
    if (c == 0xed) return {3, 0x80, 0x9f};
    if (c >= 0xe1 && c <= 0xef) return {3, 0x80, 0xbf};
    if (c == 0xf0) return {4, 0x90, 0xbf};
    if (c >= 0xf1 && c <= 0xf3) return {4, 0x80, 0xbf};
    if (c == 0xf4) return {4, 0x80, 0x8f};
    return {0, 0, 0};
}

// Bytes at s[i] that form a valid prefix of a sequence (the maximal subpart), at least 1.
size_t valid_prefix(std::string_view s, size_t i, size_t* full_length) {
    const LeadByte lead = lead_byte(static_cast<uint8_t>(s[i]));
    *full_length = lead.length;
    if (lead.length <= 1) return 1;
    size_t k = 1;
    for (; k < lead.length && i + k < s.size(); ++k) {
        const auto b = static_cast<uint8_t>(s[i + k]);
        const uint8_t lo = k == 1 ? lead.second_lo : 0x80, hi = k == 1 ? lead.second_hi : 0xbf;
        if (b < lo || b > hi) break;
    }
    return k;
}

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t i) {
    size_t full = 0;
    const size_t n = valid_prefix(s, i, &full);
    return full != 0 && n == full ? n : 0;
}

uint32_t utf8_decode_at(std::string_view s, size_t i, size_t len) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (len == 1) return c;
    uint32_t cp = c & (0x7fu >> len);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3fu);
    return cp;
}

std::string sanitize_utf8(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {  // fast path: most input is valid, return it as is
        if (static_cast<uint8_t>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        const size_t n = utf8_sequence_length(s, i);
        if (n == 0) break;
        i += n;
    }
    if (i == s.size()) return std::string(s);
    std::string out(s.substr(0, i));
    while (i < s.size()) {
        size_t full = 0;
        const size_t n = valid_prefix(s, i, &full);
        if (full != 0 && n == full)
            out.append(s.substr(i, n));
        else
            out += kReplacement;
        i += n;
    }
    return out;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xc0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xe0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
        out += static_cast<char>(0xf0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    }
}

bool is_unicode_whitespace(uint32_t cp) {
    // The 25 code points of White_Space in PropList.txt (unchanged since Unicode 6.3).
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

}  // namespace qforge
