// Ids -> text. llama2.c follows run.c's decode(); the tokenizer.json families follow their
// `tokenizers` decoders: ByteLevel (bytes from the byte alphabet, then lossy UTF-8), and the
// SentencePiece chain Replace("▁", " ") + ByteFallback + Fuse + Strip(" ", 1, 0).
#include "core/error.hpp"
#include "tokenizer/tokenizer_impl.hpp"
#include "tokenizer/utf8.hpp"

namespace qforge {

namespace {

void check_id(const TokenizerData& t, int32_t id) {
    if (id < 0 || static_cast<size_t>(id) >= t.pieces.size())
        throw Error(t.source, {},
                    "token id " + std::to_string(id) + " is out of range (vocabulary " +
                        std::to_string(t.pieces.size()) + ")");
}

// `tokenizers`' ByteFallback: a run of <0xXX> pieces becomes its bytes when they are valid
// UTF-8, else one U+FFFD per byte.
void flush_bytes(std::string& bytes, std::string& out) {
    if (bytes.empty()) return;
    if (sanitize_utf8(bytes) == bytes) {
        out += bytes;
    } else {
        for (size_t i = 0; i < bytes.size(); ++i) out += kReplacement;
    }
    bytes.clear();
}

// run.c: the first piece after BOS loses its leading space (the dummy prefix).
std::string_view llama2c_piece(const TokenizerData& t, int32_t previous, int32_t id, char* byte) {
    const auto i = static_cast<size_t>(id);
    if (t.byte_value[i] >= 0) {
        *byte = static_cast<char>(t.byte_value[i]);
        return {byte, 1};
    }
    std::string_view p = t.pieces[i];
    if (t.bos && previous == *t.bos && !p.empty() && p[0] == ' ') p.remove_prefix(1);
    return p;
}

}  // namespace

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
    const Impl& t = *impl_;
    std::string out, bytes;
    int32_t previous = -1;
    for (const int32_t id : ids) {
        check_id(t, id);
        const bool skip = skip_special && is_special(id);
        if (t.model == TokenizerModel::llama2c) {
            char byte;
            if (!skip) out += llama2c_piece(t, previous, id, &byte);
            previous = id;
            continue;
        }
        if (skip) continue;
        const auto i = static_cast<size_t>(id);
        if (t.byte_value[i] >= 0) {
            bytes += static_cast<char>(t.byte_value[i]);
            continue;
        }
        flush_bytes(bytes, out);
        out += t.decoded[i];
    }
    flush_bytes(bytes, out);
    if (t.decode_byte_level) out = sanitize_utf8(out);  // String::from_utf8_lossy
    size_t strip = 0;
    while (strip < static_cast<size_t>(t.strip_leading_spaces) && strip < out.size() &&
           out[strip] == ' ')
        ++strip;
    out.erase(0, strip);
    return out;
}

std::string Tokenizer::decode_piece(int32_t previous, int32_t id) const {
    const Impl& t = *impl_;
    check_id(t, id);
    const auto i = static_cast<size_t>(id);
    if (t.model == TokenizerModel::llama2c) {
        char byte;
        return std::string(llama2c_piece(t, previous, id, &byte));
    }
    // Byte pieces come out raw: a streaming caller joins the bytes of a split character.
    if (t.byte_value[i] >= 0) return std::string(1, static_cast<char>(t.byte_value[i]));
    std::string s = t.decoded[i];
    const bool at_start = previous < 0 || (t.bos && previous == *t.bos);
    if (at_start && t.strip_leading_spaces > 0 && !s.empty() && s[0] == ' ') s.erase(0, 1);
    return s;
}

}  // namespace qforge
