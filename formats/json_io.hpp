// Every JSON (and CBOR) document qforge reads comes through here: config.json, tokenizer.json and
// its companions, .qf headers, safetensors headers, HF quantization configs, --resume state.
// Two promises to the rest of the code:
//   - a parsed value nests at most kMaxJsonDepth levels, so walking, copying or printing it
//     recursively cannot exhaust the stack;
//   - JsonView reads values with a type check and a key path, so a wrong type is an Error
//     "<file>: key 'a.b[2].c': expected a string, found number 5", never a library exception.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

namespace qforge {

// Real files nest shallowly: a .qf header about 6 levels (provenance.recipe.rules[i].match),
// tokenizer.json about 5 (a Sequence of pre-tokenizers holding a Split pattern), config.json 3,
// a safetensors header 3. 256 leaves a wide margin for anything a writer could reasonably emit
// and keeps every recursive walk (nlohmann's dump and copy, our Sequence flattening) far from
// the stack limit: each level costs a few hundred bytes of stack at most.
constexpr int kMaxJsonDepth = 256;

struct JsonParseOptions {
    // Names the document in messages: "header is not valid JSON", "header nested deeper...".
    // Empty: "not valid JSON", "JSON nested deeper...".
    std::string_view what;
    int max_depth = kMaxJsonDepth;
    // nlohmann keeps one of repeated keys silently; readers that must not guess refuse them.
    bool reject_duplicate_keys = false;
    // With reject_duplicate_keys: a key repeated at the top level is a tensor named twice.
    bool top_keys_are_tensors = false;
};

// Parses untrusted JSON text. Throws Error naming `file` for invalid JSON and for nesting deeper
// than options.max_depth ("<file>: JSON nested deeper than 256 levels at byte 1234").
nlohmann::json parse_json(std::string_view text, const std::string& file,
                          const JsonParseOptions& options = {});
// parse_json's checks, keeping each object's keys in the text's order (a JSON schema's
// properties); duplicate keys are not looked for.
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& file,
                                          const JsonParseOptions& options = {});
// Maps the file at `path` and parses it.
nlohmann::json read_json_file(const std::string& path, const JsonParseOptions& options = {});
// Parses untrusted CBOR (strict: the bytes hold exactly one value), with the same depth limit.
nlohmann::json parse_cbor(std::span<const uint8_t> bytes, const std::string& file,
                          std::string_view what = "CBOR");

// A JSON value for messages: "number 5", "string \"ab\"", "an array of 3 elements"; bounded, so a
// megabyte string or a deep document never ends up in an error line.
std::string describe_json(const nlohmann::json& v);
// A string for messages, as a JSON string literal: at most 60 bytes of it, then "... (N bytes)";
// bytes that are not UTF-8 (a cut, or a GGUF piece) shown as U+FFFD, never an exception.
std::string quoted_excerpt(std::string_view s);
// A library message without its "[json.exception.type_error.302] " prefix.
std::string json_exception_text(const nlohmann::json::exception& e);

// Throws the Error with_json_errors makes of a library exception.
[[noreturn]] void throw_json_backstop(const std::string& file, const nlohmann::json::exception& e);

// Runs `body`; a nlohmann exception escaping it (a value read without JsonView) becomes an Error
// naming `file`. A backstop: the readers check types with JsonView first.
template <class F>
decltype(auto) with_json_errors(const std::string& file, F&& body) {
    try {
        return body();
    } catch (const nlohmann::json::exception& e) {
        throw_json_backstop(file, e);
    }
}

// A value inside a parsed document, with the file it came from and its key path. A view may be
// absent (the key is not there); typed reads of an absent or null value fail unless they take a
// default ("_or"), as transformers treats null as unset. The referenced json and file name must
// outlive the view.
class JsonView {
  public:
    JsonView(const nlohmann::json& root, const std::string& file, std::string path = {})
        : v_(&root), file_(&file), path_(std::move(path)) {}

    const std::string& file() const { return *file_; }
    const std::string& path() const { return path_; }
    // The value; nullptr when the key is absent.
    const nlohmann::json* raw() const { return v_; }
    // The value, which must be present (null is a value here).
    const nlohmann::json& value() const;

    bool absent() const { return v_ == nullptr; }
    bool is_set() const { return v_ && !v_->is_null(); }  // present and not null
    bool is_object() const { return v_ && v_->is_object(); }
    bool is_array() const { return v_ && v_->is_array(); }
    bool is_string() const { return v_ && v_->is_string(); }
    bool is_boolean() const { return v_ && v_->is_boolean(); }

    // A member. This must be an object, or absent/null (then the member is absent too).
    JsonView operator[](std::string_view key) const;
    bool has(std::string_view key) const { return (*this)[key].is_set(); }
    // An element of an array (checked: this must be an array holding index i).
    JsonView operator[](size_t i) const;
    // The number of elements or members; this must be an array (or object, for members).
    size_t array_size() const;
    size_t object_size() const;
    // Fails unless this is an object (or array), naming the key and what was found.
    const nlohmann::json& object() const;
    const nlohmann::json& array() const;

    std::string string() const;
    std::string string_or(std::string fallback) const;
    bool boolean() const;
    bool boolean_or(bool fallback) const;
    double number() const;  // any JSON number, finite
    double number_or(double fallback) const;
    // Integers in [lo, hi]: a non-integer (2.5, 1e300), a negative where lo >= 0 or a value past
    // hi is refused with the value, never wrapped.
    int64_t integer(int64_t lo = std::numeric_limits<int64_t>::min(),
                    int64_t hi = std::numeric_limits<int64_t>::max()) const;
    int64_t integer_or(int64_t fallback, int64_t lo = std::numeric_limits<int64_t>::min(),
                       int64_t hi = std::numeric_limits<int64_t>::max()) const;
    uint64_t unsigned_integer(uint64_t hi = std::numeric_limits<uint64_t>::max()) const;

    // Calls f(key, view) for each member (this must be an object).
    template <class F>
    void for_each_member(F&& f) const {
        for (const auto& [key, value] : object().items()) f(key, child(value, key));
    }
    // Calls f(view) for each element (this must be an array).
    template <class F>
    void for_each_element(F&& f) const {
        const nlohmann::json& a = array();
        for (size_t i = 0; i < a.size(); ++i) f(element(a[i], i));
    }

    // Throws Error "<file>: key '<path>': <detail>" (without the key part at the top level).
    [[noreturn]] void fail(const std::string& detail) const;
    // "expected <what>, found <description of the value>".
    [[noreturn]] void expected(std::string_view what) const;

  private:
    JsonView(const nlohmann::json* v, const std::string* file, std::string path)
        : v_(v), file_(file), path_(std::move(path)) {}
    JsonView child(const nlohmann::json& v, std::string_view key) const;
    JsonView element(const nlohmann::json& v, size_t i) const;
    std::string child_path(std::string_view key) const;

    const nlohmann::json* v_;
    const std::string* file_;
    std::string path_;
};

}  // namespace qforge
