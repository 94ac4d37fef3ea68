// Jinja values with Python's semantics (jinja_values.hpp), and the Value type itself.
#include "tokenizer/jinja_values.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.hpp"
#include "tokenizer/utf8.hpp"

namespace qforge::jinja {

namespace detail {

void fail(const std::string& what) { throw Error("chat template: " + what); }
void fail_too_deep() { throw Error(too_deep_message()); }
std::string too_deep_message() {
    return "chat template nested deeper than " + std::to_string(kMaxTemplateDepth) + " levels";
}

// Python's str() of a float: the shortest digits that read back to the same double.
static std::string float_text(double f) {
    if (std::isnan(f)) return "nan";
    if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
    char buf[40];
    for (int p = 1; p <= 17; ++p) {
        std::snprintf(buf, sizeof buf, "%.*g", p, f);
        if (std::strtod(buf, nullptr) == f) break;
    }
    std::string s = buf;
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
}

std::string str(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return "";
        case Value::Kind::none:
            return "None";
        case Value::Kind::boolean:
            return v.boolean() ? "True" : "False";
        case Value::Kind::integer:
            return std::to_string(v.integer());
        case Value::Kind::floating:
            return float_text(v.floating());
        case Value::Kind::string:
            return v.string();
        case Value::Kind::list:
        case Value::Kind::dict:
        case Value::Kind::ns:
            return repr(v);
    }
    return "";
}

// Python's repr(), for lists and dicts printed whole.
std::string repr(const Value& v) {
    if (v.kind() == Value::Kind::string) {
        const std::string& s = v.string();
        const char q =
            s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
        std::string out(1, q);
        for (char c : s) {
            if (c == '\\' || c == q) out += '\\';
            if (c == '\n')
                out += "\\n";
            else if (c == '\t')
                out += "\\t";
            else if (c == '\r')
                out += "\\r";
            else
                out += c;
        }
        return out + q;
    }
    if (v.kind() == Value::Kind::list) {
        std::string out = "[";
        for (size_t i = 0; i < v.list().size(); ++i) out += (i ? ", " : "") + repr(v.list()[i]);
        return out + "]";
    }
    if (v.kind() == Value::Kind::dict) {
        std::string out = "{";
        for (size_t i = 0; i < v.dict().size(); ++i)
            out +=
                (i ? ", " : "") + repr(Value(v.dict()[i].first)) + ": " + repr(v.dict()[i].second);
        return out + "}";
    }
    if (v.kind() == Value::Kind::ns) {  // jinja2's Namespace.__repr__
        std::string out = "<Namespace {";
        for (size_t i = 0; i < v.attributes().size(); ++i)
            out += (i ? ", " : "") + repr(Value(v.attributes()[i].first)) + ": " +
                   repr(v.attributes()[i].second);
        return out + "}>";
    }
    return v.is_undefined() ? "Undefined" : str(v);
}

bool truthy(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
        case Value::Kind::none:
            return false;
        case Value::Kind::boolean:
            return v.boolean();
        case Value::Kind::integer:
            return v.integer() != 0;
        case Value::Kind::floating:
            return v.floating() != 0.0;
        case Value::Kind::string:
            return !v.string().empty();
        case Value::Kind::list:
            return !v.list().empty();
        case Value::Kind::dict:
            return !v.dict().empty();
        case Value::Kind::ns:
            return true;  // a Python object without __bool__ or __len__
    }
    return false;
}

const char* kind_name(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return "undefined";
        case Value::Kind::none:
            return "none";
        case Value::Kind::boolean:
            return "bool";
        case Value::Kind::integer:
            return "int";
        case Value::Kind::floating:
            return "float";
        case Value::Kind::string:
            return "string";
        case Value::Kind::list:
            return "list";
        case Value::Kind::dict:
            return "dict";
        case Value::Kind::ns:
            return "namespace";
    }
    return "?";
}

// Python treats bool as an int in arithmetic and comparisons.
static bool is_number(const Value& v) {
    return v.kind() == Value::Kind::integer || v.kind() == Value::Kind::floating ||
           v.kind() == Value::Kind::boolean;
}
bool is_int_like(const Value& v) {
    return v.kind() == Value::Kind::integer || v.kind() == Value::Kind::boolean;
}
int64_t as_int(const Value& v) {
    return v.kind() == Value::Kind::boolean ? int64_t{v.boolean()} : v.integer();
}
static double as_double(const Value& v) {
    return v.kind() == Value::Kind::floating ? v.floating() : static_cast<double>(as_int(v));
}

