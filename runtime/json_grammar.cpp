#include "runtime/json_grammar.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "core/error.hpp"

namespace qforge {

namespace {

using ojson = nlohmann::ordered_json;

bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

int hex_value(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Phases of an object frame, an array frame and a string frame.
enum : uint8_t { kObjOpen, kObjKeyNext, kObjColon, kObjValue, kObjAfter };
enum : uint8_t { kArrOpen, kArrValue, kArrAfter };
enum : uint8_t {
    kStrChar,
    kStrEscape,
    kStrU1,                         // the four digits of \uXXXX: kStrU1 .. kStrU1 + 3
    kStrLowBackslash = kStrU1 + 4,  // a high surrogate was read: its low half must follow
    kStrLowU,
    kStrL1,  // the low half's four digits: kStrL1 .. kStrL1 + 3
};
// A number's states (RFC 8259's grammar); the complete ones are zero, int, frac and exp.
enum : uint8_t {
    kNumStart,
    kNumMinus,
    kNumZero,
    kNumInt,
    kNumDot,
    kNumFrac,
    kNumE,
    kNumESign,
    kNumExp
};
bool number_complete(uint8_t s) {
    return s == kNumZero || s == kNumInt || s == kNumFrac || s == kNumExp;
}
constexpr uint32_t kMaxExponentDigits = 2;

}  // namespace

// ---- grammar -------------------------------------------------------------------------------

JsonGrammar::JsonGrammar() {
    nodes_.resize(7);
    nodes_[kAny].kind = Kind::any;
    nodes_[kBoolean].kind = Kind::literals;
    nodes_[kBoolean].literals = {"true", "false"};
    nodes_[kNull].kind = Kind::literals;
    nodes_[kNull].literals = {"null"};
    nodes_[kAnyObject].kind = Kind::object;
    nodes_[kAnyObject].free_keys = true;
    nodes_[kAnyObject].values = kAny;
    nodes_[kAnyArray].kind = Kind::array;
    nodes_[kAnyArray].values = kAny;
    nodes_[kString].kind = Kind::string;
    nodes_[kNumber].kind = Kind::number;
}

JsonGrammar JsonGrammar::any_object() {
    JsonGrammar g;
    g.root_ = kAnyObject;
    g.derive();
    return g;
}

void JsonGrammar::derive() {
    const size_t n = nodes_.size();
    // First bytes: the least fixed point (a choice or alias takes its targets').
    first_.assign(n, {});
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = 0; i < n; ++i) {
            const Node& node = nodes_[i];
            std::bitset<256> f;
            switch (node.kind) {
                case Kind::any:
                    for (uint8_t c : std::string_view("{[\"-0123456789tfn")) f.set(c);
                    break;
                case Kind::object:
                    f.set('{');
                    break;
                case Kind::array:
                    f.set('[');
                    break;
                case Kind::string:
                    f.set('"');
                    break;
                case Kind::number:
                case Kind::integer:
                    for (uint8_t c : std::string_view("-0123456789")) f.set(c);
                    break;
                case Kind::literals:
                    for (const std::string& t : node.literals) f.set(static_cast<uint8_t>(t[0]));
                    break;
                case Kind::choice:
                    for (uint32_t o : node.options) f |= first_[o];
                    break;
                case Kind::alias:
                    f = first_[node.values];
                    break;
            }
            if (f != first_[i]) {
                first_[i] = f;
                changed = true;
            }
        }
    }
    // The fewest nested objects and arrays: the greatest fixed point from "none" (an object
    // nests its required properties' values, an array its items if it needs one).
    constexpr uint32_t kNone = UINT32_MAX;
    min_depth_.assign(n, kNone);
    const auto plus_one = [](uint32_t d) { return d == kNone ? kNone : d + 1; };
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = 0; i < n; ++i) {
            const Node& node = nodes_[i];
            uint32_t d = 0;
            switch (node.kind) {
                case Kind::object:
                    d = 1;
                    for (const Property& p : node.properties)
                        if (p.required) d = std::max(d, plus_one(min_depth_[p.node]));
                    break;
                case Kind::array:
                    d = plus_one(node.min_items > 0 ? min_depth_[node.values] : 0);
                    break;
                case Kind::choice:
                    d = kNone;
                    for (uint32_t o : node.options) d = std::min(d, min_depth_[o]);
                    break;
                case Kind::alias:
                    d = min_depth_[node.values];
                    break;
                default:
                    break;  // scalars and literals open no object or array frame
            }
            if (d != min_depth_[i]) {
                min_depth_[i] = d;
                changed = true;
            }
        }
    }
}

// A schema into a grammar's nodes (the subset in json_grammar.hpp).
class SchemaCompiler {
  public:
    SchemaCompiler(JsonGrammar& g, const ojson& root, std::string where)
        : g_(g), root_(root), where_(std::move(where)) {}

    uint32_t compile(const ojson& s, const std::string& path) {
        if (++depth_ > JsonGrammar::kMaxSchemaDepth)
            fail(path, "nests deeper than " + std::to_string(JsonGrammar::kMaxSchemaDepth) +
                           " schemas ($ref hops included)");
        const uint32_t node = compile_one(s, path);
        --depth_;
        return node;
    }

