// runtime/json_grammar.hpp against independent references: nlohmann's JSON parser (is a
// matched text JSON at all), and a validator written here for the schema subset from the JSON
// Schema specification (is it a value of the schema); random documents must be taken whole,
// random walks over the bytes the matcher allows must always be finishable and, finished, parse
// and validate; texts just outside the schema are refused.
#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "json_schema_check.hpp"
#include "runtime/json_grammar.hpp"
#include "runtime/token_constraint.hpp"
#include "test_support.hpp"
#include "tokenizer/tokenizer.hpp"

namespace json_grammar_test {

using namespace qforge;
using ojson = nlohmann::ordered_json;

namespace {

bool matches(const JsonGrammar& g, const std::string& text) {
    JsonMatcher m(g);
    return m.feed(text) && m.complete();
}

// A random walk over the bytes the matcher allows (each byte tried by copy), leaning to the
// bytes that close things after `len` bytes; then finished by always taking the first allowed
// byte in an order that closes. Returns the text, which must be complete.
std::string walk(const JsonGrammar& g, std::mt19937& rng, size_t len,
                 const std::string& openers = "",
                 const std::string& closers = "\"}]0,:1tfnrueals") {
    JsonMatcher m(g);
    std::string text;
    for (size_t step = 0; step < 40000 && !(text.size() >= len && m.complete()); ++step) {
        std::vector<uint8_t> ok;
        for (int c = 0; c < 256; ++c) {
            JsonMatcher t = m;
            if (t.feed(static_cast<uint8_t>(c))) ok.push_back(static_cast<uint8_t>(c));
        }
        INFO(text);
        if (ok.empty() && m.complete()) break;  // a whole document that nothing continues
        REQUIRE(!ok.empty());                   // never a dead end
        uint8_t c = ok[rng() % ok.size()];
        if (text.size() < len && rng() % 4 != 0)  // leaning to open (to reach the bounds)
            for (char p : openers)
                if (std::find(ok.begin(), ok.end(), static_cast<uint8_t>(p)) != ok.end()) {
                    c = static_cast<uint8_t>(p);
                    break;
                }
        if (text.size() >= len)
            for (char p : closers)
                if (std::find(ok.begin(), ok.end(), static_cast<uint8_t>(p)) != ok.end()) {
                    c = static_cast<uint8_t>(p);
                    break;
                }
        REQUIRE(m.feed(c));
        text += static_cast<char>(c);
    }
    INFO(text);
    REQUIRE(m.complete());
    return text;
}

// Random JSON values (nlohmann's own dump: the reference's text), within the matcher's bounds.
ojson random_value(std::mt19937& rng, int depth) {
    switch (rng() % (depth > 3 ? 5 : 7)) {
        case 0:
            return nullptr;
        case 1:
            return rng() % 2 == 0;
        case 2:
            return static_cast<int64_t>(rng() % 2000000) - 1000000;
        case 3:
            return std::ldexp(static_cast<double>(rng() % 100000), -static_cast<int>(rng() % 12));
        case 4: {
            std::string s;
            const char* pieces[] = {"a", "Z", " ", "\"", "\\", "\n", "\x01", "é", "€", "😀", "/"};
            for (size_t i = rng() % 6; i > 0; --i) s += pieces[rng() % 11];
            return s;
        }
        case 5: {
            ojson a = ojson::array();
            for (size_t i = rng() % 4; i > 0; --i) a.push_back(random_value(rng, depth + 1));
            return a;
        }
        default: {
            ojson o = ojson::object();
            for (size_t i = rng() % 4; i > 0; --i)
                o["k" + std::to_string(rng() % 6)] = random_value(rng, depth + 1);
            return o;
        }
    }
}

}  // namespace

TEST_CASE("json grammar: any object takes every JSON object and only JSON objects",
          "[json_grammar]") {
    const JsonGrammar g = JsonGrammar::any_object();
    std::mt19937 rng(11);
    for (int i = 0; i < 400; ++i) {
        ojson v = random_value(rng, 0);
        std::string text = v.dump(i % 3 == 0 ? 2 : -1);
        INFO(text);
        CHECK(matches(g, text) == v.is_object());
        if (!v.is_object()) continue;
        // Every proper prefix is taken and none is whole.
        JsonMatcher m(g);
        for (size_t j = 0; j + 1 < text.size(); ++j) {
            REQUIRE(m.feed(static_cast<uint8_t>(text[j])));
            REQUIRE(!m.complete());
        }
        // A byte changed or dropped: taken whole only if nlohmann reads it as an object too.
        for (int k = 0; k < 8; ++k) {
            std::string bad = text;
            const size_t at = rng() % bad.size();
            if (k % 2)
                bad.erase(at, 1);
            else
                bad[at] = "{}[]\",:0-.eE \\u\x7f\xc3"[rng() % 18];
            INFO(bad);
            if (matches(g, bad)) {
                CHECK(nlohmann::json::accept(bad));
                CHECK(nlohmann::json::parse(bad).is_object());
            }
        }
    }
    // What RFC 8259 refuses, and the matcher's own bounds.
    for (const char* bad : {"{\"a\":01}",
                            "{\"a\":1.}",
                            "{\"a\":-}",
                            "{\"a\":.5}",
                            "{\"a\":1e}",
                            "{\"a\":+1}",
                            "{\"a\":\"\\x\"}",
                            "{\"a\":\"\x01\"}",
                            "{\"a\":\"\xc0\xaf\"}",
                            "{\"a\":\"\xed\xa0\x80\"}",
                            "{\"a\":\"\\udc00\"}",
                            "{\"a\":\"\\ud800\"}",
                            "{\"a\":\"\\ud800\\u0041\"}",
                            "{a:1}",
                            "{\"a\":1,}",
                            "{\"a\" 1}",
                            "[1]",
                            "\"x\"",
                            "{\"a\":1e123}",
                            "{\"a\":tru}",
                            "{} x"})
        CHECK_FALSE(matches(g, bad));
    for (const char* good :
         {"{\"a\":0}", " {\"a\":-0.5e+12}", "{\"\\ud83d\\ude00\":\"\xf0\x9f\x98\x80\"}",
          "{\"a\":[1,[],{}],\"b\":{\"c\":null}}", "{}", "{\"a\":\"\\u00e9\\/\"}"})
        CHECK(matches(g, good));
    // kMaxSpaces spaces or tabs in a row, and one line break (then kMaxSpaces more).
    CHECK_FALSE(matches(g, "{" + std::string(21, ' ') + "}"));
    CHECK(matches(g, "{" + std::string(20, '\t') + "}"));
    CHECK(matches(g, "{" + std::string(20, ' ') + "\n" + std::string(20, ' ') + "}"));
    CHECK_FALSE(matches(g, "{\n\n}"));
    CHECK_FALSE(matches(g, "{\r\n}"));
    CHECK(matches(g, "{\n \"a\":\n 1 \n}"));
    CHECK_FALSE(matches(g, "{\"a\":" + std::string(33, '1') + "}"));  // kMaxNumberBytes
    CHECK(matches(g, "{\"a\":" + std::string(32, '1') + "}"));
    CHECK_FALSE(matches(g, std::string(65, '[') + std::string(65, ']')));
    // Random walks: never a dead end, every finished text an object nlohmann reads.
    for (int i = 0; i < 60; ++i) {
        const std::string text = walk(g, rng, 5 + rng() % 80);
        INFO(text);
        REQUIRE(nlohmann::json::accept(text));
        CHECK(nlohmann::json::parse(text).is_object());
    }
}

TEST_CASE("json grammar: schemas take their instances, refuse others, walk to valid documents",
          "[json_grammar]") {
    const char* schemas[] = {
        R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
            "required": ["name", "age"], "title": "Person"})",
        R"({"type": "object", "properties": {"kind": {"enum": ["cat", "dog", 3, null]},
            "score": {"type": ["number", "null"]}, "ok": {"type": "boolean"},
            "child": {"$ref": "#/$defs/Node"}}, "required": ["kind", "ok"],
            "$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"},
            "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}}, "required": ["v"]}}})",
        R"({"type": "array", "items": {"type": "object", "additionalProperties": {"type": "number"}},
            "minItems": 2, "maxItems": 4})",
        R"({"anyOf": [{"type": "string"}, {"type": "integer"}, {"const": [1, "a"]}]})",
        R"({"properties": {"a": {}, "b": {"const": {"x": [true]}}}, "additionalProperties": false})",
        R"({"type": "object", "required": ["id"], "additionalProperties": {"type": "string"}})",
        R"({"type": "integer"})",
        // Recursive models (pydantic's shapes): a tree with an optional, nullable parent; a
        // linked list with an optional next; a dict of itself.
        R"({"$defs": {"Tree": {"type": "object", "properties": {"value": {"type": "integer"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}},
            "parent": {"anyOf": [{"$ref": "#/$defs/Tree"}, {"type": "null"}]}},
            "required": ["value"]}}, "$ref": "#/$defs/Tree"})",
        R"({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}},
            "$ref": "#/$defs/N"})",
        R"({"$defs": {"T": {"type": "object", "additionalProperties": {"$ref": "#/$defs/T"}}},
            "$ref": "#/$defs/T"})",
    };
    std::mt19937 rng(5);
    for (const char* text : schemas) {
        const ojson schema = ojson::parse(text);
        INFO(schema.dump());
        const JsonGrammar g = JsonGrammar::from_schema(schema, "schema");
        for (int i = 0; i < 80; ++i) {
            const std::string doc = walk(g, rng, rng() % 60);
            INFO(doc);
            REQUIRE(nlohmann::json::accept(doc));
            CHECK(test::schema_valid(ojson::parse(doc), schema));
        }
    }
    // The recursive schemas walked deep, leaning to open objects, arrays and keys: the nesting
    // bound is reached and never a dead end.
    for (size_t i = 7; i < std::size(schemas); ++i) {
        const ojson schema = ojson::parse(schemas[i]);
        const JsonGrammar g = JsonGrammar::from_schema(schema, "schema");
        for (int k = 0; k < 6; ++k) {
            const std::string doc = walk(g, rng, 1500, "{[\"pnc,:");
            INFO(doc);
            REQUIRE(nlohmann::json::accept(doc));
            CHECK(test::schema_valid(ojson::parse(doc), schema));
        }
    }
    // Instances in the schema's property order are taken; near misses are refused.
    const JsonGrammar person = JsonGrammar::from_schema(ojson::parse(schemas[0]), "schema");
    CHECK(matches(person, R"({"name": "Ann", "age": 41})"));
    CHECK(matches(person, R"({"name":"Ann","age":41,"tags":["a","b","c"]})"));
    CHECK(matches(person, "{\n  \"name\": \"\",\n  \"age\": -3\n}"));
    for (const char* bad :
         {R"({"age": 41, "name": "Ann"})", R"({"name": "Ann"})", R"({"name": "Ann", "age": 4.5})",
          R"({"name": 5, "age": 4})", R"({"name": "A", "age": 4, "tags": ["a","b","c","d"]})",
          R"({"name": "A", "age": 4, "x": 1})", R"({"nam": "A", "age": 4})"})
        CHECK_FALSE(matches(person, bad));
    const JsonGrammar pair = JsonGrammar::from_schema(ojson::parse(schemas[2]), "schema");
    CHECK(matches(pair, R"([{}, {"a": 1.5}])"));
    CHECK_FALSE(matches(pair, R"([{}])"));
    CHECK_FALSE(matches(pair, R"([{}, {"a": "x"}])"));
    const JsonGrammar integer = JsonGrammar::from_schema(ojson::parse(schemas[6]), "schema");
    CHECK(matches(integer, "-12"));
    CHECK_FALSE(matches(integer, "1.0"));
    // A number root is finished only once nothing may continue it.
    JsonMatcher digits(integer);
    REQUIRE(digits.feed("1"));
    CHECK((digits.complete() && !digits.finished()));
    REQUIRE(digits.feed(std::string(JsonGrammar::kMaxNumberBytes - 1, '2')));
    CHECK(digits.finished());
    // A $ref to a definition still being compiled is that definition, not any value.
    const JsonGrammar aliased = JsonGrammar::from_schema(
        ojson::parse(R"({"$defs": {"A": {"type": "object", "properties": {"child":
            {"$ref": "#/$defs/B"}}, "additionalProperties": false}, "B": {"$ref": "#/$defs/A"}},
            "$ref": "#/$defs/A"})"),
        "s");
    CHECK(matches(aliased, R"({"child": {"child": {}}})"));
    CHECK_FALSE(matches(aliased, R"({"child": 5})"));
    CHECK_FALSE(matches(aliased, R"({"x": {}})"));
    // Hostile sizes are refused at once: a $ref chain past kMaxSchemaDepth, or an anyOf of two
    // refs to itself (exponential to follow without the derived first bytes).
    ojson chain = {{"$defs", ojson::object()}, {"$ref", "#/$defs/a0"}};
    for (int i = 0; i < 8000; ++i)
        chain["$defs"]["a" + std::to_string(i)] = {{"$ref", "#/$defs/a" + std::to_string(i + 1)}};
    chain["$defs"]["a8000"] = {{"type", "string"}};
    CHECK_THROWS_WITH(JsonGrammar::from_schema(chain, "s"), Catch::Contains("nests deeper than"));
    // A schema whose only value nests deeper than the bound is refused (its definitions compiled
    // in three parts, so that no part nests past kMaxSchemaDepth on its own).
    ojson chained = {{"$defs", ojson::object()},
                     {"type", "object"},
                     {"properties",
                      {{"p1", {{"$ref", "#/$defs/A60"}}},
                       {"p2", {{"$ref", "#/$defs/A30"}}},
                       {"p3", {{"$ref", "#/$defs/A0"}}}}},
                     {"required", {"p1", "p2", "p3"}}};
    for (int i = 0; i < 90; ++i)
        chained["$defs"]["A" + std::to_string(i)] = {
            {"type", "object"},
            {"properties", {{"a", {{"$ref", "#/$defs/A" + std::to_string(i + 1)}}}}},
            {"required", {"a"}}};
    chained["$defs"]["A90"] = {{"type", "object"}};
    CHECK_THROWS_WITH(JsonGrammar::from_schema(chained, "s"),
                      Catch::Contains("nested deeper than 64"));
    // A definition with no value under an optional property: the property is never offered.
    const JsonGrammar optional_bad = JsonGrammar::from_schema(
        ojson::parse(R"({"properties": {"o": {"$ref": "#/$defs/Bad"}}, "$defs": {"Bad":
            {"type": "object", "properties": {"b": {"$ref": "#/$defs/Bad"}}, "required": ["b"]}}})"),
        "s");
    CHECK(matches(optional_bad, "{}"));
    CHECK_FALSE(JsonMatcher(optional_bad).feed("{\"o"));
    // Messages keep long paths short.
    ojson long_key = {{"properties", {{std::string(5000, 'k'), {{"multipleOf", 2}}}}}};
    try {
        JsonGrammar::from_schema(long_key, "s");
        FAIL("a multipleOf was taken");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).size() < 400);
    }
    // Depth: an object or array opens only where its required nesting fits, so the bound is
    // never a dead end: kMaxDepth objects deep a value is still a scalar, and a tree of required
    // arrays can still close.
    std::string deep;
    for (uint32_t i = 0; i < JsonGrammar::kMaxDepth; ++i) deep += "{\"a\":";
    const JsonGrammar object = JsonGrammar::any_object();
    JsonMatcher at_bound(object);
    REQUIRE(at_bound.feed(deep));
    CHECK_FALSE(JsonMatcher(at_bound).feed('{'));
    CHECK(at_bound.feed("1" + std::string(JsonGrammar::kMaxDepth, '}')));
    CHECK(at_bound.complete());
    const JsonGrammar tree = JsonGrammar::from_schema(
        ojson::parse(R"({"$defs": {"N": {"type": "object", "properties": {"c": {"type": "array",
            "items": {"$ref": "#/$defs/N"}}}, "required": ["c"]}},
            "type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}, "required": ["n"]})"),
        "s");
    // A node N holds an object and its array: 1 + 2 * 30 + 2 = 63 levels fit, 65 do not.
    std::string nested = "{\"n\":";
    for (int i = 0; i < 30; ++i) nested += "{\"c\":[";
    JsonMatcher in_tree(tree);
    REQUIRE(in_tree.feed(nested));
    CHECK(JsonMatcher(in_tree).feed("{\"c\":[]}"));
    REQUIRE(in_tree.feed("{\"c\":["));            // 63 levels
    CHECK_FALSE(JsonMatcher(in_tree).feed('{'));  // N would need 65
    std::string close = "]}";
    for (int i = 0; i < 30; ++i) close += "]}";
    CHECK(in_tree.feed(close + "}"));
    CHECK(in_tree.complete());
    // An optional key whose value no longer fits is not offered: 63 parents deep, a tree's
    // children (an array of trees) cannot come, its parent only as null.
    const JsonGrammar trees = JsonGrammar::from_schema(ojson::parse(schemas[7]), "s");
    std::string parents;
    for (int i = 0; i < 63; ++i) parents += "{\"value\":0,\"parent\":";
    JsonMatcher deepest(trees);
    REQUIRE(deepest.feed(parents + "{\"value\":0,"));
    CHECK_FALSE(JsonMatcher(deepest).feed("\"c"));
    CHECK_FALSE(JsonMatcher(deepest).feed("\"parent\":{"));
    CHECK(deepest.feed("\"parent\":null}" + std::string(63, '}')));
    CHECK(deepest.complete());
    // Keywords outside the subset name their path; so do bad values.
    for (auto [schema, where] : std::initializer_list<std::pair<const char*, const char*>>{
             {R"({"type": "string", "pattern": "(?=a)a"})", "s.pattern"},
             {R"({"type": "string", "pattern": 5})", "s.pattern"},
             {R"({"type": "string", "format": "uri"})", "s.format"},
             {R"({"type": "string", "minLength": 3, "maxLength": 2})", "s.minLength"},
             {R"({"type": "string", "maxLength": 5000})", "s.maxLength"},
             {R"({"type": "string", "pattern": "^[0-9]+$", "format": "email"})", "s.format"},
             {R"({"type": "string", "pattern": "^\u0001$"})", "s"},
             {R"({"properties": {"a": {"type": "integer", "multipleOf": 3}}})",
              "s.properties.a.multipleOf"},
             {R"({"type": "strin"})", "s.type"},
             {R"({"anyOf": [{"type": "object"}, {"properties": {}}]})", "s.anyOf"},
             {R"({"$ref": "#/$defs/missing"})", "s.$ref"},
             {R"({"enum": []})", "s.enum"},
             {R"({"type": "array", "minItems": 3, "maxItems": 2})", "s.minItems"},
             {R"({"type": "string", "enum": [1, 2]})", "s.enum"},
             {R"({"required": ["id"], "additionalProperties": false})", "s.required"},
             {R"({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"})", "s.$ref"},
             {R"({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}]}}, "$ref": "#/$defs/A"})",
              "s.$ref"},
             {R"({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/A"}]}},
                  "$ref": "#/$defs/A"})",
              "s.$ref"},
             {R"({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
                  "$ref": "#/$defs/A"})",
              "s.$ref"},
             {R"({"$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}},
                  "required": ["n"]}}, "$ref": "#/$defs/N"})",
              "s.$ref"},
             // Constraints beside enum/const, anyOf/oneOf or $ref would be dropped: refused.
             {R"({"anyOf": [{"type": "object"}, {"type": "null"}], "required": ["a"]})",
              "s.required"},
             {R"({"enum": [{}], "required": ["a"]})", "s.required"},
             {R"({"type": "array", "maxItems": 1, "enum": [[1, 2]]})", "s.maxItems"},
             {R"({"enum": ["a", "b"], "anyOf": [{"const": "a"}]})", "s.anyOf"},
             {R"({"$defs": {"A": {"type": "object"}}, "$ref": "#/$defs/A", "required": ["x"]})",
              "s.required"},
             {R"({"enum": [1], "type": 5})", "s.type"},
             {R"({"enum": ["a"], "type": ["string", "bogus"]})", "s.type"},
             {R"({"$defs": {"a": {}}, "$ref": "#/$defs/a/b"})", "s.$ref"},
             {"false", "s"}}) {
        INFO(schema);
        CHECK_THROWS_WITH(JsonGrammar::from_schema(ojson::parse(schema), "s"),
                          Catch::StartsWith(std::string(where) + ":"));
    }
}

