// JSON documents byte by byte, for constrained generation (the API's response_format
// json_object and json_schema, vLLM's guided_json, llama.cpp's json_schema): a JsonGrammar is
// what the document may be, compiled once from a JSON schema; a JsonMatcher follows one
// document as its bytes come and says whether a byte may come next and whether the text so far
// is a whole document. runtime/token_constraint.hpp lifts it to tokens.
//
// What a matched text is: JSON as RFC 8259 defines it (strings of valid UTF-8 with no control
// characters and valid escapes, surrogate pairs whole; numbers without leading zeros), so any
// JSON parser reads it, and a value of the schema, so any validator accepts it. The matcher may
// allow fewer texts than the schema does, never more: objects with declared properties give
// them in the schema's order (each required one, each optional one or not), and no others
// (as llama.cpp's json-schema-to-grammar and OpenAI's strict mode do); "integer" is digits with
// no fraction or exponent; a number has at most kMaxNumberBytes bytes and an exponent of at most
// two digits (so every double parser reads it finitely); whitespace between tokens is spaces
// and tabs, at most kMaxSpaces in a row, and at most one line break (then kMaxSpaces more), as
// llama.cpp's JSON grammar bounds it: pretty-printed JSON fits, a model that would pad forever
// (small models do) cannot; no carriage returns; at most kMaxDepth objects and arrays nested
// (one is opened only where its schema's required nesting still fits, so no prefix taken is a
// dead end).
//
// The schema subset (anything else is an Error naming its path, never ignored):
//   type: one of object, array, string, number, integer, boolean, null, or a list of them;
//   properties, required, additionalProperties (true, false or a schema: with no properties,
//     any keys whose values follow it; beside properties, only the properties are generated);
//   items (a schema), minItems, maxItems;
//   for strings, pattern (ECMA-262 syntax within what runtime/regex_dfa.hpp follows, searched
//     for as validators do), format (date, time, date-time, uuid, email, ipv4: patterns that
//     take only valid values, fewer than the format allows), minLength and maxLength (code
//     points, at most RegexDfa::kMaxRepeat); such a string's content is followed by a DFA (one
//     per distinct constraint, at most kMaxPatterns in a schema and RegexDfa::kMaxDfaCells
//     transitions in all), so it takes no \u escapes (its control characters are those
//     with escapes of their own);
//   for integers, minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers within
//     +-(10^18 - 1)), followed by a DFA of the range's decimal texts (no -0);
//   enum and const (any JSON values, matched as their
//     compact text; beside them only a type, which keeps the values of that type);
//   anyOf and oneOf whose alternatives start with different bytes (types), alone;
//   $ref to #/$defs/NAME or #/definitions/NAME (recursion allowed), alone;
//   annotations, ignored: title, description, $schema, $id, $comment, default, examples,
//     deprecated, readOnly, writeOnly; and an empty schema (or true): any JSON value.
// A schema nests at most kMaxSchemaDepth levels ($ref hops included) and holds at most
// kMaxSchemaNodes schemas; one with no finite value (a definition that is only itself, an
// object that requires itself) is an Error too.
#pragma once

#include <bitset>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/regex_dfa.hpp"

namespace qforge {

class JsonGrammar {
  public:
    static constexpr uint32_t kMaxSpaces = 20;
    static constexpr uint32_t kMaxNumberBytes = 32;
    static constexpr uint32_t kMaxDepth = 64;
    static constexpr size_t kMaxLiterals = 64;  // in one enum, and properties in one object
    static constexpr uint32_t kMaxSchemaDepth = 64;
    static constexpr size_t kMaxSchemaNodes = 4096;
    static constexpr size_t kMaxPatterns = 64;  // distinct string and integer DFAs in a schema

    // Any JSON object (the API's response_format json_object).
    static JsonGrammar any_object();
    // A JSON schema (above); `where` names it in errors ("response_format.json_schema.schema").
    // Properties keep the schema's order, so it is read as an ordered_json.
    static JsonGrammar from_schema(const nlohmann::ordered_json& schema, const std::string& where);