    // The checks that need every node in place: $ref chains that end, values that exist (with
    // finite nesting), alternatives that start apart; then the grammar's derived tables.
    void finish(uint32_t root) {
        JsonGrammar& g = g_;
        for (size_t i = 0; i < g.nodes_.size(); ++i) {
            uint32_t at = static_cast<uint32_t>(i);
            for (size_t hops = 0; g.nodes_[at].kind == JsonGrammar::Kind::alias; ++hops) {
                if (hops > g.nodes_.size()) fail(paths_[i], "refers to itself and nothing else");
                at = g.nodes_[at].values;
            }
        }
        g.derive();
        // A node with no value (it requires itself, or refers only to itself) is never entered:
        // no byte starts it and it never fits the nesting. The root must have one.
        if (g.first_[root].none() || g.min_depth_[root] == UINT32_MAX)
            fail(paths_[root], "has no value (it requires itself, or refers only to itself)");
        if (g.min_depth_[root] > JsonGrammar::kMaxDepth)
            fail(paths_[root], "needs objects and arrays nested deeper than " +
                                   std::to_string(JsonGrammar::kMaxDepth));
        for (size_t i = 0; i < g.nodes_.size(); ++i) {
            if (g.nodes_[i].kind != JsonGrammar::Kind::choice) continue;
            std::bitset<256> seen;
            for (uint32_t o : g.nodes_[i].options) {
                if ((seen & g.first_[o]).any())
                    fail(paths_[i],
                         "alternatives that can start alike (the same type) are not supported");
                seen |= g.first_[o];
            }
        }
        g.root_ = root;
    }

  private:
    uint32_t compile_one(const ojson& s, const std::string& path) {
        if (s.is_boolean()) {
            if (s.get<bool>()) return JsonGrammar::kAny;
            fail(path, "false matches nothing");
        }
        if (!s.is_object()) fail(path, "must be a schema (an object or a boolean)");
        static const std::set<std::string> kKnown = {"type",
                                                     "properties",
                                                     "required",
                                                     "additionalProperties",
                                                     "items",
                                                     "minItems",
                                                     "maxItems",
                                                     "enum",
                                                     "const",
                                                     "anyOf",
                                                     "oneOf",
                                                     "$ref",
                                                     "pattern",
                                                     "format",
                                                     "minLength",
                                                     "maxLength",
                                                     "minimum",
                                                     "maximum",
                                                     "exclusiveMinimum",
                                                     "exclusiveMaximum"};
        for (const auto& [key, value] : s.items())
            if (!kKnown.count(key) && !ignored(key))
                fail(path + "." + key, "is not supported by constrained generation");
        if (const auto r = s.find("$ref"); r != s.end()) {
            alone(s, path, "$ref", {});
            return reference(*r, path + ".$ref");
        }
        if (s.contains("enum") || s.contains("const")) {
            alone(s, path, s.contains("enum") ? "enum" : "const", {"enum", "const", "type"});
            return literals(s, path);
        }
        for (const char* name : {"anyOf", "oneOf"})
            if (const auto a = s.find(name); a != s.end()) {
                alone(s, path, name, {});
                if (!a->is_array() || a->empty())
                    fail(path + "." + name, "must be a non-empty array");
                std::vector<uint32_t> options;
                for (size_t i = 0; i < a->size(); ++i)
                    options.push_back(
                        compile((*a)[i], path + "." + name + "[" + std::to_string(i) + "]"));
                return choice(std::move(options), path + "." + name);
            }
        const auto type = s.find("type");
        if (type == s.end()) {
            if (s.contains("properties") || s.contains("required") ||
                s.contains("additionalProperties"))
                return typed(s, "object", path);
            if (s.contains("items") || s.contains("minItems") || s.contains("maxItems"))
                return typed(s, "array", path);
            for (const char* k : {"pattern", "format", "minLength", "maxLength"})
                if (s.contains(k)) return typed(s, "string", path);
            for (const char* k : kBounds)
                if (s.contains(k)) return typed(s, "integer", path);
            return JsonGrammar::kAny;
        }
        if (type->is_string()) return typed(s, type->get<std::string>(), path);
        if (!type->is_array() || type->empty())
            fail(path + ".type", "must be a type name or a non-empty array of them");
        std::vector<uint32_t> options;
        for (const auto& t : *type) {
            if (!t.is_string()) fail(path + ".type", "must hold type names");
            options.push_back(typed(s, t.get<std::string>(), path));
        }
        return options.size() == 1 ? options[0] : choice(std::move(options), path + ".type");
    }

    // Annotations, and the definitions a $ref reads: no constraint on the value.
    static bool ignored(const std::string& key) {
        static const std::set<std::string> kIgnored = {
            "title",    "description", "$schema",  "$id",       "$comment", "default",
            "examples", "deprecated",  "readOnly", "writeOnly", "$defs",    "definitions"};
        return kIgnored.count(key) > 0;
    }

    // `keyword` takes the schema's whole meaning: any other constraint beside it (but `with`)
    // would be dropped, so it is refused instead.
    void alone(const ojson& s, const std::string& path, const char* keyword,
               const std::set<std::string>& with) const {
        for (const auto& [key, value] : s.items())
            if (key != keyword && !ignored(key) && !with.count(key))
                fail(path + "." + key, std::string("beside ") + keyword + " is not supported");
    }

  private:
    [[noreturn]] void fail(const std::string& path, const std::string& why) const {
        throw Error(where_ + shortened(path) + ": " + why);
    }

    // A path for a message: its start and its end around "...", when long (a long key, or many
    // $ref hops, would otherwise repeat in every node's and every message's copy).
    static std::string shortened(const std::string& path) {
        constexpr size_t kHead = 60, kTail = 140;
        if (path.size() <= kHead + kTail + 3) return path;
        return path.substr(0, kHead) + "..." + path.substr(path.size() - kTail);
    }

    static JsonGrammar::Node of_kind(JsonGrammar::Kind kind) {
        JsonGrammar::Node n;
        n.kind = kind;
        return n;
    }

    uint32_t add(JsonGrammar::Node n, const std::string& path) {
        if (g_.nodes_.size() >= JsonGrammar::kMaxSchemaNodes)
            fail(path, "makes the schema more than " +
                           std::to_string(JsonGrammar::kMaxSchemaNodes) + " schemas");
        g_.nodes_.push_back(std::move(n));
        paths_.push_back(shortened(path));
        return static_cast<uint32_t>(g_.nodes_.size() - 1);
    }