TEST_CASE("json grammar: string patterns, formats and lengths walk to valid documents",
          "[json_grammar][regex]") {
    static const char* const kClose = "\"}]0,:1tfnrueals";  // walk()'s own
    // Each walked document is checked by the validator of json_schema_check.hpp: std::regex's
    // ECMAScript search for the patterns, the RFCs' rules (a real calendar) for the formats.
    // Each with the bytes its walks close with, in order (an address's local part takes '}',
    // so '@' comes before it; a searched pattern's text must come before the quote).
    const std::pair<const char*, const char*> cases[] = {
        {R"({"type": "object", "properties": {"day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"}, "t": {"type": "string",
            "format": "time"}, "id": {"type": "string", "format": "uuid"}, "mail": {"type":
            "string", "format": "email"}, "ip": {"type": "string", "format": "ipv4"}},
            "required": ["day", "at", "t", "id", "mail", "ip"]})",
         "\"@}],:a0.-TZ"},
        {R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})", kClose},
        {R"({"type": "string", "pattern": "x|^c"})", "\"x"},
        {R"({"type": "string", "minLength": 2, "maxLength": 5})", kClose},
        {R"({"type": ["string", "null"], "pattern": "^[a-z ]+$", "minLength": 3, "maxLength": 8})",
         kClose},
        {R"({"type": "array", "items": {"type": "string", "pattern": "^\\w+$"}, "maxItems": 3})",
         kClose},
        {R"({"type": "string", "pattern": "^a\\nb\\t?$"})", "\"\\"},
        {R"({"type": "string", "pattern": "^\"x\\\\/?$"})", "\"x\\/"},
        {R"({"properties": {"code": {"pattern": "^[0-9a-f]{4}$"}}, "required": ["code"]})", kClose},
    };
    std::mt19937 rng(13);
    for (const auto& [text, close] : cases) {
        const ojson schema = ojson::parse(text);
        INFO(schema.dump());
        const JsonGrammar g = JsonGrammar::from_schema(schema, "schema");
        for (int i = 0; i < 60; ++i) {
            const std::string doc = walk(g, rng, rng() % 40, "", close);
            INFO(doc);
            REQUIRE(nlohmann::json::accept(doc));
            CHECK(test::schema_valid(ojson::parse(doc), schema));
        }
    }
    const auto grammar = [&](size_t i) {
        return JsonGrammar::from_schema(ojson::parse(cases[i].first), "s");
    };
    const JsonGrammar code = grammar(1), two_to_five = grammar(3), line = grammar(6);
    CHECK(matches(code, "\"AB-123\""));
    CHECK_FALSE(matches(code, "\"AB-12\""));
    CHECK_FALSE(matches(code, "\"\\u0041B-123\""));    // no \u escapes in a constrained string
    CHECK_FALSE(JsonMatcher(code).feed("\"AB-1234"));  // refused at the byte that dies
    CHECK(matches(two_to_five, "\"\xc3\xa9\xf0\x9f\x98\x80\""));  // code points, not bytes
    CHECK_FALSE(matches(two_to_five, "\"\xc3\xa9\""));
    CHECK(matches(line, "\"a\\nb\""));
    CHECK_FALSE(matches(line, "\"a\\u000ab\""));
    // A schema's automata are bounded: identical constraints share one DFA (64 properties of
    // maxLength 1000 make one), and more than kMaxPatterns distinct ones are refused.
    ojson same = {{"type", "object"}, {"properties", ojson::object()}};
    ojson distinct = {{"type", "object"}, {"properties", ojson::object()}};
    for (int i = 0; i < 64; ++i)
        same["properties"]["p" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 1000}};
    for (int half = 0; half < 2; ++half) {
        ojson part = {{"type", "object"}, {"properties", ojson::object()}};
        for (int i = 0; i < 33; ++i)
            part["properties"]["p" + std::to_string(i)] = {{"type", "integer"},
                                                           {"minimum", 100 * half + i}};
        distinct["properties"]["h" + std::to_string(half)] = part;
    }
    CHECK(matches(JsonGrammar::from_schema(same, "s"), "{\"p0\":\"x\"}"));
    CHECK_THROWS_WITH(JsonGrammar::from_schema(distinct, "s"),
                      Catch::StartsWith("s.properties.h1.properties.p") &&
                          Catch::Contains("more than 64 distinct"));
    // The bounds' largest lengths compile (the any-character DFA of 1000 code points).
    CHECK(matches(
        JsonGrammar::from_schema(
            ojson::parse(R"({"type": "string", "minLength": 999, "maxLength": 1000})"), "s"),
        "\"" + std::string(999, 'x') + "\""));
    const JsonGrammar dates =
        JsonGrammar::from_schema(ojson::parse(R"({"type": "string", "format": "date"})"), "s");
    for (const char* ok : {"\"2023-02-28\"", "\"2024-12-31\"", "\"0001-04-30\""})
        CHECK(matches(dates, ok));
    // Fewer than the format allows, never more: 29 February is not generated (leap years).
    for (const char* bad :
         {"\"2023-02-29\"", "\"2024-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"", "\"2023-1-01\""})
        CHECK_FALSE(matches(dates, bad));
}