static bool equal(const Value& a, const Value& b) {
    if (is_number(a) && is_number(b)) {
        if (is_int_like(a) && is_int_like(b)) return as_int(a) == as_int(b);
        return as_double(a) == as_double(b);
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
        case Value::Kind::undefined:
        case Value::Kind::none:
            return true;
        case Value::Kind::string:
            return a.string() == b.string();
        case Value::Kind::list:
            return std::equal(a.list().begin(), a.list().end(), b.list().begin(), b.list().end(),
                              equal);
        case Value::Kind::dict: {
            if (a.dict().size() != b.dict().size()) return false;
            for (const auto& [k, v] : a.dict()) {
                const Value* other = b.find(k);
                if (!other || !equal(v, *other)) return false;
            }
            return true;
        }
        case Value::Kind::ns:  // Python objects compare by identity
            return &a.attributes() == &b.attributes();
        default:
            return false;
    }
}

// Code points of a valid UTF-8 string, each as its bytes (Python indexes strings by code point).
static std::vector<std::string> code_points(const std::string& s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        const size_t n = std::max<size_t>(1, utf8_sequence_length(s, i));
        out.push_back(s.substr(i, n));
        i += n;
    }
    return out;
}

std::string strip(const std::string& s, std::string_view chars, bool left, bool right) {
    size_t b = 0, e = s.size();
    if (left)
        b = s.find_first_not_of(chars) == std::string::npos ? s.size() : s.find_first_not_of(chars);
    if (right && b < e) e = s.find_last_not_of(chars) + 1;
    return s.substr(b, e - b);
}

static std::string ascii_case(std::string s, bool upper) {
    for (char& c : s)
        if (upper ? (c >= 'a' && c <= 'z') : (c >= 'A' && c <= 'Z'))
            c = static_cast<char>(c ^ 0x20);
    return s;
}

static std::string capitalize(const std::string& s) {
    std::string out = ascii_case(s, false);
    if (!out.empty()) out[0] = ascii_case(out.substr(0, 1), true)[0];
    return out;
}

static std::string title(const std::string& s) {
    std::string out = s;
    bool start = true;
    for (char& c : out) {
        const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (alpha) c = ascii_case(std::string(1, c), start)[0];
        start = !alpha;
    }
    return out;
}

static std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    if (from.empty()) fail("replace() with an empty pattern is not supported");
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
        s.replace(at, from.size(), to);
    return s;
}

static Value length_of(const Value& v) {
    if (v.kind() == Value::Kind::string)
        return static_cast<int64_t>(code_points(v.string()).size());
    if (v.kind() == Value::Kind::list) return static_cast<int64_t>(v.list().size());
    if (v.kind() == Value::Kind::dict) return static_cast<int64_t>(v.dict().size());
    fail(std::string("length of a ") + kind_name(v));
}

// The elements a for loop or `in` sees: list items, a string's characters, a dict's keys.
Value::List items_of(const Value& v) {
    if (v.kind() == Value::Kind::list) return v.list();
    Value::List out;
    if (v.kind() == Value::Kind::string)
        for (auto& c : code_points(v.string())) out.emplace_back(std::move(c));
    else if (v.kind() == Value::Kind::dict)
        for (const auto& [k, x] : v.dict()) out.emplace_back(k);
    else
        fail(std::string("cannot iterate over a ") + kind_name(v));
    return out;
}

