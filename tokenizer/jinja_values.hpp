// Internal to tokenizer/jinja_*.cpp: the semantics of Jinja values, which are Python's (str(),
// ==, +, slicing, the string and dict methods) plus jinja2's filters and tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja_subset.hpp"

namespace qforge::jinja::detail {

// Throws qforge::Error("chat template: " + what).
[[noreturn]] void fail(const std::string& what);
// Fails with "nested deeper than kMaxTemplateDepth levels".
[[noreturn]] void fail_too_deep();
std::string too_deep_message();

inline constexpr std::string_view kSpace = " \t\n\r\f\v";  // Python's str.strip() set (ASCII)

std::string str(const Value& v);   // Python's str(); undefined prints as ""
std::string repr(const Value& v);  // Python's repr(), for lists and dicts printed whole
bool truthy(const Value& v);
// `s` without the characters of `chars` at the left and/or right end (str.strip and friends).
std::string strip(const std::string& s, std::string_view chars, bool left, bool right);
const char* kind_name(const Value& v);
bool is_int_like(const Value& v);  // int or bool (Python's bool is an int)
int64_t as_int(const Value& v);    // of an int-like value

// The elements a for loop or `in` sees: list items, a string's characters, a dict's keys.
Value::List items_of(const Value& v);
// obj[key] and obj.key: dict entries, list and string elements; undefined when absent.
Value get_item(const Value& obj, const Value& key);

using Args = std::vector<Value>;
Value call_method(const Value& obj, const std::string& name, const Args& args);
Value call_function(const std::string& name, const Args& args);  // raise_exception, range
Value apply_filter(const std::string& name, const Value& v, const Args& args);
bool apply_test(const std::string& name, const Value& v, const Args& args);
Value arithmetic(const std::string& op, const Value& a, const Value& b);  // + - * / // % ** ~
bool compare(const std::string& op, const Value& a, const Value& b);      // == != < > <= >= in

}  // namespace qforge::jinja::detail
