// Added (and special) tokens are found in the text before anything else runs, as Hugging Face
// `tokenizers` does: leftmost match, the longest at that position, honouring lstrip/rstrip
// (the match swallows whitespace beside it) and single_word (only between non-word characters).
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qforge {

struct AddedToken {
    int32_t id = 0;
    std::string content;
    bool special = false;
    bool lstrip = false;
    bool rstrip = false;
    bool single_word = false;
    bool normalized = false;  // matched in the normalized text rather than the raw text
};

class AddedTokenMatcher {
  public:
    AddedTokenMatcher() = default;
    explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);
    bool empty() const { return tokens_.empty(); }

    struct Segment {
        size_t begin, end;  // byte range of `text`
        int32_t id;         // the added token, or -1 for text between matches
    };
    // Cuts `text` into text segments and matches, in order, covering all of it (an empty text is
    // one empty text segment, as in `tokenizers`).
    void split(std::string_view text, std::vector<Segment>& out) const;

  private:
    // Longest token starting at `pos`: its index in tokens_ and its length, or -1.
    int longest_at(std::string_view text, size_t pos, size_t* length) const;

    // Index of the longest token starting at every position of `text` (-1 where none), by one
    // Aho-Corasick pass over the reversed text with the reversed tokens: linear, where
    // longest_at at every position costs the text's length times the longest token's. Used
    // when some token is longer than kDirectScanBytes (a hostile tokenizer.json).
    void longest_everywhere(std::string_view text, std::vector<int32_t>& index) const;
    static constexpr size_t kDirectScanBytes = 64;

    std::vector<AddedToken> tokens_;
    size_t longest_token_ = 0;
    // The reversed tokens' automaton: node * 256 + byte -> child, and per node its failure link
    // and the token of the longest reversed token that is a suffix of its path (-1 if none).
    std::unordered_map<uint64_t, uint32_t> reversed_edges_;
    std::vector<uint32_t> reversed_fail_;
    std::vector<int32_t> reversed_best_;
    // A byte trie: node * 256 + byte -> child node; terminal node -> token index.
    std::unordered_map<uint64_t, uint32_t> edges_;
    std::unordered_map<uint32_t, int> terminal_;
    std::bitset<256> first_bytes_;  // quick rejection of positions no token can start at
};

}  // namespace qforge