    uint32_t typed(const ojson& s, const std::string& type, const std::string& path) {
        using Kind = JsonGrammar::Kind;
        if (type == "string") return string_node(s, path);
        if (type == "number") {
            for (const char* k : kBounds)
                if (s.contains(k))
                    fail(path + "." + k, "is supported for integers only (type integer)");
            return JsonGrammar::kNumber;
        }
        if (type == "boolean") return JsonGrammar::kBoolean;
        if (type == "null") return JsonGrammar::kNull;
        if (type == "integer") return integer_node(s, path);
        if (type == "array") {
            JsonGrammar::Node n = of_kind(Kind::array);
            n.values = JsonGrammar::kAny;
            if (const auto i = s.find("items"); i != s.end())
                n.values = compile(*i, path + ".items");
            n.min_items = count(s, "minItems", path, 0);
            n.max_items = count(s, "maxItems", path, UINT64_MAX);
            if (n.min_items > n.max_items) fail(path + ".minItems", "is above maxItems");
            return add(std::move(n), path);
        }
        if (type != "object")
            fail(path + ".type", "\"" + type +
                                     "\" is not a type (object, array, string, number, integer, "
                                     "boolean, null)");
        JsonGrammar::Node n = of_kind(Kind::object);
        std::vector<std::string> required;
        if (const auto r = s.find("required"); r != s.end()) {
            if (!r->is_array()) fail(path + ".required", "must be an array of property names");
            for (const auto& name : *r) {
                if (!name.is_string()) fail(path + ".required", "must hold property names");
                required.push_back(name.get<std::string>());
            }
        }
        const auto is_required = [&](const std::string& key) {
            return std::find(required.begin(), required.end(), key) != required.end();
        };
        std::set<std::string> keys;
        if (const auto p = s.find("properties"); p != s.end()) {
            if (!p->is_object()) fail(path + ".properties", "must be an object of schemas");
            for (const auto& [key, schema] : p->items()) {
                n.properties.push_back({ojson(key).dump(),
                                        compile(schema, path + ".properties." + key),
                                        is_required(key)});
                keys.insert(key);
            }
        }
        uint32_t values = JsonGrammar::kAny;
        bool extra = true;
        if (const auto a = s.find("additionalProperties"); a != s.end()) {
            if (a->is_boolean())
                extra = a->get<bool>();
            else
                values = compile(*a, path + ".additionalProperties");
        }
        // A required name that no property declares: an additional property, required.
        for (const std::string& key : required)
            if (keys.insert(key).second) {
                if (!extra)
                    fail(path + ".required",
                         "names \"" + key + "\", which additionalProperties false forbids");
                n.properties.push_back({ojson(key).dump(), values, true});
            }
        if (n.properties.size() > JsonGrammar::kMaxLiterals)
            fail(path + ".properties",
                 "has more than " + std::to_string(JsonGrammar::kMaxLiterals) + " properties");
        // Beside declared properties only they are generated (a valid instance either way).
        n.free_keys = n.properties.empty() && extra;
        n.values = values;
        return add(std::move(n), path);
    }

    // A string; with pattern, format, minLength or maxLength, one whose content (the characters
    // its escapes stand for) a DFA takes: theirs together, less the control characters a JSON
    // string could carry only as \u escapes (which such a string does not take: its matcher
    // follows the characters as they come, so no prefix it takes is a dead end).
    uint32_t string_node(const ojson& s, const std::string& path) {
        const auto p = s.find("pattern");
        if (p != s.end() && !p->is_string()) fail(path + ".pattern", "must be a string");
        const Format* format = nullptr;
        if (const auto f = s.find("format"); f != s.end()) {
            const std::string name = f->is_string() ? f->get<std::string>() : f->dump();
            format = std::find_if(std::begin(kFormats), std::end(kFormats),
                                  [&](const Format& k) { return name == k.name; });
            if (format == std::end(kFormats))
                fail(path + ".format", "\"" + name +
                                           "\" is not supported (date, time, date-time, uuid, "
                                           "email, ipv4)");
        }
        const uint64_t lo = count(s, "minLength", path, 0);
        const uint64_t hi = count(s, "maxLength", path, UINT64_MAX);
        if (lo > hi) fail(path + ".minLength", "is above maxLength");
        const bool lengths = lo > 0 || hi != UINT64_MAX;
        if (lengths &&
            (lo > RegexDfa::kMaxRepeat || (hi != UINT64_MAX && hi > RegexDfa::kMaxRepeat)))
            fail(path + (lo > RegexDfa::kMaxRepeat ? ".minLength" : ".maxLength"),
                 "is above " + std::to_string(RegexDfa::kMaxRepeat) +
                     ", more than constrained generation bounds");
        if (p == s.end() && !format && !lengths) return JsonGrammar::kString;
        const std::string bound = "[\\s\\S]{" + std::to_string(lo) + "," +
                                  (hi == UINT64_MAX ? "" : std::to_string(hi)) + "}";
        const std::string key = std::string("string\x1f") +
                                (p != s.end() ? "/" + p->get<std::string>() : "") + "\x1f" +
                                (format ? format->name : "") + "\x1f" + (lengths ? bound : "");
        JsonGrammar::Node n = of_kind(JsonGrammar::Kind::string);
        n.pattern = pattern_index(key, path, [&] {
            const std::string at = where_ + shortened(path);
            std::optional<RegexDfa> dfa;
            const auto with = [&](RegexDfa d, const std::string& where) {
                dfa = dfa ? RegexDfa::both(*dfa, d, where) : std::move(d);
            };
            if (p != s.end())
                with(RegexDfa::compile(p->get<std::string>(), at + ".pattern",
                                       RegexDfa::Syntax::json_schema),
                     at + ".pattern");
            if (format) with(RegexDfa::compile(format->pattern, at + ".format"), at + ".format");
            if (lengths) with(RegexDfa::compile(bound, at + ".minLength"), at + ".minLength");
            with(RegexDfa::compile(kJsonWritable, at), at);
            return std::move(*dfa);
        });
        return add(std::move(n), path);
    }

