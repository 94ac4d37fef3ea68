// A pattern becomes a DFA in three steps: a parser reads it into a tree of code-point sets,
// concatenations, alternations and repeats; a Thompson construction turns the tree into an NFA
// over bytes (each code-point range as its UTF-8 byte sequences); the subset construction, over
// classes of bytes that every NFA edge treats alike, makes the DFA, whose states that can no
// longer reach a match all become kDead.
#include "runtime/regex_dfa.hpp"

#include <algorithm>
#include <cctype>
#include <map>

#include "core/error.hpp"
#include "tokenizer/utf8.hpp"

namespace qforge {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;  // not in any UTF-8 text
constexpr uint32_t kUnbounded = UINT32_MAX;

struct Range {
    uint32_t lo, hi;  // code points, inclusive
};
using CodeSet = std::vector<Range>;

// Sorted, overlaps and neighbours merged, surrogates taken out.
CodeSet normalized(CodeSet s) {
    std::sort(s.begin(), s.end(), [](Range a, Range b) { return a.lo < b.lo; });
    CodeSet merged;
    for (Range r : s) {
        if (!merged.empty() && r.lo <= merged.back().hi + 1)
            merged.back().hi = std::max(merged.back().hi, r.hi);
        else
            merged.push_back(r);
    }
    CodeSet out;
    for (Range r : merged) {
        if (r.hi < kSurrogateLo || r.lo > kSurrogateHi) {
            out.push_back(r);
            continue;
        }
        if (r.lo < kSurrogateLo) out.push_back({r.lo, kSurrogateLo - 1});
        if (r.hi > kSurrogateHi) out.push_back({kSurrogateHi + 1, r.hi});
    }
    return out;
}

CodeSet complement(const CodeSet& s) {
    CodeSet out;
    uint32_t from = 0;
    for (Range r : normalized(s)) {
        if (r.lo > from) out.push_back({from, r.lo - 1});
        from = r.hi + 1;
    }
    if (from <= kMaxCodePoint) out.push_back({from, kMaxCodePoint});
    return normalized(out);
}

// re.ASCII's classes.
CodeSet digits() { return {{'0', '9'}}; }
CodeSet word() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
CodeSet spaces() { return {{'\t', '\r'}, {' ', ' '}}; }  // \t \n \v \f \r and space
// ECMAScript's \s (WhiteSpace and LineTerminator) and what its . leaves out.
CodeSet ecma_spaces() {
    return {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680},
            {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
            {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}
CodeSet ecma_line_ends() { return {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}; }
CodeSet any_character() { return {{0, kMaxCodePoint}}; }

struct Ast {
    enum class Kind : uint8_t { set, concat, alt, repeat };
    Kind kind = Kind::concat;  // an empty concat matches the empty text
    CodeSet set;
    std::vector<Ast> kids;
    uint32_t min = 0, max = 0;  // repeat of kids[0]

    static Ast of(CodeSet s) {
        Ast a;
        a.kind = Kind::set;
        a.set = normalized(std::move(s));
        return a;
    }
    static Ast of(Kind k, std::vector<Ast> kids) {
        if (kids.size() == 1) return std::move(kids[0]);
        Ast a;
        a.kind = k;
        a.kids = std::move(kids);
        return a;
    }
};

// The pattern's syntax (header comment) into an Ast.
class Parser {
  public:
    Parser(std::string_view p, const std::string& where, RegexDfa::Syntax syntax)
        : p_(p), where_(where), ecma_(syntax == RegexDfa::Syntax::json_schema) {}

    Ast parse() {
        Ast a = alternation();
        if (pos_ < p_.size()) fail("unbalanced parenthesis");
        return a;
    }

  private:
    [[noreturn]] void fail(const std::string& what) const {
        throw Error(where_ + ": " + what + " at byte " + std::to_string(pos_) + " of the pattern");
    }
    bool at_end() const { return pos_ >= p_.size(); }
    char peek(size_t ahead = 0) const { return pos_ + ahead < p_.size() ? p_[pos_ + ahead] : '\0'; }
    bool take(std::string_view s) {
        if (p_.substr(pos_, s.size()) != s) return false;
        pos_ += s.size();
        return true;
    }

    Ast alternation() {
        std::vector<Ast> alts;
        alts.push_back(sequence());
        while (take("|")) alts.push_back(sequence());
        return Ast::of(Ast::Kind::alt, std::move(alts));
    }

    static Ast any_text() {
        Ast r;
        r.kind = Ast::Kind::repeat;
        r.max = kUnbounded;
        r.kids.push_back(Ast::of(any_character()));
        return r;
    }

    // Whether a top-level alternative ends here (where $ and \Z may stand).
    bool alternative_ends() const { return depth_ == 0 && (at_end() || peek() == '|'); }

    // A JSON schema's pattern is searched for (ECMA-262's RegExp test): a top-level alternative
    // without ^ may start anywhere in the text, one without $ end anywhere.
    Ast sequence() {
        std::vector<Ast> items;
        const size_t begin = pos_;
        bool first = false, last = false;  // anchored to the text's start, its end
        while (!at_end() && peek() != '|' && peek() != ')') {
            const size_t here = pos_;
            if (take("^") || (!ecma_ && take("\\A"))) {
                if (depth_ != 0 || here != begin) {
                    pos_ = here;
                    fail("an anchor inside the pattern is not supported (^ only first)");
                }
                first = true;
                continue;
            }
            if (take("$") || (!ecma_ && take("\\Z"))) {
                if (!alternative_ends()) {
                    pos_ = here;
                    fail("an anchor inside the pattern is not supported ($ only last)");
                }
                last = true;
                continue;
            }
            if (take("(?#")) {  // a comment
                while (!at_end() && peek() != ')') ++pos_;
                if (!take(")")) fail("unterminated comment");
                continue;
            }
            Ast atom = this->atom();
            items.push_back(quantified(std::move(atom)));
        }
        if (ecma_ && depth_ == 0) {
            if (!first) items.insert(items.begin(), any_text());
            if (!last) items.push_back(any_text());
        }
        return Ast::of(Ast::Kind::concat, std::move(items));
    }

    // {m}, {m,}, {,n}, {m,n} at pos_ (Python's forms; {,} is {0,}); false, pos_ unchanged, if
    // the brace starts none of them (it is then a literal).
    bool bounds(uint32_t& min, uint32_t& max) {
        size_t i = pos_ + 1;
        const auto number = [&](uint32_t& v) {
            const size_t from = i;
            uint64_t x = 0;
            while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') {
                x = std::min<uint64_t>(x * 10 + static_cast<uint64_t>(p_[i] - '0'), 1ull << 40);
                ++i;
            }
            v = static_cast<uint32_t>(std::min<uint64_t>(x, UINT32_MAX - 1));
            return i > from;
        };
        uint32_t lo = 0, hi = 0;
        const bool has_lo = number(lo);
        if (ecma_ && !has_lo) return false;  // ECMAScript's {,n} is text
        if (i < p_.size() && p_[i] == '}') {
            if (!has_lo) return false;
            pos_ = i + 1;
            if (lo > RegexDfa::kMaxRepeat)
                fail("a bound above " + std::to_string(RegexDfa::kMaxRepeat));
            min = max = lo;
            return true;
        }
        if (i >= p_.size() || p_[i] != ',') return false;
        ++i;
        const bool has_hi = number(hi);
        if (i >= p_.size() || p_[i] != '}') return false;
        pos_ = i + 1;
        if (lo > RegexDfa::kMaxRepeat || (has_hi && hi > RegexDfa::kMaxRepeat))
            fail("a bound above " + std::to_string(RegexDfa::kMaxRepeat));
        if (has_hi && hi < lo) fail("min repeat greater than max repeat");
        min = lo;
        max = has_hi ? hi : kUnbounded;
        return true;
    }

    // A quantifier at pos_, taken: its bounds. False, nothing taken, if none starts here.
    bool quantifier(uint32_t& min, uint32_t& max) {
        switch (peek()) {
            case '*':
                ++pos_, min = 0, max = kUnbounded;
                return true;
            case '+':
                ++pos_, min = 1, max = kUnbounded;
                return true;
            case '?':
                ++pos_, min = 0, max = 1;
                return true;
            case '{':
                return bounds(min, max);
            default:
                return false;
        }
    }

    Ast quantified(Ast atom) {
        uint32_t min = 0, max = 0;
        if (!quantifier(min, max)) return atom;
        if (peek() == '+') fail("possessive quantifiers are not supported");
        take("?");  // lazy: the same whole matches
        const size_t here = pos_;
        uint32_t a = 0, b = 0;
        if (quantifier(a, b)) {
            pos_ = here;
            fail("multiple repeat");
        }
        Ast r;
        r.kind = Ast::Kind::repeat;
        r.min = min;
        r.max = max;
        r.kids.push_back(std::move(atom));
        return r;
    }

    Ast atom() {
        const char c = peek();
        if (c == '(') return group();
        if (c == '[') return Ast::of(char_class());
        if (c == '.') {
            ++pos_;
            return Ast::of(complement(ecma_ ? ecma_line_ends() : CodeSet{{'\n', '\n'}}));
        }
        if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
        if (c == '{') {
            uint32_t a = 0, b = 0;
            const size_t here = pos_;
            if (bounds(a, b)) {
                pos_ = here;
                fail("nothing to repeat");
            }
        }
        if (c == '\\') return Ast::of(escape(false));
        const uint32_t cp = code_point();
        return Ast::of(single(cp));
    }

    static CodeSet single(uint32_t cp) { return {{cp, cp}}; }

    // The UTF-8 character at pos_, taken.
    uint32_t code_point() {
        const size_t len = utf8_sequence_length(p_, pos_);
        if (len == 0) fail("the pattern is not valid UTF-8");
        const uint32_t cp = utf8_decode_at(p_, pos_, len);
        pos_ += len;
        return cp;
    }

    Ast group() {
        const size_t open = pos_;
        ++pos_;  // (
        if (take("?")) {
            if (take(":")) {
            } else if (take("P<") ||
                       (ecma_ && peek() == '<' && peek(1) != '=' && peek(1) != '!' && take("<"))) {
                const size_t name = pos_;
                while (!at_end() &&
                       (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '_'))
                    ++pos_;
                if (pos_ == name || !take(">")) fail("bad group name");
            } else if (peek() == '=' || peek() == '!') {
                fail("lookahead is not supported");
            } else if (peek() == '<' && (peek(1) == '=' || peek(1) == '!')) {
                fail("lookbehind is not supported");
            } else if (peek() == 'P' && peek(1) == '=') {
                fail("backreferences are not supported");
            } else if (peek() == '>') {
                fail("atomic groups are not supported");
            } else if (peek() == '(') {
                fail("conditional groups are not supported");
            } else {
                fail("inline flags and other (? groups are not supported");
            }
        }
        if (++depth_ > RegexDfa::kMaxGroupDepth)
            fail("groups nest deeper than " + std::to_string(RegexDfa::kMaxGroupDepth));
        Ast inner = alternation();
        --depth_;
        if (!take(")")) {
            pos_ = open;
            fail("missing ), unterminated subpattern");
        }
        return inner;
    }

    uint32_t hex(size_t digits) {
        uint32_t v = 0;
        for (size_t i = 0; i < digits; ++i) {
            const char h = peek();
            int d = -1;
            if (h >= '0' && h <= '9') d = h - '0';
            if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
            if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
            if (d < 0) fail("incomplete escape");
            v = v * 16 + static_cast<uint32_t>(d);
            ++pos_;
        }
        if (v > kMaxCodePoint) fail("bad escape (beyond U+10FFFF)");
        return v;
    }

    // The escape at pos_ (a backslash), taken: a class (\d ...) or one character. In a class
    // \b is a backspace; outside, the anchors were taken by sequence().
    CodeSet escape(bool in_class) {
        ++pos_;  // backslash
        if (at_end()) fail("bad escape (end of pattern)");
        const char c = peek();
        switch (c) {
            case 'd':
                return ++pos_, digits();
            case 'D':
                return ++pos_, complement(digits());
            case 'w':
                return ++pos_, word();
            case 'W':
                return ++pos_, complement(word());
            case 's':
                return ++pos_, ecma_ ? ecma_spaces() : spaces();
            case 'S':
                return ++pos_, complement(ecma_ ? ecma_spaces() : spaces());
            case 'n':
                return ++pos_, single('\n');
            case 't':
                return ++pos_, single('\t');
            case 'r':
                return ++pos_, single('\r');
            case 'f':
                return ++pos_, single('\f');
            case 'v':
                return ++pos_, single('\v');
            case 'a':
                return ++pos_, single('\a');
            case 'x':
                return ++pos_, single(hex(2));
            case 'u':
                return ++pos_, single(hex(4));
            case 'U':
                if (ecma_) break;
                return ++pos_, single(hex(8));
            case '0': {  // \0, \0o, \0oo: octal
                ++pos_;
                uint32_t v = 0;
                for (int i = 0; i < 2 && peek() >= '0' && peek() <= '7'; ++i, ++pos_)
                    v = v * 8 + static_cast<uint32_t>(peek() - '0');
                return single(v);
            }
            case 'b':
                if (in_class) return ++pos_, single('\b');
                fail("word boundaries (\\b) are not supported");
            default:
                break;
        }
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if (std::isalpha(static_cast<unsigned char>(c)) != 0)
            fail(std::string("bad escape \\") + c);
        return single(code_point());
    }

    // [...] at pos_, taken.
    CodeSet char_class() {
        const size_t open = pos_;
        ++pos_;  // [
        const bool negate = take("^");
        CodeSet set;
        for (bool first = true;; first = false) {
            if (at_end()) {
                pos_ = open;
                fail("unterminated character set");
            }
            if (peek() == ']' && (!first || ecma_)) {  // ECMAScript: [] none, [^] any
                ++pos_;
                break;
            }
            // One item: a class escape, or a character that may start a range.
            CodeSet item = peek() == '\\' ? escape(true) : single(code_point());
            if (peek() == '-' && peek(1) != ']' && pos_ + 1 < p_.size()) {
                if (item.size() != 1 || item[0].lo != item[0].hi) fail("bad character range");
                ++pos_;  // -
                const size_t at = pos_;
                const CodeSet end = peek() == '\\' ? escape(true) : single(code_point());
                if (end.size() != 1 || end[0].lo != end[0].hi || end[0].lo < item[0].lo) {
                    pos_ = at;
                    fail("bad character range");
                }
                item[0].hi = end[0].lo;
            }
            set.insert(set.end(), item.begin(), item.end());
        }
        return negate ? complement(set) : normalized(set);
    }

    std::string_view p_;
    const std::string& where_;
    const bool ecma_;  // a JSON schema's pattern: ECMA-262's classes, searched for
    size_t pos_ = 0;
    uint32_t depth_ = 0;
};

// The UTF-8 byte sequences of the code points [lo, hi] (within one encoded length and no
// surrogates): each sequence a byte range per position, every code point in exactly one.
using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out) {
    static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
    for (uint32_t end : kLengthEnds)  // split where the encoded length changes
        if (lo <= end && hi > end) {
            utf8_sequences(lo, end, out);
            utf8_sequences(end + 1, hi, out);
            return;
        }
    if (hi <= 0x7F) {
        out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
        return;
    }
    // Split until the range is a product of byte ranges: below each continuation position i
    // the low 6 i bits must run over all their values.
    const int n = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < n; ++i) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_sequences(lo, lo | m, out);
                utf8_sequences((lo | m) + 1, hi, out);
                return;
            }
            if ((hi & m) != m) {
                utf8_sequences(lo, (hi & ~m) - 1, out);
                utf8_sequences(hi & ~m, hi, out);
                return;
            }
        }
    }
    std::string a, b;
    append_utf8(a, lo);
    append_utf8(b, hi);
    ByteSeq seq;
    for (size_t j = 0; j < a.size(); ++j)
        seq.emplace_back(static_cast<uint8_t>(a[j]), static_cast<uint8_t>(b[j]));
    out.push_back(std::move(seq));
}

