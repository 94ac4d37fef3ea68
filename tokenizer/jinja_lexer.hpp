// Internal to tokenizer/jinja_*.cpp: template text -> segments (text, {{ expression }} and
// {% statement %} bodies) after jinja2's whitespace rules as transformers sets them
// (trim_blocks, lstrip_blocks, '-' and '+' markers), and a tag body -> expression tokens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qforge::jinja::detail {

struct Segment {
    enum class Kind : uint8_t { text, expr, stmt };
    Kind kind;
    std::string body;
};
std::vector<Segment> split_segments(std::string_view src);

struct Token {
    enum class Kind : uint8_t { name, string, integer, floating, op, end };
    Kind kind;
    std::string text;  // name, operator, or the decoded string literal
    int64_t i = 0;
    double f = 0.0;
};
// Ends with a Kind::end token.
std::vector<Token> tokenize(std::string_view s);

}  // namespace qforge::jinja::detail
