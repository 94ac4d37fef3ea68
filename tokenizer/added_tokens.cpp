#include "tokenizer/added_tokens.hpp"

#include <algorithm>

#include "tokenizer/utf8.hpp"

namespace qforge {

namespace {

uint64_t edge_key(uint32_t node, uint8_t byte) { return (static_cast<uint64_t>(node) << 8) | byte; }

// The code point that ends text[0..end) (end > 0).
uint32_t code_point_before(std::string_view text, size_t end) {
    size_t b = end - 1;
    while (b > 0 && (static_cast<uint8_t>(text[b]) & 0xc0) == 0x80) --b;
    const size_t len = utf8_sequence_length(text, b);
    return len ? utf8_decode_at(text, b, len) : 0xfffd;
}

uint32_t code_point_at(std::string_view text, size_t pos) {
    const size_t len = utf8_sequence_length(text, pos);
    return len ? utf8_decode_at(text, pos, len) : 0xfffd;
}

// single_word's notion of a word character. ASCII letters, digits and '_' only: non-ASCII letters
// count as separators here, a simplification for a flag none of the supported families sets.
bool is_word_char(uint32_t cp) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
    uint32_t nodes = 1;  // node 0 is the root
    for (const AddedToken& t : tokens) {
        if (t.content.empty()) continue;  // an empty token would match everywhere
        uint32_t node = 0;
        for (char ch : t.content) {
            auto [it, fresh] = edges_.emplace(edge_key(node, static_cast<uint8_t>(ch)), nodes);
            if (fresh) ++nodes;
            node = it->second;
        }
        tokens_.push_back(t);
        terminal_[node] = static_cast<int>(tokens_.size() - 1);
        first_bytes_.set(static_cast<uint8_t>(t.content[0]));
    }
}

int AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t* length) const {
    int found = -1;
    uint32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
        auto it = edges_.find(edge_key(node, static_cast<uint8_t>(text[i])));
        if (it == edges_.end()) break;
        node = it->second;
        if (auto t = terminal_.find(node); t != terminal_.end()) found = t->second, *length = i + 1 - pos;
    }
    return found;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
    size_t emitted = 0;  // text before this is already in `out`
    size_t pos = 0;
    while (pos < text.size() && !tokens_.empty()) {
        size_t len = 0;
        const int k = first_bytes_.test(static_cast<uint8_t>(text[pos])) ? longest_at(text, pos, &len) : -1;
        if (k < 0) {
            ++pos;
            continue;
        }
        const AddedToken& t = tokens_[static_cast<size_t>(k)];
        size_t start = pos, stop = pos + len;
        pos = stop;  // the next search starts where this match ended, whatever is stripped
        if (start < emitted) continue;  // overlaps what an rstrip already swallowed
        if (t.single_word) {
            const bool left_ok = start == 0 || !is_word_char(code_point_before(text, start));
            const bool right_ok = stop == text.size() || !is_word_char(code_point_at(text, stop));
            if (!left_ok || !right_ok) continue;  // skipped; the search goes on after it
        }
        if (t.lstrip)
            while (start > emitted && is_unicode_whitespace(code_point_before(text, start))) {
                size_t b = start - 1;
                while (b > 0 && (static_cast<uint8_t>(text[b]) & 0xc0) == 0x80) --b;
                start = b;
            }
        if (t.rstrip)
            while (stop < text.size() && is_unicode_whitespace(code_point_at(text, stop)))
                stop += std::max<size_t>(1, utf8_sequence_length(text, stop));
        if (emitted < start) out.push_back({emitted, start, -1});
        out.push_back({start, stop, t.id});
        emitted = stop;
        pos = std::max(pos, stop);
    }
    if (emitted < text.size() || text.empty()) out.push_back({emitted, text.size(), -1});
}

}  // namespace qforge
