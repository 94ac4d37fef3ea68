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
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
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
        longest_token_ = std::max(longest_token_, t.content.size());
    }
    if (longest_token_ <= kDirectScanBytes) return;
    // The reversed trie, then failure links breadth first (Aho-Corasick).
    std::vector<std::vector<std::pair<uint8_t, uint32_t>>> children(1);
    reversed_best_.assign(1, -1);
    for (size_t k = 0; k < tokens_.size(); ++k) {
        const std::string& c = tokens_[k].content;
        uint32_t node = 0;
        for (size_t i = c.size(); i-- > 0;) {
            const auto byte = static_cast<uint8_t>(c[i]);
            const auto next = static_cast<uint32_t>(reversed_best_.size());
            auto [it, fresh] = reversed_edges_.emplace(edge_key(node, byte), next);
            if (fresh) {
                children[node].push_back({byte, next});
                children.emplace_back();
                reversed_best_.push_back(-1);
            }
            node = it->second;
        }
        reversed_best_[node] =
            static_cast<int32_t>(k);  // a later equal token wins, as in terminal_
    }
    reversed_fail_.assign(reversed_best_.size(), 0);
    std::vector<uint32_t> queue;
    for (const auto& [byte, child] : children[0]) queue.push_back(child);
    for (size_t head = 0; head < queue.size(); ++head) {
        const uint32_t node = queue[head];
        // A node's own token is the longest suffix of its path; otherwise its failure node's.
        if (reversed_best_[node] < 0) reversed_best_[node] = reversed_best_[reversed_fail_[node]];
        for (const auto& [byte, child] : children[node]) {
            uint32_t f = reversed_fail_[node];
            for (;;) {
                if (auto it = reversed_edges_.find(edge_key(f, byte));
                    it != reversed_edges_.end()) {
                    reversed_fail_[child] = it->second;
                    break;
                }
                if (f == 0) break;
                f = reversed_fail_[f];
            }
            queue.push_back(child);
        }
    }
}

void AddedTokenMatcher::longest_everywhere(std::string_view text,
                                           std::vector<int32_t>& index) const {
    index.assign(text.size(), -1);
    uint32_t node = 0;
    for (size_t pos = text.size(); pos-- > 0;) {
        const auto byte = static_cast<uint8_t>(text[pos]);
        for (;;) {
            if (auto it = reversed_edges_.find(edge_key(node, byte)); it != reversed_edges_.end()) {
                node = it->second;
                break;
            }
            if (node == 0) break;
            node = reversed_fail_[node];
        }
        index[pos] = reversed_best_[node];
    }
}

int AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t* length) const {
    int found = -1;
    uint32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
        auto it = edges_.find(edge_key(node, static_cast<uint8_t>(text[i])));
        if (it == edges_.end()) break;
        node = it->second;
        if (auto t = terminal_.find(node); t != terminal_.end())
            found = t->second, *length = i + 1 - pos;
    }
    return found;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
    size_t emitted = 0;  // text before this is already in `out`
    size_t pos = 0;
    std::vector<int32_t> longest;
    const bool automaton = longest_token_ > kDirectScanBytes;
    if (automaton) longest_everywhere(text, longest);
    while (pos < text.size() && !tokens_.empty()) {
        size_t len = 0;
        int k = -1;
        if (automaton) {
            k = longest[pos];
            if (k >= 0) len = tokens_[static_cast<size_t>(k)].content.size();
        } else if (first_bytes_.test(static_cast<uint8_t>(text[pos]))) {
            k = longest_at(text, pos, &len);
        }
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
