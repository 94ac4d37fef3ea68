// Constrained generation on tokens (the API's response_format json_object / json_schema): which
// tokens may come next so that the generated text stays the beginning of a document of a
// JsonGrammar (runtime/json_grammar.hpp), and that a stop token ends it only once it is whole.
// The Sampler (runtime/sampling.hpp) gives every other token probability 0 before it chooses,
// so greedy takes the most likely allowed token and sampling draws from the allowed ones.
//
// A token's bytes are what it adds to the decoded text (Tokenizer::decode_piece after a token
// other than BOS; after BOS a SentencePiece tokenizer drops a leading space, which JSON reads as
// whitespace either way). Special tokens other than the stop tokens, and tokens of no bytes,
// never come; so a document ends with a stop token or at max_tokens, as any generation does.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/json_grammar.hpp"

namespace qforge {

class Tokenizer;

// Every token's bytes, once per tokenizer (shared by every constrained request).
struct TokenTexts {
    explicit TokenTexts(const Tokenizer& tok);
    std::vector<std::string> text;                   // empty: never part of a document
    std::array<std::vector<int32_t>, 256> by_first;  // the ids whose text starts with each byte
    // 1: the text is string content as it stands (no quote, backslash or control byte; whole,
    // well-formed UTF-8 characters): inside a string such a token is taken without a try.
    std::vector<uint8_t> plain;
};

// What a constrained sequence must be, shared by its sampler's copies.
struct TokenGrammar {
    JsonGrammar grammar;
    std::shared_ptr<const TokenTexts> texts;
    std::vector<int32_t> stop_ids;  // allowed once the document is whole
};

class TokenMatcher {
  public:
    explicit TokenMatcher(std::shared_ptr<const TokenGrammar> g)
        : g_(std::move(g)), state_(g_->grammar), scratch_(g_->grammar) {}
    // Whether id may come next.
    bool allows(int32_t id);
    // Every id that may not come next gets -inf; returns how many may.
    size_t mask(std::span<float> logits);
    // id, which allows() allowed, comes next (a stop token changes nothing: the text ends).
    void accept(int32_t id);
    bool complete() const { return state_.complete(); }
    bool finished() const { return state_.finished(); }

  private:
    bool is_stop(int32_t id) const;
    std::shared_ptr<const TokenGrammar> g_;
    JsonMatcher state_, scratch_;
    int32_t fed_ = -1;  // the id whose text scratch_ holds state_ after, if any
    std::vector<uint8_t> allowed_;
};

}  // namespace qforge