constexpr uint32_t kNone = UINT32_MAX;

// A Thompson NFA over bytes: each state has one byte-range edge (lo <= hi) or epsilon edges.
struct NState {
    uint8_t lo = 1, hi = 0;
    uint32_t out = kNone;
    std::vector<uint32_t> eps;
};

class NfaBuilder {
  public:
    explicit NfaBuilder(const std::string& where) : where_(where) {}
    struct Frag {
        uint32_t in, out;
    };

    Frag build(const Ast& a) {
        switch (a.kind) {
            case Ast::Kind::set: {
                const Frag f{add(), add()};
                std::vector<ByteSeq> seqs;
                for (Range r : a.set) utf8_sequences(r.lo, r.hi, seqs);
                for (const ByteSeq& seq : seqs) {
                    uint32_t cur = add();
                    s_[f.in].eps.push_back(cur);
                    for (size_t j = 0; j < seq.size(); ++j) {
                        const uint32_t to = j + 1 == seq.size() ? f.out : add();
                        s_[cur].lo = seq[j].first;
                        s_[cur].hi = seq[j].second;
                        s_[cur].out = to;
                        cur = to;
                    }
                }
                return f;
            }
            case Ast::Kind::concat: {
                const uint32_t in = add();
                uint32_t cur = in;
                for (const Ast& k : a.kids) cur = then(cur, build(k));
                return {in, cur};
            }
            case Ast::Kind::alt: {
                const Frag f{add(), add()};
                for (const Ast& k : a.kids) {
                    const Frag g = build(k);
                    s_[f.in].eps.push_back(g.in);
                    s_[g.out].eps.push_back(f.out);
                }
                return f;
            }
            case Ast::Kind::repeat: {
                const uint32_t in = add();
                uint32_t cur = in;
                for (uint32_t i = 0; i < a.min; ++i) cur = then(cur, build(a.kids[0]));
                if (a.max == kUnbounded) {
                    const uint32_t loop = add();
                    s_[cur].eps.push_back(loop);
                    const Frag g = build(a.kids[0]);
                    s_[loop].eps.push_back(g.in);
                    s_[g.out].eps.push_back(loop);
                    return {in, loop};
                }
                const uint32_t out = add();
                for (uint32_t i = a.min; i < a.max; ++i) {
                    s_[cur].eps.push_back(out);
                    cur = then(cur, build(a.kids[0]));
                }
                s_[cur].eps.push_back(out);
                return {in, out};
            }
        }
        return {add(), add()};
    }

