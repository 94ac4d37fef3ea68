#include "formats/json_io.hpp"

#include <cmath>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "core/mapped_file.hpp"

namespace qforge {

namespace {

using nlohmann::json;

// Hostile keys and strings can be megabytes long; messages quote at most this much of them.
std::string excerpt(std::string_view s, size_t max = 60) {
    if (s.size() <= max) return std::string(s);
    return std::string(s.substr(0, max)) + "... (" + std::to_string(s.size()) + " bytes)";
}

std::string document(std::string_view what, std::string_view fallback) {
    return std::string(what.empty() ? fallback : what);
}

// The byte offset of the bracket that opens nesting level max_depth + 1, or npos. One linear
// pass that skips strings, run before nlohmann builds anything, so a nesting bomb costs neither
// memory nor stack and the message can say where it starts. On invalid JSON the count may be
// off, but then the parser refuses the text anyway.
size_t too_deep_at(std::string_view text, int max_depth) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth) return i;
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return std::string_view::npos;
}

// Builds the document from SAX events like nlohmann's own DOM builder, refusing to open a level
// past max_depth. nlohmann's binary readers recurse once per level, so for CBOR the limit must
// stop them here, before the recursion goes deeper.
class BoundedDomBuilder : public nlohmann::json_sax<json> {
  public:
    BoundedDomBuilder(json& root, int max_depth) : root_(root), max_depth_(max_depth) {}

    bool null() override { return put(nullptr); }
    bool boolean(bool v) override { return put(v); }
    bool number_integer(number_integer_t v) override { return put(v); }
    bool number_unsigned(number_unsigned_t v) override { return put(v); }
    bool number_float(number_float_t v, const string_t&) override { return put(v); }
    bool string(string_t& v) override { return put(std::move(v)); }
    bool binary(binary_t& v) override { return put(json::binary(std::move(v))); }
    bool start_object(std::size_t) override { return open(json::value_t::object); }
    bool start_array(std::size_t) override { return open(json::value_t::array); }
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }
    bool key(string_t& k) override {
        member_ = &(*stack_.back())[k];
        return true;
    }
    bool parse_error(std::size_t position, const std::string&,
                     const nlohmann::json::exception& e) override {
        error_ = json_exception_text(e);
        error_position_ = position;
        return false;
    }

    bool too_deep() const { return too_deep_; }
    size_t items() const { return items_; }
    const std::string& error() const { return error_; }

  private:
    template <class V>
    json* insert(V&& v) {
        ++items_;
        if (stack_.empty()) {
            root_ = json(std::forward<V>(v));
            return &root_;
        }
        if (stack_.back()->is_array()) {
            stack_.back()->emplace_back(std::forward<V>(v));
            return &stack_.back()->back();
        }
        *member_ = json(std::forward<V>(v));
        return member_;
    }
    template <class V>
    bool put(V&& v) {
        insert(std::forward<V>(v));
        return true;
    }
    bool open(json::value_t type) {
        if (static_cast<int>(stack_.size()) >= max_depth_) {
            too_deep_ = true;
            return false;
        }
        stack_.push_back(insert(type));
        return true;
    }
    bool close() {
        stack_.pop_back();
        return true;
    }

    json& root_;
    int max_depth_;
    std::vector<json*> stack_;
    json* member_ = nullptr;
    bool too_deep_ = false;
    size_t items_ = 0;
    std::string error_;
    size_t error_position_ = 0;
};

}  // namespace

std::string json_exception_text(const nlohmann::json::exception& e) {
    std::string_view s = e.what();
    if (s.rfind("[json.exception.", 0) == 0)
        if (const size_t close = s.find("] "); close != std::string_view::npos)
            s.remove_prefix(close + 2);
    return std::string(s);
}

void throw_json_backstop(const std::string& file, const nlohmann::json::exception& e) {
    throw Error(file, {}, "unexpected JSON content: " + json_exception_text(e));
}