TEST_CASE("json grammar: integer bounds take exactly the integers in range", "[json_grammar]") {
    // Every integer near and inside each range, and the walks, against plain comparisons.
    struct Range {
        const char* schema;
        int64_t lo, hi;  // the integers the schema takes
    };
    const int64_t big = 999999999999999999;
    const Range ranges[] = {
        {R"({"type": "integer", "minimum": 0, "maximum": 100})", 0, 100},
        {R"({"type": "integer", "minimum": -37, "maximum": 1234})", -37, 1234},
        {R"({"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 200.5})", 10, 200},
        {R"({"type": "integer", "minimum": -205, "maximum": -3})", -205, -3},
        {R"({"type": "integer", "minimum": 7.2, "maximum": 7.9})", 8, 7},  // none: refused
        {R"({"type": "integer", "minimum": 5})", 5, big},
        {R"({"type": "integer", "maximum": -12})", -big, -12},
        {R"({"type": "integer", "minimum": 1999, "maximum": 30001})", 1999, 30001},
        {R"({"exclusiveMinimum": -1})", 0, big},
    };
    std::mt19937 rng(17);
    for (const Range& r : ranges) {
        INFO(r.schema);
        const ojson schema = ojson::parse(r.schema);
        if (r.lo > r.hi) {
            CHECK_THROWS_WITH(JsonGrammar::from_schema(schema, "s"), Catch::Contains("s.minimum"));
            continue;
        }
        const JsonGrammar g = JsonGrammar::from_schema(schema, "s");
        std::vector<int64_t> probes;
        for (const int64_t edge : {r.lo, r.hi, int64_t{0}, int64_t{-1}, int64_t{1}})
            for (int64_t d = -60; d <= 60; ++d)
                if (std::abs(edge) < big - 100) probes.push_back(edge + d);
        for (int i = 0; i < 2000; ++i)
            probes.push_back(static_cast<int64_t>(rng() % 4000000) - 2000000);
        for (const int64_t n : probes) {
            INFO(n);
            CHECK(matches(g, std::to_string(n)) == (n >= r.lo && n <= r.hi));
        }
        CHECK_FALSE(matches(g, "-0"));
        CHECK_FALSE(matches(g, "0" + std::to_string(std::max<int64_t>(r.lo, 1))));
        for (int i = 0; i < 40; ++i) {
            const std::string doc = walk(g, rng, rng() % 12);
            INFO(doc);
            REQUIRE(nlohmann::json::accept(doc));
            CHECK(test::schema_valid(ojson::parse(doc), schema));
        }
    }
    for (auto [schema, where] : std::initializer_list<std::pair<const char*, const char*>>{
             {R"({"type": "number", "minimum": 0})", "s.minimum"},
             {R"({"type": "integer", "maximum": 1e19})", "s.maximum"},
             {R"({"type": "integer", "exclusiveMinimum": true, "minimum": 0})",
              "s.exclusiveMinimum"},
             {R"({"type": "integer", "minimum": "1"})", "s.minimum"}}) {
        INFO(schema);
        CHECK_THROWS_WITH(JsonGrammar::from_schema(ojson::parse(schema), "s"),
                          Catch::StartsWith(std::string(where) + ":"));
    }
}