    // alias: a $ref, the node `values`.
    enum class Kind : uint8_t {
        any,
        object,
        array,
        string,
        number,
        integer,
        literals,
        choice,
        alias
    };
    struct Property {
        std::string key;  // its JSON text, quotes included
        uint32_t node = 0;
        bool required = false;
    };
    struct Node {
        Kind kind = Kind::any;
        std::vector<Property> properties;  // object: in order
        bool free_keys = false;            // object: any keys, values of `values`
        uint32_t values = 0;  // object with free keys; array: its items; alias: its target
        uint64_t min_items = 0, max_items = UINT64_MAX;  // array
        std::vector<std::string> literals;               // literals: compact JSON texts
        std::vector<uint32_t> options;  // choice: alternatives with disjoint first bytes
        // string: its content's DFA, pattern(i), if constrained; integer: its text's, if bounded
        uint32_t pattern = kNoPattern;
    };
    static constexpr uint32_t kNoPattern = UINT32_MAX;
    const RegexDfa& pattern(uint32_t i) const { return patterns_[i]; }
    const Node& node(uint32_t i) const { return nodes_[i]; }
    uint32_t root() const { return root_; }
    // Built-in nodes every grammar has.
    static constexpr uint32_t kAny = 0, kBoolean = 1, kNull = 2, kAnyObject = 3, kAnyArray = 4,
                              kString = 5, kNumber = 6;
    // Whether a value of `node` may start with byte c.
    bool starts(uint32_t node, uint8_t c) const { return first_[node][c]; }
    // The fewest objects and arrays a value of `node` nests (to open one only where it fits).
    uint32_t min_depth(uint32_t node) const { return min_depth_[node]; }

  private:
    JsonGrammar();
    friend class SchemaCompiler;
    // Each node's first bytes and min_depth, from the nodes (fixed points over the graph).
    void derive();
    std::vector<Node> nodes_;
    std::vector<RegexDfa> patterns_;
    std::vector<std::bitset<256>> first_;
    std::vector<uint32_t> min_depth_;
    uint32_t root_ = kAny;
};

class JsonMatcher {
  public:
    explicit JsonMatcher(const JsonGrammar& grammar) : g_(&grammar) {}
    // Whether `byte` may come next; if not, the matcher is dead (every later feed fails): copy it
    // first to try a byte and keep the state.
    bool feed(uint8_t byte);
    bool feed(std::string_view bytes) {
        for (char c : bytes)
            if (!feed(static_cast<uint8_t>(c))) return false;
        return true;
    }
    // The text so far is a whole document (a number may still grow: "1" is whole, "12" too).
    bool complete() const;
    // The document is whole and no byte may follow (a closed object or array, a string, a
    // literal name; a number only once it is as long as it may be).
    bool finished() const;
    bool dead() const { return dead_; }
    // Inside a string (a value's or a key's) between characters, any string content may come
    // next (not in a string whose content a pattern constrains).
    bool in_string_content() const {
        return !dead_ && !stack_.empty() &&
               (stack_.back().frame == Frame::key ||
                (stack_.back().frame == Frame::string &&
                 g_->node(stack_.back().node).pattern == JsonGrammar::kNoPattern)) &&
               stack_.back().phase == 0 && stack_.back().utf8_need == 0;
    }

  private:
    // What a frame of the stack is following, and where in it.
    enum class Frame : uint8_t { object, array, string, key, number, literal, key_literal };
    struct Entry {
        Frame frame;
        uint8_t phase = 0;
        uint8_t utf8_need = 0;                   // string: continuation bytes still due
        uint8_t utf8_lo = 0x80, utf8_hi = 0xBF;  // string: the next continuation byte's range
        uint32_t node = 0;
        uint32_t index = 0;  // object: next property; array: items so far; literal: bytes so far
        uint32_t value = 0;  // object: the node of the value after the key; string: \u digits
        uint64_t mask = 0;   // literal / key_literal: candidates still matching
        uint32_t re = 0;     // string with a pattern, integer with bounds: its DFA's state
    };
    bool start_value(uint32_t node, uint8_t c);
    bool value_done();
    bool close_container();  // the object or array on top ends
    bool object_byte(Entry& e, uint8_t c);
    bool array_byte(Entry& e, uint8_t c);
    bool string_byte(Entry& e, uint8_t c);
    bool pattern_step(Entry& e, uint8_t c);  // a string's pattern, if it has one
    int number_byte(Entry& e, uint8_t c);    // 1 taken, 0 ends the number (re-feed), -1 refused
    bool number_whole(const Entry& e) const;
    int literal_byte(Entry& e, uint8_t c);  // as number_byte
    bool space(uint8_t c);                  // whitespace between tokens, within the bounds
    void end_spaces() {
        spaces_ = 0;
        line_break_ = false;
    }
    bool open_keys(Entry& e);  // a key starts in object e: its candidates (or a free key)
    // The properties whose key may come next in object e (bit j: property j); with free keys,
    // 1 if a key may come.
    uint64_t key_candidates(const Entry& e) const;
    bool fits(uint32_t node) const;  // a value of node may open here (its nesting fits)
    bool closable(const Entry& e) const;
    bool more_keys(const Entry& e) const;

    const JsonGrammar* g_;
    std::vector<Entry> stack_;
    uint32_t containers_ = 0;  // objects and arrays open on the stack
    uint32_t spaces_ = 0;      // spaces and tabs in a row (since the line break, if any)
    bool line_break_ = false;  // the whitespace in a row holds a line break
    bool done_ = false, dead_ = false;
};

}  // namespace qforge