    // A node's DFA by what it is made from: one per distinct constraint, at most
    // JsonGrammar::kMaxPatterns of them and RegexDfa::kMaxDfaCells transitions in all, so that
    // a request's schema cannot make thousands of large automata.
    template <class Make>
    uint32_t pattern_index(const std::string& key, const std::string& path, const Make& make) {
        if (const auto it = pattern_ids_.find(key); it != pattern_ids_.end()) return it->second;
        if (g_.patterns_.size() >= JsonGrammar::kMaxPatterns)
            fail(path, "makes more than " + std::to_string(JsonGrammar::kMaxPatterns) +
                           " distinct patterns, formats, lengths and bounds in one schema");
        RegexDfa d = make();
        pattern_cells_ += d.cells();
        if (pattern_cells_ > RegexDfa::kMaxDfaCells)
            fail(path, "makes the schema's automata pass " +
                           std::to_string(RegexDfa::kMaxDfaCells) + " transitions in all");
        const auto index = static_cast<uint32_t>(g_.patterns_.size());
        g_.patterns_.push_back(std::move(d));
        pattern_ids_.emplace(key, index);
        return index;
    }

    static constexpr const char* kBounds[] = {"minimum", "maximum", "exclusiveMinimum",
                                              "exclusiveMaximum"};
    static constexpr int64_t kMaxBound = 999999999999999999;  // 18 digits

    // An integer; with bounds, one whose text a DFA takes: the decimal texts of the integers in
    // range (no leading zeros, no -0), so a number taken so far can always end in range.
    uint32_t integer_node(const ojson& s, const std::string& path) {
        std::optional<int64_t> lo, hi;
        const auto bound = [&](const char* name, bool upper, bool exclusive) {
            const auto v = s.find(name);
            if (v == s.end()) return;
            if (!v->is_number())
                fail(path + "." + name,
                     v->is_boolean() ? "must be a number (draft 4's boolean form is not supported)"
                                     : "must be a number");
            const double x = v->get<double>();
            if (!(std::fabs(x) <= static_cast<double>(kMaxBound)))
                fail(path + "." + name, "is beyond +-" + std::to_string(kMaxBound));
            // The integers within: ceil for a lower bound, floor for an upper; exclusive ones
            // step past an integer bound.
            double b = upper ? std::floor(x) : std::ceil(x);
            if (exclusive && b == x) b += upper ? -1 : 1;
            const auto n = static_cast<int64_t>(b);
            std::optional<int64_t>& side = upper ? hi : lo;
            side = side ? (upper ? std::min(*side, n) : std::max(*side, n)) : n;
        };
        bound("minimum", false, false);
        bound("exclusiveMinimum", false, true);
        bound("maximum", true, false);
        bound("exclusiveMaximum", true, true);
        JsonGrammar::Node n = of_kind(JsonGrammar::Kind::integer);
        if (!lo && !hi) return add(std::move(n), path);
        if (lo && hi && *lo > *hi) fail(path + ".minimum", "leaves no integer below the maximum");
        const std::string range = integer_range(lo, hi);
        n.pattern = pattern_index("integer\x1f" + range, path, [&] {
            return RegexDfa::compile(range, where_ + shortened(path));
        });
        return add(std::move(n), path);
    }

    // The decimal texts of the integers in [lo, hi] (either end open) as a pattern.
    static std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
        std::vector<std::string> alts;
        if (!hi || *hi >= 0)
            alts.push_back(naturals(lo ? static_cast<uint64_t>(std::max<int64_t>(*lo, 0)) : 0,
                                    hi ? std::optional<uint64_t>(*hi) : std::nullopt));
        if (!lo || *lo < 0)  // magnitudes from 1: no -0
            alts.push_back("-" + naturals(hi && *hi < 0 ? static_cast<uint64_t>(-*hi) : 1,
                                          lo ? std::optional<uint64_t>(-*lo) : std::nullopt));
        return join(alts);
    }

    static std::string join(const std::vector<std::string>& alts) {
        std::string r = "(?:";
        for (size_t i = 0; i < alts.size(); ++i) r += (i ? "|" : "") + alts[i];
        return r + ")";
    }

    // [a, b] (b open: every larger one) of the naturals, by their digit counts.
    static std::string naturals(uint64_t a, std::optional<uint64_t> b) {
        const auto digits = [](uint64_t x) { return std::to_string(x).size(); };
        std::vector<std::string> alts;
        uint64_t first = 1;  // 10^(len - 1)
        for (size_t len = 1; len <= (b ? digits(*b) : digits(a)); ++len, first *= 10) {
            const uint64_t from = std::max(a, len == 1 ? 0 : first);
            const uint64_t to = std::min(b.value_or(UINT64_MAX), first * 10 - 1);
            if (from <= to) alts.push_back(same_length(std::to_string(from), std::to_string(to)));
        }
        if (!b) alts.push_back("[1-9]\\d{" + std::to_string(digits(a)) + ",}");
        return join(alts);
    }

    // The numbers from x to y, texts of the same length, digit by digit.
    static std::string same_length(const std::string& x, const std::string& y) {
        if (x.empty() || x == y) return x;
        if (x[0] == y[0]) return x.substr(0, 1) + same_length(x.substr(1), y.substr(1));
        const size_t rest = x.size() - 1;
        const std::string any = rest ? "\\d{" + std::to_string(rest) + "}" : std::string();
        std::vector<std::string> alts;
        char from = x[0], to = y[0];
        if (x.find_first_not_of('0', 1) != std::string::npos) {  // x's tail is not all zeros
            alts.push_back(x.substr(0, 1) + same_length(x.substr(1), std::string(rest, '9')));
            ++from;
        }
        const bool y_whole = y.find_first_not_of('9', 1) == std::string::npos;
        if (!y_whole) --to;
        if (from <= to) alts.push_back(std::string("[") + from + "-" + to + "]" + any);
        if (!y_whole)
            alts.push_back(y.substr(0, 1) + same_length(std::string(rest, '0'), y.substr(1)));
        return join(alts);
    }

    // The formats a string may name, as whole-match patterns that take only valid values
    // (RFC 3339's date, time and date-time with upper-case T and Z, no leap seconds and no
    // 29 February; RFC 4122's uuid; RFC 5321's dot-atom addresses with domain names; dotted
    // decimal IPv4): fewer texts than the format allows, never more.
    struct Format {
        const char* name;
        const char* pattern;
    };