Value get_item(const Value& obj, const Value& key) {
    if (obj.is_undefined()) fail("item or attribute of an undefined value");
    if (obj.kind() == Value::Kind::dict || obj.kind() == Value::Kind::ns) {
        if (key.kind() != Value::Kind::string) return {};
        const Value* v = obj.find(key.string());
        return v ? *v : Value();
    }
    if ((obj.kind() == Value::Kind::list || obj.kind() == Value::Kind::string) &&
        is_int_like(key)) {
        const Value::List items = obj.kind() == Value::Kind::list ? obj.list() : items_of(obj);
        int64_t i = as_int(key);
        const auto n = static_cast<int64_t>(items.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return {};
        return items[static_cast<size_t>(i)];
    }
    return {};
}

static void require_args(const std::string& what, const Args& args, size_t lo, size_t hi) {
    if (args.size() < lo || args.size() > hi)
        fail(what + " takes " + std::to_string(lo) + (hi != lo ? " to " + std::to_string(hi) : "") +
             " arguments, given " + std::to_string(args.size()));
}

static const std::string& require_string(const Value& v, const std::string& what) {
    if (v.kind() != Value::Kind::string) fail(what + " needs a string, found a " + kind_name(v));
    return v.string();
}

Value call_method(const Value& obj, const std::string& name, const Args& args) {
    const std::string what = std::string(kind_name(obj)) + "." + name + "()";
    if (obj.kind() == Value::Kind::string) {
        const std::string& s = obj.string();
        if (name == "strip" || name == "lstrip" || name == "rstrip") {
            require_args(what, args, 0, 1);
            const std::string chars = args.empty() || args[0].kind() == Value::Kind::none
                                          ? std::string(kSpace)
                                          : require_string(args[0], what);
            return strip(s, chars, name != "rstrip", name != "lstrip");
        }
        if (name == "upper" || name == "lower") {
            require_args(what, args, 0, 0);
            return ascii_case(s, name == "upper");
        }
        if (name == "title") return title(s);
        if (name == "capitalize") return capitalize(s);
        if (name == "startswith" || name == "endswith") {
            require_args(what, args, 1, 1);
            const std::string& x = require_string(args[0], what);
            return name == "startswith" ? s.starts_with(x) : s.ends_with(x);
        }
        if (name == "replace") {
            require_args(what, args, 2, 2);
            return replace_all(s, require_string(args[0], what), require_string(args[1], what));
        }
        if (name == "split") {
            require_args(what, args, 0, 1);
            Value::List parts;
            if (args.empty() || args[0].kind() == Value::Kind::none) {
                for (size_t i = s.find_first_not_of(kSpace); i != std::string::npos;) {
                    const size_t e = s.find_first_of(kSpace, i);
                    parts.emplace_back(
                        s.substr(i, e == std::string::npos ? std::string::npos : e - i));
                    i = e == std::string::npos ? e : s.find_first_not_of(kSpace, e);
                }
            } else {
                const std::string& sep = require_string(args[0], what);
                if (sep.empty()) fail("split() with an empty separator");
                size_t i = 0;
                for (size_t at; (at = s.find(sep, i)) != std::string::npos; i = at + sep.size())
                    parts.emplace_back(s.substr(i, at - i));
                parts.emplace_back(s.substr(i));
            }
            return parts;
        }
    }
    if (obj.kind() == Value::Kind::dict) {
        if (name == "get") {
            require_args(what, args, 1, 2);
            const Value v = get_item(obj, args[0]);
            return v.is_undefined() ? (args.size() == 2 ? args[1] : Value::none()) : v;
        }
        if (name == "items" || name == "keys" || name == "values") {
            require_args(what, args, 0, 0);
            Value::List out;
            for (const auto& [k, v] : obj.dict()) {
                if (name == "items")
                    out.push_back(Value::List{Value(k), v});
                else
                    out.push_back(name == "keys" ? Value(k) : v);
            }
            return out;
        }
    }
    fail("method " + what + " is not supported");
}

Value call_function(const std::string& name, const Args& args) {
    if (name == "raise_exception") {
        require_args(name, args, 1, 1);
        throw Error("chat template raised an exception: " + str(args[0]));
    }
    if (name == "range") {
        require_args(name, args, 1, 3);
        for (const Value& a : args)
            if (!is_int_like(a)) fail("range() needs integers");
        const int64_t a = args.size() == 1 ? 0 : as_int(args[0]);
        const int64_t b = args.size() == 1 ? as_int(args[0]) : as_int(args[1]);
        const int64_t st = args.size() == 3 ? as_int(args[2]) : 1;
        if (st == 0) fail("range() step cannot be zero");
        Value::List out;
        for (int64_t i = a; st > 0 ? i < b : i > b; i += st) {
            out.emplace_back(i);
            if (out.size() > 100000) fail("range() longer than 100000");
        }
        return out;
    }
    fail("function '" + name + "' is not supported");
}

Value apply_filter(const std::string& name, const Value& v, const Args& args) {
    if (name == "trim") return strip(str(v), kSpace, true, true);
    if (name == "upper" || name == "lower") return ascii_case(str(v), name == "upper");
    if (name == "capitalize") return capitalize(str(v));
    if (name == "title") return title(str(v));
    if (name == "length" || name == "count") return length_of(v);
    if (name == "string") return str(v);
    if (name == "int") {
        if (is_number(v)) return static_cast<int64_t>(as_double(v));
        if (v.kind() == Value::Kind::string)
            return static_cast<int64_t>(std::strtoll(v.string().c_str(), nullptr, 10));
        return int64_t{0};
    }
    if (name == "float") return is_number(v) ? as_double(v) : 0.0;
    if (name == "first" || name == "last") {
        const Value::List items = items_of(v);
        if (items.empty()) return {};
        return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return items_of(v);
    if (name == "default" || name == "d") {
        require_args(name, args, 0, 2);
        const bool boolean = args.size() == 2 && truthy(args[1]);
        if (v.is_undefined() || (boolean && !truthy(v))) return args.empty() ? Value("") : args[0];
        return v;
    }
    if (name == "join") {
        require_args(name, args, 0, 1);
        const std::string sep = args.empty() ? "" : str(args[0]);
        std::string out;
        const Value::List items = items_of(v);
        for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + str(items[i]);
        return out;
    }
    if (name == "replace") {
        require_args(name, args, 2, 2);
        return replace_all(str(v), str(args[0]), str(args[1]));
    }
    fail("filter '" + name + "' is not supported");
}

bool apply_test(const std::string& name, const Value& v, const Args& args) {
    using K = Value::Kind;
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.kind() == K::none;
    if (name == "string") return v.kind() == K::string;
    if (name == "number") return is_number(v) && v.kind() != K::boolean;
    if (name == "integer") return v.kind() == K::integer;
    if (name == "boolean") return v.kind() == K::boolean;
    if (name == "true") return v.kind() == K::boolean && v.boolean();
    if (name == "false") return v.kind() == K::boolean && !v.boolean();
    if (name == "mapping") return v.kind() == K::dict;
    if (name == "sequence" || name == "iterable")
        return v.kind() == K::list || v.kind() == K::string || v.kind() == K::dict;
    if (name == "odd" || name == "even") {
        if (!is_int_like(v)) fail("'" + name + "' needs an integer");
        return (as_int(v) % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
        require_args(name, args, 1, 1);
        if (!is_int_like(v) || !is_int_like(args[0]) || as_int(args[0]) == 0)
            fail("'divisibleby' needs non-zero integers");
        return as_int(v) % as_int(args[0]) == 0;
    }
    fail("test '" + name + "' is not supported");
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return str(a) + str(b);
    if (op == "+" && a.kind() == Value::Kind::string && b.kind() == Value::Kind::string)
        return a.string() + b.string();
    if (op == "+" && a.kind() == Value::Kind::list && b.kind() == Value::Kind::list) {
        Value::List l = a.list();
        l.insert(l.end(), b.list().begin(), b.list().end());
        return l;
    }
    if (op == "*" && a.kind() == Value::Kind::string && is_int_like(b)) {
        std::string out;
        for (int64_t i = 0; i < std::min<int64_t>(as_int(b), 100000); ++i) out += a.string();
        return out;
    }
    if (op == "%" && a.kind() == Value::Kind::string)
        fail("string formatting with % is not supported");
    if (!is_number(a) || !is_number(b))
        fail("unsupported operands for " + op + ": " + kind_name(a) + " and " + kind_name(b));
    const bool ints = is_int_like(a) && is_int_like(b);
    if (op == "/") {
        if (as_double(b) == 0.0) fail("division by zero");
        return as_double(a) / as_double(b);
    }
    if (ints) {
        const int64_t x = as_int(a), y = as_int(b);
        if (op == "+") return x + y;
        if (op == "-") return x - y;
        if (op == "*") return x * y;
        if (op == "**") {
            if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
            int64_t r = 1;
            for (int64_t i = 0; i < y && i < 64; ++i) r *= x;
            return r;
        }
        if (y == 0) fail("division by zero");
        // Python's floor division and modulo: the result takes the sign of the divisor.
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
            q -= 1;
            m += y;
        }
        return op == "//" ? q : m;
    }
    const double x = as_double(a), y = as_double(b);
    if (op == "+") return x + y;
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (op == "**") return std::pow(x, y);
    if (y == 0.0) fail("division by zero");
    const double q = std::floor(x / y);
    return op == "//" ? q : x - q * y;
}

bool compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "in" || op == "not in") {
        bool found = false;
        if (b.kind() == Value::Kind::string) {
            found = b.string().find(require_string(a, "'in' on a string")) != std::string::npos;
        } else if (b.kind() == Value::Kind::dict) {
            found = a.kind() == Value::Kind::string && b.find(a.string()) != nullptr;
        } else {
            for (const Value& x : items_of(b)) found = found || equal(a, x);
        }
        return found == (op == "in");
    }
    int c;
    if (is_number(a) && is_number(b)) {
        const double x = as_double(a), y = as_double(b);
        c = x < y ? -1 : x > y ? 1 : 0;
    } else if (a.kind() == Value::Kind::string && b.kind() == Value::Kind::string) {
        c = a.string().compare(b.string());
    } else {
        fail("cannot order a " + std::string(kind_name(a)) + " and a " + kind_name(b));
    }
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
}

}  // namespace detail

