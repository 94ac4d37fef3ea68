// Regular expressions as byte automata, for constrained generation (vLLM's guided_regex and
// guided_choice, structured_outputs.regex and .choice; `qforge generate --regex`): a RegexDfa is
// compiled once from a pattern (or a list of texts) and says, byte by byte, whether the text so
// far can still become a whole match and whether it is one. runtime/token_constraint.hpp lifts
// it to tokens, as it does JSON schemas.
//
// What matches: the texts Python's re.fullmatch(pattern, text, re.ASCII) accepts, as UTF-8
// (tests/regex_dfa_test.cpp checks fixtures Python wrote). The syntax is Python's, restricted to
// what a finite automaton can follow:
//   literal characters (any Unicode, as UTF-8); escapes \n \t \r \f \v \a, \0 and octal \0oo,
//     \xhh, \uhhhh, \Uhhhhhhhh, and a backslash before any character that is not an ASCII letter
//     or digit; . (any character but a line feed);
//   classes [...] and [^...] with ranges, ] first taken as itself; \d \w \s and \D \W \S inside
//     and outside them, ASCII ones (re.ASCII): [0-9], [A-Za-z0-9_], [ \t\n\r\f\v];
//   groups (...), (?:...), (?P<name>...), comments (?#...); alternation |;
//   quantifiers * + ? {m} {m,} {,n} {m,n} (a { that starts none of them is itself), and their
//     lazy forms (*? and the others: lazy or greedy, the texts that match whole are the same);
//   ^ and \A first in the pattern or in one of its top-level alternatives, $ and \Z last (the
//     whole text is matched either way).
// Refused, with an Error naming the pattern and the byte offset: backreferences, lookahead and
// lookbehind, atomic groups and possessive quantifiers, conditionals, inline flags, \b \B and
// \N{...}, anchors anywhere else, a bound above kMaxRepeat, a pattern that matches no text, and
// one whose automaton would pass kMaxNfaStates, kMaxDfaStates or kMaxDfaCells, or whose subset
// construction would take more than 20M closure steps (a 400 for a request, never a stall or an
// exhausted memory).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qforge {

class RegexDfa {
  public:
    static constexpr size_t kMaxPatternBytes = 16384;
    static constexpr uint32_t kMaxRepeat = 1000;  // the largest m or n of {m,n}
    static constexpr uint32_t kMaxGroupDepth = 128;
    static constexpr size_t kMaxNfaStates = 200000;
    static constexpr size_t kMaxDfaStates = 50000;
    static constexpr size_t kMaxDfaCells = size_t{1} << 22;  // states x byte classes (16 MiB)
    static constexpr size_t kMaxChoices = 1024;

    // python: the header's syntax, the text matched whole. json_schema: a JSON schema's
    // `pattern` (ECMA-262's, searched for, as JSON Schema validators test it): the same syntax
    // but for ECMAScript's classes (\s its Unicode spaces, . every character but line ends
    // \n \r U+2028 U+2029), [] matching nothing and [^] anything, (?<name>...) groups, {,n}
    // as text and no \A \Z \U; a top-level alternative without ^ may begin anywhere in the
    // text and one without $ end anywhere.
    enum class Syntax : uint8_t { python, json_schema };
    // `where` names the pattern in errors ("guided_regex", "--regex").
    static RegexDfa compile(std::string_view pattern, const std::string& where,
                            Syntax syntax = Syntax::python);
    // Exactly one of `texts` (vLLM's guided_choice): at least one, each valid UTF-8.
    static RegexDfa choice(const std::vector<std::string>& texts, const std::string& where);
    // The texts both a and b take (an Error if none, or if the product passes kMaxDfaStates).
    static RegexDfa both(const RegexDfa& a, const RegexDfa& b, const std::string& where);

    // The state no text leads out of: the bytes so far cannot begin a match.
    static constexpr uint32_t kDead = 0;
    uint32_t start() const { return start_; }
    uint32_t next(uint32_t state, uint8_t byte) const {
        return next_[state * classes_ + class_of_[byte]];
    }
    uint32_t walk(uint32_t state, std::string_view bytes) const {
        for (char c : bytes) {
            if (state == kDead) break;
            state = next(state, static_cast<uint8_t>(c));
        }
        return state;
    }
    // The text that led to `state` matches whole.
    bool accepting(uint32_t state) const { return accepting_[state] != 0; }
    // It matches whole and no byte may follow.
    bool finished(uint32_t state) const { return finished_[state] != 0; }
    bool matches(std::string_view text) const { return accepting(walk(start_, text)); }
    size_t states() const { return accepting_.size(); }
    size_t cells() const { return next_.size(); }  // transitions: states x byte classes

  private:
    friend class DfaBuilder;
    uint32_t classes_ = 1;  // bytes fall into classes that every state treats alike
    uint32_t start_ = kDead;
    std::array<uint8_t, 256> class_of_{};
    std::vector<uint32_t> next_;  // states x classes
    std::vector<uint8_t> accepting_, finished_;
};

}  // namespace qforge