#define QF_DATE                                                                                  \
    "\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|" \
    "02-(?:0[1-9]|1\\d|2[0-8]))"
#define QF_TIME \
    "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,9})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
#define QF_OCTET "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
#define QF_ATOM "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
#define QF_LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    static constexpr Format kFormats[] = {
        {"date", QF_DATE},
        {"time", QF_TIME},
        {"date-time", QF_DATE "T" QF_TIME},
        {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
        {"email", QF_ATOM "(?:\\." QF_ATOM ")*@(?:" QF_LABEL "\\.)+[A-Za-z]{2,63}"},
        {"ipv4", QF_OCTET "(?:\\." QF_OCTET "){3}"},
    };
#undef QF_DATE
#undef QF_TIME
#undef QF_OCTET
#undef QF_ATOM
#undef QF_LABEL
    // A JSON string's content without \u escapes: any character but the controls that only
    // \u00XX can write (\b \t \n \f \r have escapes of their own).
    static constexpr const char* kJsonWritable = "[^\\x00-\\x07\\x0b\\x0e-\\x1f]*";

    uint64_t count(const ojson& s, const char* name, const std::string& path, uint64_t fallback) {
        const auto v = s.find(name);
        if (v == s.end()) return fallback;
        if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0))
            fail(path + "." + name, "must be a non-negative integer");
        return v->get<uint64_t>();
    }

    uint32_t literals(const ojson& s, const std::string& path) {
        if (s.contains("enum") && s.contains("const")) fail(path + ".const", "beside enum");
        std::vector<ojson> values;
        if (const auto c = s.find("const"); c != s.end()) values.push_back(*c);
        if (const auto e = s.find("enum"); e != s.end()) {
            if (!e->is_array() || e->empty()) fail(path + ".enum", "must be a non-empty array");
            values.assign(e->begin(), e->end());
        }
        // A type beside them keeps the values of that type (the instance must be both).
        std::vector<std::string> types;
        if (const auto t = s.find("type"); t != s.end()) {
            if (t->is_string()) types.push_back(t->get<std::string>());
            if (t->is_array())
                for (const auto& x : *t)
                    if (x.is_string()) types.push_back(x.get<std::string>());
            if (types.empty() || (t->is_array() && types.size() != t->size()))
                fail(path + ".type", "must be a type name or a non-empty array of them");
        }
        static const std::set<std::string> kTypes = {"object",  "array",   "string", "number",
                                                     "integer", "boolean", "null"};
        for (const std::string& t : types)
            if (!kTypes.count(t)) fail(path + ".type", "\"" + t + "\" is not a type");
        const auto of_type = [&](const ojson& v) {
            if (types.empty()) return true;
            for (const std::string& t : types)
                if ((t == "string" && v.is_string()) || (t == "boolean" && v.is_boolean()) ||
                    (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
                    (t == "array" && v.is_array()) || (t == "number" && v.is_number()) ||
                    (t == "integer" &&
                     (v.is_number_integer() ||
                      (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))))
                    return true;
            return false;
        };
        JsonGrammar::Node n = of_kind(JsonGrammar::Kind::literals);
        for (const ojson& v : values) {
            const std::string text = v.dump();
            if (of_type(v) &&
                std::find(n.literals.begin(), n.literals.end(), text) == n.literals.end())
                n.literals.push_back(text);
        }
        if (n.literals.empty()) fail(path + ".enum", "holds no value of the schema's type");
        if (n.literals.size() > JsonGrammar::kMaxLiterals)
            fail(path + ".enum",
                 "holds more than " + std::to_string(JsonGrammar::kMaxLiterals) + " values");
        return add(std::move(n), path);
    }

    uint32_t choice(std::vector<uint32_t> options, const std::string& path) {
        JsonGrammar::Node n = of_kind(JsonGrammar::Kind::choice);
        n.options = std::move(options);
        return add(std::move(n), path);
    }

    uint32_t reference(const ojson& ref, const std::string& path) {
        if (!ref.is_string()) fail(path, "must be a string");
        const std::string r = ref.get<std::string>();
        if (const auto seen = refs_.find(r); seen != refs_.end()) return seen->second;
        const ojson* target = nullptr;
        for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
            const std::string p = prefix;
            if (r.rfind(p, 0) != 0 || r.find('/', p.size()) != std::string::npos) continue;
            const auto defs = root_.find(p.substr(2, p.size() - 3));
            if (defs != root_.end() && defs->is_object())
                if (const auto t = defs->find(pointer_token(r.substr(p.size()))); t != defs->end())
                    target = &*t;
        }
        if (!target)
            fail(path, "\"" + r + "\" is not a #/$defs/NAME or #/definitions/NAME of the schema");
        // An alias, made first, so a definition that refers to itself finds it; its target is
        // set once compiled (finish() refuses aliases that lead only to aliases).
        const uint32_t alias = add(of_kind(JsonGrammar::Kind::alias), path);
        refs_[r] = alias;
        const uint32_t compiled = compile(*target, path + "(" + r + ")");
        g_.nodes_[alias].values = compiled;
        return alias;
    }

    // A JSON pointer's reference token: ~1 is '/', ~0 is '~'.
    static std::string pointer_token(const std::string& t) {
        std::string out;
        for (size_t i = 0; i < t.size(); ++i) {
            if (t[i] == '~' && i + 1 < t.size() && (t[i + 1] == '0' || t[i + 1] == '1')) {
                out += t[++i] == '0' ? '~' : '/';
                continue;
            }
            out += t[i];
        }
        return out;
    }

    JsonGrammar& g_;
    const ojson& root_;
    std::string where_;
    std::map<std::string, uint32_t> refs_;
    std::map<std::string, uint32_t> pattern_ids_;  // pattern_index's, by key
    size_t pattern_cells_ = 0;
    std::vector<std::string> paths_ = std::vector<std::string>(7);  // each node's, for errors
    uint32_t depth_ = 0;                                            // compile()'s nesting
};

