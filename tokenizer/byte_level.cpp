// GPT-2's byte <-> printable character mapping (the ByteLevel pre-tokenizer and decoder).
// Bytes that are printable Latin-1 characters ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) map to
// themselves; the other 68 bytes (controls, space, DEL, NBSP, soft hyphen) map, in increasing byte
// order, to U+0100, U+0101, ... so that every token is a string of visible characters.
#include <array>
#include <cstdint>

#include "core/error.hpp"
#include "tokenizer/pretokenizer.hpp"

namespace qforge {

namespace {

constexpr bool maps_to_itself(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// The code point of each byte, and the inverse (code points are all below 0x100 + 68).
struct ByteLevelTables {
    static constexpr uint32_t kMaxCodePoint = 0x100 + 68;
    std::array<uint32_t, 256> code_point{};
    std::array<int16_t, kMaxCodePoint> byte_of{};  // -1 where no byte maps there
    std::array<std::array<char, 2>, 256> utf8{};   // every code point is 1 or 2 UTF-8 bytes
    std::array<uint8_t, 256> utf8_len{};

    constexpr ByteLevelTables() {
        uint32_t next_shifted = 0x100;
        for (auto& b : byte_of) b = -1;
        for (unsigned b = 0; b < 256; ++b) {
            const uint32_t cp = maps_to_itself(b) ? b : next_shifted++;
            code_point[b] = cp;
            byte_of[cp] = static_cast<int16_t>(b);
            if (cp < 0x80) {
                utf8[b] = {static_cast<char>(cp), 0};
                utf8_len[b] = 1;
            } else {
                utf8[b] = {static_cast<char>(0xC0 | (cp >> 6)),
                           static_cast<char>(0x80 | (cp & 0x3F))};
                utf8_len[b] = 2;
            }
        }
    }
};

constexpr ByteLevelTables kTables;
static_assert(kTables.code_point[' '] == 0x120, "space maps to U+0120 'Ġ' as in GPT-2");
static_assert(kTables.code_point[0xFF] == 0xFF && kTables.code_point[0xAD] == 0x143);

}  // namespace

std::string byte_level_encode(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) {
        const auto b = static_cast<unsigned char>(c);
        out.append(kTables.utf8[b].data(), kTables.utf8_len[b]);
    }
    return out;
}

std::string byte_level_decode(std::string_view mapped) {
    std::string out;
    out.reserve(mapped.size());
    size_t i = 0;
    while (i < mapped.size()) {
        const size_t at = i;
        const auto lead = static_cast<unsigned char>(mapped[i]);
        uint32_t cp = 0;
        if (lead < 0x80) {
            cp = lead;
            i += 1;
        } else if ((lead & 0xE0) == 0xC0 && i + 1 < mapped.size() &&
                   (static_cast<unsigned char>(mapped[i + 1]) & 0xC0) == 0x80) {
            cp = ((lead & 0x1Fu) << 6) | (static_cast<unsigned char>(mapped[i + 1]) & 0x3Fu);
            if (cp < 0x80) cp = ByteLevelTables::kMaxCodePoint;  // overlong: not a character
            i += 2;
        } else {
            cp = ByteLevelTables::kMaxCodePoint;  // longer sequences are all outside the alphabet
        }
        if (cp >= ByteLevelTables::kMaxCodePoint || kTables.byte_of[cp] < 0) {
            throw Error("byte-level text: character at byte " + std::to_string(at) +
                        " is not in GPT-2's byte alphabet");
        }
        out.push_back(static_cast<char>(kTables.byte_of[cp]));
    }
    return out;
}

}  // namespace qforge