    std::vector<NState> take() { return std::move(s_); }

  private:
    uint32_t add() {
        if (s_.size() >= RegexDfa::kMaxNfaStates)
            throw Error(where_ + ": the pattern is too large (its automaton passes " +
                        std::to_string(RegexDfa::kMaxNfaStates) + " states)");
        s_.emplace_back();
        return static_cast<uint32_t>(s_.size() - 1);
    }
    uint32_t then(uint32_t cur, Frag f) {
        s_[cur].eps.push_back(f.in);
        return f.out;
    }
    const std::string& where_;
    std::vector<NState> s_;
};

}  // namespace

// The subset construction and the pruning to live states.
class DfaBuilder {
  public:
    static RegexDfa build(const Ast& ast, const std::string& where) {
        NfaBuilder nb(where);
        const NfaBuilder::Frag f = nb.build(ast);
        const std::vector<NState> nfa = nb.take();

        RegexDfa d;
        // Byte classes: a new class wherever some edge starts or stops.
        std::array<bool, 257> cut{};
        for (const NState& s : nfa)
            if (s.lo <= s.hi) cut[s.lo] = cut[static_cast<size_t>(s.hi) + 1] = true;
        std::vector<uint8_t> representative;  // the first byte of each class
        for (int b = 0; b < 256; ++b) {
            if (b == 0 || cut[static_cast<size_t>(b)])
                representative.push_back(static_cast<uint8_t>(b));
            d.class_of_[static_cast<size_t>(b)] = static_cast<uint8_t>(representative.size() - 1);
        }
        d.classes_ = static_cast<uint32_t>(representative.size());

        // A DFA state: the NFA states with byte edges that the closure reaches, and whether it
        // reaches the match's end. State 0 (kDead) is the empty set.
        using Key = std::pair<std::vector<uint32_t>, bool>;
        std::map<Key, uint32_t> ids;
        std::vector<Key> keys;
        std::vector<uint32_t> stack;
        std::vector<uint32_t> seen(nfa.size(), UINT32_MAX);
        uint32_t stamp = 0;
        uint64_t work = 0;
        // The closures' total steps (tens of milliseconds): patterns whose every state's closure
        // spans most of the NFA ((a?){1000}) stop here, so a request cannot hold a thread.
        constexpr uint64_t kMaxClosureSteps = 20'000'000;
        const auto closure = [&](std::vector<uint32_t> from) {
            ++stamp;
            Key k{{}, false};
            stack = std::move(from);
            while (!stack.empty()) {
                const uint32_t s = stack.back();
                stack.pop_back();
                if (seen[s] == stamp) continue;
                seen[s] = stamp;
                if (++work > kMaxClosureSteps)
                    throw Error(where + ": the pattern is too complex to follow");
                if (s == f.out) k.second = true;
                if (nfa[s].lo <= nfa[s].hi) k.first.push_back(s);
                for (uint32_t e : nfa[s].eps) stack.push_back(e);
            }
            std::sort(k.first.begin(), k.first.end());
            return k;
        };
        const auto id_of = [&](Key k) {
            if (k.first.empty() && !k.second) return RegexDfa::kDead;
            auto [it, fresh] = ids.emplace(k, static_cast<uint32_t>(keys.size()));
            if (fresh) {
                if (keys.size() > RegexDfa::kMaxDfaStates ||
                    keys.size() * d.classes_ > RegexDfa::kMaxDfaCells)
                    throw Error(where + ": the pattern is too complex (its automaton passes " +
                                std::to_string(RegexDfa::kMaxDfaStates) + " states or " +
                                std::to_string(RegexDfa::kMaxDfaCells) + " transitions)");
                keys.push_back(std::move(k));
            }
            return it->second;
        };
        keys.push_back({{}, false});  // kDead
        d.start_ = id_of(closure({f.in}));
        for (uint32_t i = 0; i < keys.size(); ++i) {
            d.accepting_.push_back(keys[i].second ? 1 : 0);
            for (uint8_t b : representative) {
                std::vector<uint32_t> moved;
                for (uint32_t s : keys[i].first)
                    if (nfa[s].lo <= b && b <= nfa[s].hi) moved.push_back(nfa[s].out);
                d.next_.push_back(moved.empty() ? RegexDfa::kDead : id_of(closure(moved)));
            }
        }
        prune(d, where);
        return d;
    }