namespace {
// Parses with `parse` after the depth check, a library exception an Error naming the file.
template <class F>
auto parse_checked(std::string_view text, const std::string& file, const JsonParseOptions& options,
                   F&& parse) {
    const std::string what = document(options.what, "JSON");
    if (const size_t at = too_deep_at(text, options.max_depth); at != std::string_view::npos)
        throw Error(file, {},
                    what + " nested deeper than " + std::to_string(options.max_depth) +
                        " levels at byte " + std::to_string(at));
    try {
        return parse();
    } catch (const json::exception& e) {
        throw Error(file, {},
                    (options.what.empty() ? std::string("not valid JSON: ")
                                          : what + " is not valid JSON: ") +
                        json_exception_text(e));
    }
}
}  // namespace

json parse_json(std::string_view text, const std::string& file, const JsonParseOptions& options) {
    const std::string what = document(options.what, "JSON");
    json::parser_callback_t check_keys = nullptr;
    std::vector<std::set<std::string>> open_objects;
    if (options.reject_duplicate_keys) {
        check_keys = [&](int depth, json::parse_event_t event, json& parsed) {
            if (event == json::parse_event_t::object_start) {
                open_objects.emplace_back();
            } else if (event == json::parse_event_t::object_end) {
                open_objects.pop_back();
            } else if (event == json::parse_event_t::key) {
                const auto& key = parsed.get_ref<const std::string&>();
                if (!open_objects.back().insert(key).second) {
                    if (depth == 1 && options.top_keys_are_tensors)
                        throw Error(file, excerpt(key, 120),
                                    "appears twice in the " + what +
                                        " (a JSON parser would silently keep the last)");
                    throw Error(file, {},
                                "key '" + excerpt(key, 120) +
                                    "' appears twice in one object of the " + what);
                }
            }
            return true;
        };
    }
    return parse_checked(text, file, options,
                         [&] { return json::parse(text.begin(), text.end(), check_keys); });
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& file,
                                          const JsonParseOptions& options) {
    return parse_checked(text, file, options,
                         [&] { return nlohmann::ordered_json::parse(text.begin(), text.end()); });
}

json read_json_file(const std::string& path, const JsonParseOptions& options) {
    const MappedFile f(path);
    const auto* p = reinterpret_cast<const char*>(f.data());
    return parse_json(std::string_view(p, static_cast<size_t>(f.size())), path, options);
}

json parse_cbor(std::span<const uint8_t> bytes, const std::string& file, std::string_view what) {
    json root;
    BoundedDomBuilder builder(root, kMaxJsonDepth);
    bool ok = false;
    try {
        ok =
            json::sax_parse(bytes.begin(), bytes.end(), &builder, json::input_format_t::cbor, true);
    } catch (const json::exception& e) {
        throw Error(file, {}, std::string(what) + " is not valid: " + json_exception_text(e));
    }
    if (builder.too_deep())
        throw Error(file, {},
                    std::string(what) + " nested deeper than " + std::to_string(kMaxJsonDepth) +
                        " levels at item " + std::to_string(builder.items()));
    if (!ok)
        throw Error(file, {},
                    std::string(what) + " is not valid: " +
                        (builder.error().empty() ? std::string("parse failed") : builder.error()));
    return root;
}

std::string quoted_excerpt(std::string_view s) {
    constexpr size_t kMax = 60;
    const std::string head(s.substr(0, kMax));
    std::string text = json(head).dump(-1, ' ', false, json::error_handler_t::replace);
    if (s.size() > kMax) text += "... (" + std::to_string(s.size()) + " bytes)";
    return text;
}

std::string describe_json(const json& v) {
    switch (v.type()) {
        case json::value_t::null:
            return "null";
        case json::value_t::boolean:
            return v.get<bool>() ? "boolean true" : "boolean false";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned:
        case json::value_t::number_float:
            return "number " + v.dump();
        case json::value_t::string:
            return "string " + json(excerpt(v.get_ref<const std::string&>(), 40)).dump();
        case json::value_t::array:
            return "an array of " + std::to_string(v.size()) + " elements";
        case json::value_t::object:
            return "an object";
        case json::value_t::binary:
            return "binary data";
        case json::value_t::discarded:
            break;
    }
    return "an invalid value";
}