JsonGrammar JsonGrammar::from_schema(const nlohmann::ordered_json& schema,
                                     const std::string& where) {
    JsonGrammar g;
    SchemaCompiler compiler(g, schema, where);
    compiler.finish(compiler.compile(schema, ""));
    return g;
}

// ---- matcher -------------------------------------------------------------------------------

bool JsonMatcher::feed(uint8_t c) {
    if (dead_) return false;
    for (;;) {
        if (stack_.empty()) {
            if (done_) break;
            if (space(c)) return true;
            end_spaces();
            if (start_value(g_->root(), c)) return true;
            break;
        }
        Entry& e = stack_.back();
        if (e.frame == Frame::object) {
            if (object_byte(e, c)) return true;
            break;
        }
        if (e.frame == Frame::array) {
            if (array_byte(e, c)) return true;
            break;
        }
        if (e.frame == Frame::string || e.frame == Frame::key) {
            if (string_byte(e, c)) return true;
            break;
        }
        const int r = e.frame == Frame::number ? number_byte(e, c) : literal_byte(e, c);
        if (r > 0) return true;
        if (r < 0) break;
        // The number (or a literal that is one) ended before c: c is its parent's.
        stack_.pop_back();
        if (!value_done()) break;
    }
    dead_ = true;
    return false;
}

bool JsonMatcher::complete() const {
    if (dead_) return false;
    if (done_) return true;
    if (stack_.size() != 1) return false;
    const Entry& e = stack_.back();
    if (e.frame == Frame::number) return number_whole(e);
    if (e.frame != Frame::literal) return false;
    const auto& texts = g_->node(e.node).literals;
    for (uint64_t m = e.mask; m; m &= m - 1)
        if (texts[static_cast<size_t>(std::countr_zero(m))].size() == e.index) return true;
    return false;
}

bool JsonMatcher::space(uint8_t c) {
    if (c == '\n') {
        if (line_break_) return false;
        line_break_ = true;
        spaces_ = 0;
        return true;
    }
    if ((c != ' ' && c != '\t') || spaces_ >= JsonGrammar::kMaxSpaces) return false;
    ++spaces_;
    return true;
}

bool JsonMatcher::start_value(uint32_t node, uint8_t c) {
    using Kind = JsonGrammar::Kind;
    const JsonGrammar::Node& n = g_->node(node);
    // An object or array opens only where the nesting its schema requires still fits.
    const bool room = fits(node);
    switch (n.kind) {
        case Kind::any:
            if (c == '{') return start_value(JsonGrammar::kAnyObject, c);
            if (c == '[') return start_value(JsonGrammar::kAnyArray, c);
            if (c == '"') return start_value(JsonGrammar::kString, c);
            if (c == 't' || c == 'f') return start_value(JsonGrammar::kBoolean, c);
            if (c == 'n') return start_value(JsonGrammar::kNull, c);
            return start_value(JsonGrammar::kNumber, c);
        case Kind::object:
            if (c != '{' || !room) return false;
            stack_.push_back({.frame = Frame::object, .phase = kObjOpen, .node = node});
            ++containers_;
            return true;
        case Kind::array:
            if (c != '[' || !room) return false;
            stack_.push_back({.frame = Frame::array, .phase = kArrOpen, .node = node});
            ++containers_;
            return true;
        case Kind::alias:
            return start_value(n.values, c);
        case Kind::string:
            if (c != '"') return false;
            stack_.push_back(
                {.frame = Frame::string,
                 .phase = kStrChar,
                 .node = node,
                 .re = n.pattern == JsonGrammar::kNoPattern ? 0 : g_->pattern(n.pattern).start()});
            return true;
        case Kind::number:
        case Kind::integer:
            if (c != '-' && !is_digit(c)) return false;
            stack_.push_back(
                {.frame = Frame::number,
                 .phase = kNumStart,
                 .node = node,
                 .re = n.pattern == JsonGrammar::kNoPattern ? 0 : g_->pattern(n.pattern).start()});
            return number_byte(stack_.back(), c) > 0;
        case Kind::literals: {
            uint64_t mask = 0;
            for (size_t j = 0; j < n.literals.size(); ++j)
                if (static_cast<uint8_t>(n.literals[j][0]) == c) mask |= uint64_t{1} << j;
            if (!mask) return false;
            stack_.push_back({.frame = Frame::literal, .node = node, .mask = mask});
            return literal_byte(stack_.back(), c) > 0;
        }
        case Kind::choice:
            for (uint32_t o : n.options)
                if (g_->starts(o, c)) return start_value(o, c);
            return false;
    }
    return false;
}

bool JsonMatcher::close_container() {
    stack_.pop_back();
    --containers_;
    return value_done();
}

bool JsonMatcher::finished() const {
    if (dead_ || !complete()) return false;
    if (done_) return true;
    for (int c = 0; c < 256; ++c) {  // a number (or a number literal) that may still grow
        JsonMatcher next = *this;
        if (next.feed(static_cast<uint8_t>(c))) return false;
    }
    return true;
}

bool JsonMatcher::value_done() {
    if (stack_.empty()) {
        done_ = true;
        return true;
    }
    Entry& p = stack_.back();
    if (p.frame == Frame::object) {
        p.phase = kObjAfter;
        return true;
    }
    if (p.frame == Frame::array) {
        ++p.index;
        p.phase = kArrAfter;
        return true;
    }
    return false;
}

