// Template text -> segments -> expression tokens (jinja_lexer.hpp).
#include "tokenizer/jinja_lexer.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "tokenizer/jinja_values.hpp"
#include "tokenizer/utf8.hpp"

namespace qforge::jinja::detail {

namespace {

constexpr std::string_view kLineSpace = " \t\r\f\v";  // lstrip_blocks: whitespace of one line

// ---------------------------------------------------------------------------------------------
// Segments: text, {{ expression }} and {% statement %} bodies, after jinja2's whitespace rules.

// The end of a tag body starting at `from`: the position of `close`, skipping string literals.
size_t find_tag_end(std::string_view src, size_t from, std::string_view close) {
    char quote = 0;
    for (size_t i = from; i < src.size(); ++i) {
        const char c = src[i];
        if (quote) {
            if (c == '\\')
                ++i;
            else if (c == quote)
                quote = 0;
        } else if (c == '\'' || c == '"') {
            quote = c;
        } else if (src.compare(i, close.size(), close) == 0) {
            return i;
        }
    }
    return std::string_view::npos;
}

}  // namespace

std::vector<Segment> split_segments(std::string_view src) {
    std::vector<Segment> out;
    size_t pos = 0;
    bool line_starting = true;  // jinja2: the text so far ends a line (for lstrip_blocks)
    while (pos <= src.size()) {
        size_t open = pos;
        while ((open = src.find('{', open)) != std::string_view::npos && open + 1 < src.size() &&
               src[open + 1] != '{' && src[open + 1] != '%' && src[open + 1] != '#')
            ++open;
        if (open == std::string_view::npos || open + 1 >= src.size()) {
            out.push_back({Segment::Kind::text, std::string(src.substr(pos))});
            break;
        }
        const char kind = src[open + 1];
        const bool block = kind == '%' || kind == '#';
        const char sign = open + 2 < src.size() ? src[open + 2] : 0;
        std::string text(src.substr(pos, open - pos));
        if (sign == '-') {
            text = strip(text, kSpace, false, true);
        } else if (block && sign != '+') {
            const size_t line = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
            if ((line > 0 || line_starting) &&
                text.find_first_not_of(kLineSpace, line) == std::string::npos)
                text.resize(line);
        }
        if (!text.empty()) out.push_back({Segment::Kind::text, std::move(text)});

        const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        const size_t body_begin = open + 2 + (sign == '-' || sign == '+' ? 1 : 0);
        const size_t end =
            kind == '#' ? src.find(close, body_begin) : find_tag_end(src, body_begin, close);
        if (end == std::string_view::npos)
            fail(std::string("unclosed '{") + kind + "' tag at offset " + std::to_string(open));
        const bool strip_after = end > body_begin && src[end - 1] == '-';
        const size_t body_end = strip_after ? end - 1 : end;
        if (kind != '#')
            out.push_back({kind == '{' ? Segment::Kind::expr : Segment::Kind::stmt,
                           std::string(src.substr(body_begin, body_end - body_begin))});
        pos = end + 2;
        const size_t after_tag = pos;
        if (strip_after) {
            while (pos < src.size() && kSpace.find(src[pos]) != std::string_view::npos) ++pos;
        } else if (block && pos < src.size() && src[pos] == '\n') {
            ++pos;  // trim_blocks
        }
        line_starting = pos > after_tag && src[pos - 1] == '\n';
        if (pos == src.size()) break;
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Expression tokens

namespace {

// Python's unicode-escape decoding of a literal's body (what jinja2 applies to string literals).
std::string unescape(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\\' || i + 1 == s.size()) {
            out += s[i];
            continue;
        }
        const char c = s[++i];
        auto hex = [&](size_t n) {
            if (i + n >= s.size()) fail("truncated escape in a string");
            uint32_t cp = 0;
            for (size_t k = 1; k <= n; ++k) {
                const char h = i + k < s.size() ? s[i + k] : 'x';
                const int d = h >= '0' && h <= '9'   ? h - '0'
                              : h >= 'a' && h <= 'f' ? h - 'a' + 10
                              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                     : -1;
                if (d < 0) fail("bad \\x, \\u or \\U escape in a string");
                cp = cp * 16 + static_cast<uint32_t>(d);
            }
            i += n;
            append_utf8(out, cp);
        };
        switch (c) {
            case 'n':
                out += '\n';
                break;
            case 't':
                out += '\t';
                break;
            case 'r':
                out += '\r';
                break;
            case 'f':
                out += '\f';
                break;
            case 'v':
                out += '\v';
                break;
            case 'a':
                out += '\a';
                break;
            case 'b':
                out += '\b';
                break;
            case '0':
                out += '\0';
                break;
            case '\\':
                out += '\\';
                break;
            case '\'':
                out += '\'';
                break;
            case '"':
                out += '"';
                break;
            case '\n':
                break;  // a line continuation
            case 'x':
                hex(2);
                break;
            case 'u':
                hex(4);
                break;
            case 'U':
                hex(8);
                break;
            default:
                out += '\\';
                out += c;  // unknown escapes stay as written
        }
    }
    return out;
}

}  // namespace

std::vector<Token> tokenize(std::string_view s) {
    static constexpr std::string_view kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
    std::vector<Token> out;
    size_t i = 0;
    while (i < s.size()) {
        const char c = s[i];
        if (kSpace.find(c) != std::string_view::npos) {
            ++i;
        } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
            size_t j = i;
            while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_'))
                ++j;
            out.push_back({Token::Kind::name, std::string(s.substr(i, j - i))});
            i = j;
        } else if (std::isdigit(static_cast<unsigned char>(c))) {
            size_t j = i;
            while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_'))
                ++j;
            bool is_float = j + 1 < s.size() && s[j] == '.' &&
                            std::isdigit(static_cast<unsigned char>(s[j + 1]));
            if (is_float) {
                ++j;
                while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
            }
            std::string digits(s.substr(i, j - i));
            digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
            Token t{is_float ? Token::Kind::floating : Token::Kind::integer, digits};
            if (is_float)
                t.f = std::strtod(digits.c_str(), nullptr);
            else
                t.i = std::strtoll(digits.c_str(), nullptr, 10);
            out.push_back(t);
            i = j;
        } else if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < s.size() && s[j] != c) j += s[j] == '\\' ? 2 : 1;
            if (j >= s.size()) fail("unterminated string literal");
            out.push_back({Token::Kind::string, unescape(s.substr(i + 1, j - i - 1))});
            i = j + 1;
        } else {
            std::string op(1, c);
            for (std::string_view two : kOps2)
                if (s.compare(i, 2, two) == 0) op = two;
            if (std::string_view("()[]{}.,:|~+-*/%<>=!").find(c) == std::string_view::npos)
                fail(std::string("unexpected character '") + c + "'");
            if (op == "!") fail("unexpected '!'");
            out.push_back({Token::Kind::op, op});
            i += op.size();
        }
    }
    out.push_back({Token::Kind::end, ""});
    return out;
}

}  // namespace qforge::jinja::detail