    // The texts both take: the product of their states that the start pair reaches.
    static RegexDfa both(const RegexDfa& a, const RegexDfa& b, const std::string& where) {
        RegexDfa d;
        std::map<std::pair<uint8_t, uint8_t>, uint8_t> classes;  // (a's, b's) -> the product's
        std::vector<uint8_t> representative;
        for (int x = 0; x < 256; ++x) {
            const auto key =
                std::pair{a.class_of_[static_cast<size_t>(x)], b.class_of_[static_cast<size_t>(x)]};
            auto [it, fresh] = classes.emplace(key, static_cast<uint8_t>(representative.size()));
            if (fresh) representative.push_back(static_cast<uint8_t>(x));
            d.class_of_[static_cast<size_t>(x)] = it->second;
        }
        d.classes_ = static_cast<uint32_t>(representative.size());
        std::map<std::pair<uint32_t, uint32_t>, uint32_t> ids;
        std::vector<std::pair<uint32_t, uint32_t>> pairs = {{RegexDfa::kDead, RegexDfa::kDead}};
        const auto id_of = [&](uint32_t i, uint32_t j) {
            if (i == RegexDfa::kDead || j == RegexDfa::kDead) return RegexDfa::kDead;
            auto [it, fresh] = ids.emplace(std::pair{i, j}, static_cast<uint32_t>(pairs.size()));
            if (fresh) {
                if (pairs.size() > RegexDfa::kMaxDfaStates ||
                    pairs.size() * d.classes_ > RegexDfa::kMaxDfaCells)
                    throw Error(where +
                                ": the constraints together are too complex (their "
                                "automaton passes " +
                                std::to_string(RegexDfa::kMaxDfaStates) + " states or " +
                                std::to_string(RegexDfa::kMaxDfaCells) + " transitions)");
                pairs.emplace_back(i, j);
            }
            return it->second;
        };
        d.start_ = id_of(a.start_, b.start_);
        for (uint32_t s = 0; s < pairs.size(); ++s) {
            const auto [i, j] = pairs[s];
            d.accepting_.push_back(a.accepting(i) && b.accepting(j) ? 1 : 0);
            for (uint8_t x : representative) d.next_.push_back(id_of(a.next(i, x), b.next(j, x)));
        }
        if (d.start_ == RegexDfa::kDead) throw Error(where + ": the constraints match no text");
        prune(d, where);
        return d;
    }