bool JsonMatcher::closable(const Entry& e) const {
    const JsonGrammar::Node& n = g_->node(e.node);
    for (size_t j = e.index; j < n.properties.size(); ++j)
        if (n.properties[j].required) return false;
    return true;
}

bool JsonMatcher::fits(uint32_t node) const {
    return uint64_t{containers_} + g_->min_depth(node) <= JsonGrammar::kMaxDepth;
}

uint64_t JsonMatcher::key_candidates(const Entry& e) const {
    const JsonGrammar::Node& n = g_->node(e.node);
    if (n.free_keys) return fits(n.values) ? 1 : 0;
    // The next property, or any later one when those before it are optional; an optional one
    // only if its value still fits the nesting (a required one always does: its object opened
    // only where it did).
    uint64_t mask = 0;
    for (size_t j = e.index; j < n.properties.size(); ++j) {
        if (fits(n.properties[j].node)) mask |= uint64_t{1} << j;
        if (n.properties[j].required) break;
    }
    return mask;
}

bool JsonMatcher::more_keys(const Entry& e) const { return key_candidates(e) != 0; }

bool JsonMatcher::open_keys(Entry& e) {
    const uint64_t mask = key_candidates(e);
    const uint32_t node = e.node;
    if (mask && g_->node(node).free_keys) {
        stack_.push_back({.frame = Frame::key, .phase = kStrChar, .node = node});
        return true;
    }
    if (!mask) return false;
    stack_.push_back({.frame = Frame::key_literal, .node = node, .index = 1, .mask = mask});
    return true;
}

bool JsonMatcher::object_byte(Entry& e, uint8_t c) {
    if (space(c)) return true;
    end_spaces();
    switch (e.phase) {
        case kObjOpen:
        case kObjKeyNext:
            if (c == '}' && e.phase == kObjOpen && closable(e)) return close_container();
            return c == '"' && open_keys(e);
        case kObjColon:
            if (c != ':') return false;
            e.phase = kObjValue;
            return true;
        case kObjValue:
            return start_value(e.value, c);
        case kObjAfter:
            if (c == ',' && more_keys(e)) {
                e.phase = kObjKeyNext;
                return true;
            }
            if (c == '}' && closable(e)) return close_container();
            return false;
    }
    return false;
}

bool JsonMatcher::array_byte(Entry& e, uint8_t c) {
    if (space(c)) return true;
    end_spaces();
    const JsonGrammar::Node& n = g_->node(e.node);
    if (e.phase == kArrAfter) {
        // Past minItems an item is optional: only where it fits the nesting.
        if (c == ',' && e.index < n.max_items && (e.index < n.min_items || fits(n.values))) {
            e.phase = kArrValue;
            return true;
        }
        if (c == ']' && e.index >= n.min_items) return close_container();
        return false;
    }
    if (c == ']' && e.phase == kArrOpen && n.min_items == 0) return close_container();
    return n.max_items > 0 && start_value(n.values, c);
}

// A string whose content a pattern constrains: each character, as its escape stands for it or
// as its bytes come, steps the pattern's DFA; a byte whose step dies is refused, the closing
// quote only where the content is a whole match, and \u escapes are not taken (the DFA was cut
// to the characters that need none).
bool JsonMatcher::pattern_step(Entry& e, uint8_t c) {
    const uint32_t p =
        e.frame == Frame::string ? g_->node(e.node).pattern : JsonGrammar::kNoPattern;
    if (p == JsonGrammar::kNoPattern) return true;
    const RegexDfa& dfa = g_->pattern(p);
    if (e.utf8_need == 0 && e.phase == kStrChar) {
        if (c == '"') return dfa.accepting(e.re);
        if (c == '\\') {  // only where some escape's character may come
            for (uint8_t x : std::string_view("\"\\/\b\f\n\r\t"))
                if (dfa.next(e.re, x) != RegexDfa::kDead) return true;
            return false;
        }
    }
    uint8_t stands_for = c;
    if (e.phase == kStrEscape) {
        switch (c) {
            case 'b':
                stands_for = '\b';
                break;
            case 'f':
                stands_for = '\f';
                break;
            case 'n':
                stands_for = '\n';
                break;
            case 'r':
                stands_for = '\r';
                break;
            case 't':
                stands_for = '\t';
                break;
            case 'u':
                return false;
            default:
                break;  // " \ /: themselves
        }
    }
    const uint32_t next = dfa.next(e.re, stands_for);
    if (next == RegexDfa::kDead) return false;
    e.re = next;
    return true;
}