const json& JsonView::value() const {
    if (!v_) fail("missing");
    return *v_;
}

std::string JsonView::child_path(std::string_view key) const {
    return path_.empty() ? excerpt(key) : path_ + "." + excerpt(key);
}

JsonView JsonView::child(const nlohmann::json& v, std::string_view key) const {
    return JsonView(&v, file_, child_path(key));
}

JsonView JsonView::element(const nlohmann::json& v, size_t i) const {
    return JsonView(&v, file_, path_ + "[" + std::to_string(i) + "]");
}

JsonView JsonView::operator[](std::string_view key) const {
    if (!is_set()) return JsonView(nullptr, file_, child_path(key));
    const nlohmann::json& o = object();
    const auto it = o.find(key);
    return it == o.end() ? JsonView(nullptr, file_, child_path(key)) : child(*it, key);
}

JsonView JsonView::operator[](size_t i) const {
    const nlohmann::json& a = array();
    if (i >= a.size())
        fail("has " + std::to_string(a.size()) + " elements, element " + std::to_string(i) +
             " is missing");
    return element(a[i], i);
}

size_t JsonView::array_size() const { return array().size(); }
size_t JsonView::object_size() const { return object().size(); }

const nlohmann::json& JsonView::object() const {
    if (!is_object()) expected("an object");
    return *v_;
}

const nlohmann::json& JsonView::array() const {
    if (!is_array()) expected("an array");
    return *v_;
}

std::string JsonView::string() const {
    if (!is_string()) expected("a string");
    return v_->get<std::string>();
}

std::string JsonView::string_or(std::string fallback) const {
    return is_set() ? string() : std::move(fallback);
}

bool JsonView::boolean() const {
    if (!is_boolean()) expected("true or false");
    return v_->get<bool>();
}

bool JsonView::boolean_or(bool fallback) const { return is_set() ? boolean() : fallback; }

double JsonView::number() const {
    if (!v_ || !v_->is_number()) expected("a number");
    const double d = v_->get<double>();
    if (!std::isfinite(d)) expected("a finite number");
    return d;
}

double JsonView::number_or(double fallback) const { return is_set() ? number() : fallback; }

int64_t JsonView::integer(int64_t lo, int64_t hi) const {
    auto range = [&] {
        return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    };
    if (!v_ || !v_->is_number_integer()) expected("an integer");
    // nlohmann stores non-negative literals as unsigned; get<int64_t> of one above INT64_MAX
    // would wrap, so compare in the type the value has.
    if (v_->is_number_unsigned()) {
        const auto u = v_->get<uint64_t>();
        if (hi < 0 || u > static_cast<uint64_t>(hi)) expected(range());
        if (lo > 0 && u < static_cast<uint64_t>(lo)) expected(range());
        return static_cast<int64_t>(u);
    }
    const auto i = v_->get<int64_t>();
    if (i < lo || i > hi) expected(range());
    return i;
}

int64_t JsonView::integer_or(int64_t fallback, int64_t lo, int64_t hi) const {
    return is_set() ? integer(lo, hi) : fallback;
}

uint64_t JsonView::unsigned_integer(uint64_t hi) const {
    const std::string what = hi == std::numeric_limits<uint64_t>::max()
                                 ? std::string("a non-negative integer")
                                 : "an integer in [0, " + std::to_string(hi) + "]";
    if (!v_ || !v_->is_number_unsigned()) expected(what);
    const auto u = v_->get<uint64_t>();
    if (u > hi) expected(what);
    return u;
}

void JsonView::fail(const std::string& detail) const {
    if (path_.empty()) throw Error(*file_, {}, detail);
    throw Error(*file_, {}, "key '" + path_ + "': " + detail);
}

void JsonView::expected(std::string_view what) const {
    if (!v_) fail("missing (expected " + std::string(what) + ")");
    fail("expected " + std::string(what) + ", found " + describe_json(*v_));
}

}  // namespace qforge