Value Value::none() {
    Value v;
    v.kind_ = Kind::none;
    return v;
}
Value::Value(bool b) : kind_(Kind::boolean), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::integer), i_(i) {}
Value::Value(double f) : kind_(Kind::floating), f_(f) {}
Value::Value(std::string s) : kind_(Kind::string), s_(std::move(s)) {}
// A list or dict one level deeper than its deepest element: `{% set x = [x] %}` repeated builds
// depth one statement at a time, so the limit is checked where values are made.
Value::Value(List l) : kind_(Kind::list) {
    for (const Value& e : l) depth_ = std::max(depth_, e.depth_);
    if (++depth_ > kMaxTemplateDepth) detail::fail_too_deep();
    list_ = std::make_shared<const List>(std::move(l));
}
Value::Value(Dict d) : kind_(Kind::dict) {
    for (const auto& [k, e] : d) depth_ = std::max(depth_, e.depth_);
    if (++depth_ > kMaxTemplateDepth) detail::fail_too_deep();
    dict_ = std::make_shared<const Dict>(std::move(d));
}

Value Value::make_namespace(Dict attributes) {
    Value v;
    v.kind_ = Kind::ns;
    for (const auto& [k, e] : attributes) {
        if (e.holds_namespace()) detail::fail("a namespace inside a namespace is not supported");
        v.depth_ = std::max(v.depth_, e.depth_);
    }
    if (++v.depth_ > kMaxTemplateDepth) detail::fail_too_deep();
    v.ns_ = std::make_shared<Dict>(std::move(attributes));
    return v;
}

void Value::set_attribute(const std::string& name, Value v) const {
    if (v.holds_namespace()) detail::fail("a namespace inside a namespace is not supported");
    // Values are built at most kMaxTemplateDepth deep, so the namespace stays one level above.
    for (auto& [k, e] : *ns_)
        if (k == name) {
            e = std::move(v);
            return;
        }
    ns_->emplace_back(name, std::move(v));
}

bool Value::holds_namespace() const {
    if (kind_ == Kind::ns) return true;
    if (kind_ == Kind::list)
        return std::any_of(list_->begin(), list_->end(),
                           [](const Value& e) { return e.holds_namespace(); });
    if (kind_ == Kind::dict)
        return std::any_of(dict_->begin(), dict_->end(),
                           [](const auto& kv) { return kv.second.holds_namespace(); });
    return false;
}

const Value* Value::find(std::string_view key) const {
    if (kind_ != Kind::dict && kind_ != Kind::ns) return nullptr;
    for (const auto& [k, v] : kind_ == Kind::dict ? *dict_ : *ns_)
        if (k == key) return &v;
    return nullptr;
}

}  // namespace qforge::jinja