bool JsonMatcher::string_byte(Entry& e, uint8_t c) {
    end_spaces();
    if (!pattern_step(e, c)) return false;
    if (e.utf8_need > 0) {  // a continuation byte of a UTF-8 character
        if (c < e.utf8_lo || c > e.utf8_hi) return false;
        --e.utf8_need;
        e.utf8_lo = 0x80;
        e.utf8_hi = 0xBF;
        return true;
    }
    const int h = hex_value(c);
    switch (e.phase) {
        case kStrChar:
            if (c == '"') {
                const bool key = e.frame == Frame::key;
                stack_.pop_back();
                if (!key) return value_done();
                Entry& object = stack_.back();
                object.phase = kObjColon;
                object.value = g_->node(object.node).values;
                return true;
            }
            if (c == '\\') {
                e.phase = kStrEscape;
                return true;
            }
            if (c < 0x20) return false;
            if (c < 0x80) return true;
            // RFC 3629's well-formed sequences: no overlong forms, surrogates or code points
            // past U+10FFFF.
            if (c >= 0xC2 && c <= 0xDF) {
                e.utf8_need = 1;
            } else if (c >= 0xE0 && c <= 0xEF) {
                e.utf8_need = 2;
                if (c == 0xE0) e.utf8_lo = 0xA0;
                if (c == 0xED) e.utf8_hi = 0x9F;
            } else if (c >= 0xF0 && c <= 0xF4) {
                e.utf8_need = 3;
                if (c == 0xF0) e.utf8_lo = 0x90;
                if (c == 0xF4) e.utf8_hi = 0x8F;
            } else {
                return false;
            }
            return true;
        case kStrEscape:
            if (c == 'u') {
                e.phase = kStrU1;
                e.value = 0;
                return true;
            }
            if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
                c == 't') {
                e.phase = kStrChar;
                return true;
            }
            return false;
        case kStrLowBackslash:
            if (c != '\\') return false;
            e.phase = kStrLowU;
            return true;
        case kStrLowU:
            if (c != 'u') return false;
            e.phase = kStrL1;
            return true;
        default:
            break;
    }
    if (h < 0) return false;
    if (e.phase >= kStrU1 && e.phase < kStrU1 + 4) {
        e.value = e.value * 16 + static_cast<uint32_t>(h);
        // A low surrogate alone (DC00-DFFF) is refused at its second digit, so no prefix taken
        // is a dead end.
        if (e.phase == kStrU1 + 1 && e.value >= 0xDC && e.value <= 0xDF) return false;
        if (e.phase == kStrU1 + 3) {
            e.phase = e.value >= 0xD800 && e.value <= 0xDBFF ? kStrLowBackslash : kStrChar;
            return true;
        }
        ++e.phase;
        return true;
    }
    // The low half of a surrogate pair: DC00-DFFF.
    if (e.phase == kStrL1 && h != 0xD) return false;
    if (e.phase == kStrL1 + 1 && h < 0xC) return false;
    e.phase = e.phase == kStrL1 + 3 ? kStrChar : e.phase + 1;
    return true;
}

bool JsonMatcher::number_whole(const Entry& e) const {
    const uint32_t p = g_->node(e.node).pattern;
    return p == JsonGrammar::kNoPattern ? number_complete(e.phase) : g_->pattern(p).accepting(e.re);
}

int JsonMatcher::number_byte(Entry& e, uint8_t c) {
    if (const uint32_t p = g_->node(e.node).pattern; p != JsonGrammar::kNoPattern) {
        // An integer in bounds: its text's DFA (at most 19 digits and a minus, so within
        // kMaxNumberBytes).
        const RegexDfa& dfa = g_->pattern(p);
        const uint32_t next = dfa.next(e.re, c);
        if (next == RegexDfa::kDead || e.index + 1 > JsonGrammar::kMaxNumberBytes)
            return dfa.accepting(e.re) ? 0 : -1;
        e.re = next;
        ++e.index;
        return 1;
    }
    const bool integer = g_->node(e.node).kind == JsonGrammar::Kind::integer;
    int next = -1;
    switch (e.phase) {
        case kNumStart:
            next = c == '-' ? kNumMinus : c == '0' ? kNumZero : is_digit(c) ? kNumInt : -1;
            break;
        case kNumMinus:
            next = c == '0' ? kNumZero : is_digit(c) ? kNumInt : -1;
            break;
        case kNumZero:
        case kNumInt:
            if (is_digit(c) && e.phase == kNumInt) next = kNumInt;
            if (!integer && c == '.') next = kNumDot;
            if (!integer && (c == 'e' || c == 'E')) next = kNumE;
            break;
        case kNumDot:
            next = is_digit(c) ? kNumFrac : -1;
            break;
        case kNumFrac:
            next = is_digit(c) ? kNumFrac : (c == 'e' || c == 'E') ? kNumE : -1;
            break;
        case kNumE:
            next = c == '+' || c == '-' ? kNumESign : is_digit(c) ? kNumExp : -1;
            break;
        case kNumESign:
            next = is_digit(c) ? kNumExp : -1;
            break;
        case kNumExp:
            next = is_digit(c) && e.value < kMaxExponentDigits ? kNumExp : -1;
            break;
        default:
            break;
    }
    const uint32_t bytes = e.index + 1;
    // At the length bound a byte is taken only if the number is then whole, so that a number
    // taken so far can always be finished.
    if (next < 0 || bytes > JsonGrammar::kMaxNumberBytes ||
        (bytes == JsonGrammar::kMaxNumberBytes && !number_complete(static_cast<uint8_t>(next))))
        return number_complete(e.phase) ? 0 : -1;
    if (next == kNumExp) ++e.value;  // exponent digits
    e.phase = static_cast<uint8_t>(next);
    e.index = bytes;
    return 1;
}

int JsonMatcher::literal_byte(Entry& e, uint8_t c) {
    end_spaces();
    const bool key = e.frame == Frame::key_literal;
    const JsonGrammar::Node& n = g_->node(e.node);
    const auto text = [&](uint64_t j) -> const std::string& {
        return key ? n.properties[j].key : n.literals[j];
    };
    uint64_t next = 0;
    bool whole = false;  // a candidate ended before c
    for (uint64_t m = e.mask; m; m &= m - 1) {
        const auto j = static_cast<uint64_t>(std::countr_zero(m));
        const std::string& t = text(j);
        if (t.size() == e.index)
            whole = true;
        else if (static_cast<uint8_t>(t[e.index]) == c)
            next |= uint64_t{1} << j;
    }
    if (!next) return whole ? 0 : -1;
    e.mask = next;
    ++e.index;
    // A candidate that ends here with a byte other than a digit ends the value: no other JSON
    // value's text continues past a closing quote, bracket or a literal name (a number may).
    for (uint64_t m = next; m; m &= m - 1) {
        const auto j = static_cast<uint64_t>(std::countr_zero(m));
        const std::string& t = text(j);
        if (t.size() != e.index || is_digit(static_cast<uint8_t>(t.back()))) continue;
        stack_.pop_back();
        if (!key) return value_done() ? 1 : -1;
        Entry& object = stack_.back();
        object.index = static_cast<uint32_t>(j + 1);
        object.value = n.properties[j].node;
        object.phase = kObjColon;
        return 1;
    }
    return 1;
}

}  // namespace qforge