  private:
    // States from which no match can be reached lead nowhere: every edge into them goes to
    // kDead, so a matcher stops at the first byte that cannot begin a match.
    static void prune(RegexDfa& d, const std::string& where) {
        const size_t n = d.accepting_.size(), c = d.classes_;
        std::vector<std::vector<uint32_t>> into(n);
        for (size_t s = 0; s < n; ++s)
            for (size_t k = 0; k < c; ++k)
                into[d.next_[s * c + k]].push_back(static_cast<uint32_t>(s));
        std::vector<uint8_t> live(n, 0);
        std::vector<uint32_t> work;
        for (size_t s = 1; s < n; ++s)
            if (d.accepting_[s]) live[s] = 1, work.push_back(static_cast<uint32_t>(s));
        while (!work.empty()) {
            const uint32_t s = work.back();
            work.pop_back();
            for (uint32_t p : into[s])
                if (!live[p]) live[p] = 1, work.push_back(p);
        }
        if (!live[d.start_]) throw Error(where + ": the pattern matches no text");
        d.finished_.assign(n, 0);
        for (size_t s = 0; s < n; ++s) {
            bool any = false;
            for (size_t k = 0; k < c; ++k) {
                uint32_t& to = d.next_[s * c + k];
                if (!live[to]) to = RegexDfa::kDead;
                any = any || to != RegexDfa::kDead;
            }
            d.finished_[s] = d.accepting_[s] && !any ? 1 : 0;
        }
    }
};

