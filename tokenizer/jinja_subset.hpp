// A small interpreter for the subset of Jinja2 that chat templates of Llama-family models use,
// so that `qforge generate` can render a model's own template instead of matching known ones.
//
// Rendered as transformers renders chat templates: jinja2's ImmutableSandboxedEnvironment with
// trim_blocks and lstrip_blocks, undefined names empty and falsy, Python's str() for output.
//
// Supported: text; {{ expr }}; {% if / elif / else / endif %}; {% for x in xs %} and
// {% for k, v in xs %} with {% else %} and loop.index/index0/first/last/length/revindex/revindex0
// (each iteration in its own scope, as jinja2 does); {% set name = expr %}; namespace(k=v, ...)
// and {% set ns.k = expr %} (one object shared by every scope, as jinja2's Namespace, which
// loops use to carry state out; Qwen3's template does); {# comments #};
// whitespace control (-, and + to keep lstrip_blocks off); expressions with literals (strings,
// integers, floats, booleans, none, lists, dicts), names, attribute and item access, slices,
// `a if b else c`, not/and/or, comparisons and `in`, + - * / // % ** and ~; the tests defined,
// undefined, none, string, number, integer, mapping, sequence, iterable, boolean, true, false,
// odd, even, divisibleby; the filters trim, upper, lower, capitalize, title, length, count,
// string, int, float, first, last, default (d), join, replace, list; the string methods strip,
// lstrip, rstrip, upper, lower, startswith, endswith, split, replace, title, capitalize; the
// dict methods get, items, keys, values; the functions raise_exception and range.
//
// Anything else (macros, tojson, call blocks, keyword arguments other than namespace's, ...) is an
// Error naming the construct,
// so a template is either rendered as jinja2 would or refused, never approximated.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qforge::jinja {

// Real chat templates nest blocks a few levels and expressions a few dozen nodes deep (the
// largest, Llama 3.1's tool-calling template, under 20). Parsing, evaluation, printing and
// destruction of a template and of its values all recurse once per level, so a template or a
// value nested deeper than this is refused ("chat template nested deeper than 256 levels")
// rather than allowed to exhaust the stack.
inline constexpr int kMaxTemplateDepth = 256;

class Value {
  public:
    enum class Kind : uint8_t {
        undefined,
        none,
        boolean,
        integer,
        floating,
        string,
        list,
        dict,
        ns,  // jinja2's namespace(): attributes set in place, seen through every copy
    };
    using List = std::vector<Value>;
    using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's

    Value() = default;  // undefined
    static Value none();
    Value(bool b);
    Value(int64_t i);
    Value(int i) : Value(static_cast<int64_t>(i)) {}
    Value(double f);
    Value(std::string s);
    Value(const char* s) : Value(std::string(s)) {}
    Value(List l);
    Value(Dict d);
    static Value make_namespace(Dict attributes);

    Kind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == Kind::undefined; }
    bool boolean() const { return b_; }
    int64_t integer() const { return i_; }
    double floating() const { return f_; }
    const std::string& string() const { return s_; }
    const List& list() const { return *list_; }
    const Dict& dict() const { return *dict_; }
    const Value* find(std::string_view key) const;   // dict entry or namespace attribute
    const Dict& attributes() const { return *ns_; }  // of a namespace
    // Sets a namespace attribute in place. A value holding a namespace is refused: a namespace
    // that reaches itself could never be printed or freed.
    void set_attribute(const std::string& name, Value v) const;
    bool holds_namespace() const;         // is or contains one
    int depth() const { return depth_; }  // list/dict nesting levels, 0 for scalars

  private:
    Kind kind_ = Kind::undefined;
    int depth_ = 0;
    bool b_ = false;
    int64_t i_ = 0;
    double f_ = 0.0;
    std::string s_;
    std::shared_ptr<const List> list_;
    std::shared_ptr<const Dict> dict_;
    std::shared_ptr<Dict> ns_;
};

// Renders `source` with the given top-level variables. Throws qforge::Error with "template:" and
// the problem (a construct outside the subset, a syntax error, raise_exception's message).
std::string render(std::string_view source, const std::map<std::string, Value>& variables);

// Parses `source` and throws the Error of a template nested deeper than kMaxTemplateDepth; any
// other problem (a construct outside the subset) is left for render to report, so a model whose
// template qforge cannot render still converts. Readers of tokenizer files call this, so the
// error names the file that holds the template.
void check_nesting(std::string_view source);

}  // namespace qforge::jinja
