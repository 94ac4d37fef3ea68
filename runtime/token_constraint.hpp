// Constrained generation on tokens (the API's response_format json_object / json_schema, vLLM's
// guided_regex and guided_choice): which tokens may come next so that the generated text stays
// the beginning of a document of a JsonGrammar (runtime/json_grammar.hpp) or of a whole match
// of a RegexDfa (runtime/regex_dfa.hpp), and that a stop token ends it only once it is whole.
// The Sampler (runtime/sampling.hpp) gives every other token probability 0 before it chooses,
// so greedy takes the most likely allowed token and sampling draws from the allowed ones.
//
// A token's bytes are what it adds to the decoded text (Tokenizer::decode_piece after a token
// other than BOS; after BOS a SentencePiece tokenizer drops a leading space, which JSON reads as
// whitespace either way; a pattern's text is what the tokens add, so a constrained sequence
// starts after a token other than BOS, as every serve and generate prompt's last token is).
// Special tokens other than the stop tokens, and tokens of no bytes, never come; so a text ends
// with a stop token, when the grammar lets nothing follow, or at max_tokens, as any generation
// does.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "runtime/json_grammar.hpp"
#include "runtime/regex_dfa.hpp"

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
    // The ids of non-empty texts in the texts' byte order, their texts in that order in one
    // buffer (text k from offsets[k] to offsets[k + 1]), and each one's common prefix with the
    // one before it (bytes, 0 for the first): a pattern's mask walks each shared prefix once,
    // reading memory in order.
    std::vector<int32_t> sorted;
    std::string sorted_bytes;
    std::vector<uint32_t> offsets, shared;
    std::array<uint32_t, 257>
        first_begin{};  // texts starting with byte b: [first_begin[b], [b + 1])
};

// What constrained text must be: a document of a JSON schema, or a whole match of a pattern.
using TextGrammar = std::variant<JsonGrammar, RegexDfa>;

// What a constrained sequence must be, shared by its sampler's copies.
struct TokenGrammar {
    TextGrammar grammar;
    std::shared_ptr<const TokenTexts> texts;
    std::vector<int32_t> stop_ids;  // allowed once the document is whole
};

class TokenMatcher {
  public:
    explicit TokenMatcher(std::shared_ptr<const TokenGrammar> g);
    // Whether id may come next.
    bool allows(int32_t id);
    // Every id that may not come next gets -inf; returns how many may.
    size_t mask(std::span<float> logits);
    // id, which allows() allowed, comes next (a stop token changes nothing: the text ends).
    void accept(int32_t id);
    bool complete() const { return dfa_ ? dfa_->accepting(dfa_state_) : state_->complete(); }
    bool finished() const { return dfa_ ? dfa_->finished(dfa_state_) : state_->finished(); }

  private:
    bool is_stop(int32_t id) const;
    size_t mask_json(std::span<float> logits);
    size_t mask_pattern(std::span<float> logits);
    std::shared_ptr<const TokenGrammar> g_;
    // A pattern's: the state so far and, after allows(), the state after that token.
    const RegexDfa* dfa_ = nullptr;
    uint32_t dfa_state_ = RegexDfa::kDead, dfa_scratch_ = RegexDfa::kDead;
    std::optional<JsonMatcher> state_, scratch_;  // a JSON schema's, likewise
    std::vector<uint32_t> depth_states_;          // mask_pattern's states along a text
    int32_t fed_ = -1;  // the id whose text scratch_ holds state_ after, if any
    std::vector<uint8_t> allowed_;
};

}  // namespace qforge