TEST_CASE("token constraint: the mask is each token tried alone, in strings and out of them",
          "[json_grammar]") {
    // A byte-level BPE vocabulary (SmolLM2's, trimmed), a SentencePiece one with byte fallback
    // (Llama 2's) and single bytes (the tiny Qwen3's): random objects encoded, then at each token
    // the mask against allows() of every id alone; each document's own tokens are taken.
    const JsonGrammar g = JsonGrammar::any_object();
    std::mt19937 rng(23);
    for (const char* path :
         {"tokenizers/smollm2/tokenizer.json", "tokenizers/llama2/tokenizer.json",
          "hf_models/qwen3_qknorm_window/tokenizer.json"}) {
        INFO(path);
        const Tokenizer tok = Tokenizer::load(test::fixture(path).string());
        const auto texts = std::make_shared<const TokenTexts>(tok);
        const auto grammar =
            std::make_shared<const TokenGrammar>(TokenGrammar{g, texts, tok.stop_ids()});
        for (int doc = 0; doc < 6; ++doc) {
            ojson v = random_value(rng, 0);
            if (!v.is_object()) v = ojson{{"k", v}};
            const std::string text = v.dump(doc % 2 ? 1 : -1);
            INFO(text);
            TokenMatcher m(grammar);
            std::vector<float> logits(tok.vocab_size());
            for (int32_t id : tok.encode(text, false)) {
                std::fill(logits.begin(), logits.end(), 0.0f);
                const size_t count = m.mask(logits);
                size_t allowed = 0;
                for (size_t i = 0; i < logits.size(); ++i) {
                    const bool alone = m.allows(static_cast<int32_t>(i));
                    INFO("id " << i << " text " << texts->text[i]);
                    REQUIRE((logits[i] == 0.0f) == alone);
                    allowed += alone;
                }
                REQUIRE(count == allowed);
                REQUIRE(m.allows(id));
                m.accept(id);
            }
            CHECK(m.complete());
            for (int32_t stop : tok.stop_ids()) CHECK(m.allows(stop));
        }
    }
}

}  // namespace json_grammar_test