RegexDfa RegexDfa::compile(std::string_view pattern, const std::string& where, Syntax syntax) {
    if (pattern.size() > kMaxPatternBytes)
        throw Error(where + ": the pattern is longer than " + std::to_string(kMaxPatternBytes) +
                    " bytes");
    return DfaBuilder::build(Parser(pattern, where, syntax).parse(), where);
}

RegexDfa RegexDfa::both(const RegexDfa& a, const RegexDfa& b, const std::string& where) {
    return DfaBuilder::both(a, b, where);
}

RegexDfa RegexDfa::choice(const std::vector<std::string>& texts, const std::string& where) {
    if (texts.empty()) throw Error(where + ": needs at least one text");
    if (texts.size() > kMaxChoices)
        throw Error(where + ": more than " + std::to_string(kMaxChoices) + " texts");
    std::vector<Ast> alts;
    size_t bytes = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        const std::string& t = texts[i];
        bytes += t.size();
        if (bytes > kMaxPatternBytes)
            throw Error(where + ": the texts are longer than " + std::to_string(kMaxPatternBytes) +
                        " bytes together");
        std::vector<Ast> chars;
        for (size_t j = 0; j < t.size();) {
            const size_t len = utf8_sequence_length(t, j);
            if (len == 0) throw Error(where + "[" + std::to_string(i) + "]: is not valid UTF-8");
            const uint32_t cp = utf8_decode_at(t, j, len);
            chars.push_back(Ast::of(CodeSet{{cp, cp}}));
            j += len;
        }
        alts.push_back(Ast::of(Ast::Kind::concat, std::move(chars)));
    }
    return DfaBuilder::build(Ast::of(Ast::Kind::alt, std::move(alts)), where);
}

}  // namespace qforge
