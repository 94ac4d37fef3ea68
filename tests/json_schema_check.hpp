// A JSON schema validator for the subset runtime/json_grammar.hpp takes, written from the JSON
// Schema specification over parsed instances: the independent check of what constrained
// generation produces (tests/json_grammar_test.cpp, generate_test.cpp, serve_http_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

namespace qforge::test {

// The formats constrained generation takes, from their RFCs (3339: full-date with the real
// calendar, full-time, date-time; 4122: uuid; 5321: a dot-atom local part and a domain of
// labels; dotted-decimal IPv4), with std::regex for the shapes: another engine than the
// generator's (runtime/regex_dfa.hpp).
inline bool format_valid(const std::string& f, const std::string& t) {
    std::smatch m;
    const auto days_ok = [](int y, int mo, int d) {
        static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        return mo >= 1 && mo <= 12 && d >= 1 && d <= kDays[mo - 1] + (mo == 2 && leap ? 1 : 0);
    };
    const std::string time =
        "([0-9]{2}):([0-9]{2}):([0-9]{2})(\\.[0-9]+)?([Zz]|[+-]([0-9]{2}):([0-9]{2}))";
    const auto time_ok = [](const std::smatch& x, size_t i) {
        const bool offset = x[i + 5].matched;
        return std::stoi(x[i]) <= 23 && std::stoi(x[i + 1]) <= 59 && std::stoi(x[i + 2]) <= 60 &&
               (!offset || (std::stoi(x[i + 5]) <= 23 && std::stoi(x[i + 6]) <= 59));
    };
    if (f == "date" || f == "date-time") {
        const std::string re =
            "([0-9]{4})-([0-9]{2})-([0-9]{2})" + (f == "date" ? "" : "[Tt]" + time);
        if (!std::regex_match(t, m, std::regex(re))) return false;
        return days_ok(std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3])) &&
               (f == "date" || time_ok(m, 4));
    }
    if (f == "time") return std::regex_match(t, m, std::regex(time)) && time_ok(m, 1);
    if (f == "uuid")
        return std::regex_match(t,
                                std::regex("[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"));
    if (f == "ipv4") {
        if (!std::regex_match(
                t, m, std::regex("([0-9]{1,3})\\.([0-9]{1,3})\\.([0-9]{1,3})\\.([0-9]{1,3})")))
            return false;
        for (size_t i = 1; i <= 4; ++i)
            if (std::stoi(m[i]) > 255 || (m[i].length() > 1 && m[i].str()[0] == '0')) return false;
        return true;
    }
    if (f == "email") {
        const std::string atom = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+";
        const std::string label = "[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?";
        if (!std::regex_match(t,
                              std::regex(atom + "(\\." + atom + ")*@(" + label + "\\.)+" + label)))
            return false;
        const std::string domain = t.substr(t.find('@') + 1);
        size_t start = 0;  // each label at most 63 bytes
        for (size_t dot; (dot = domain.find('.', start)) != std::string::npos; start = dot + 1)
            if (dot - start > 63) return false;
        return domain.size() - start <= 63;
    }
    return false;
}

// A string's code points (JSON Schema's minLength and maxLength count them).
inline size_t code_points(const std::string& t) {
    return static_cast<size_t>(std::count_if(
        t.begin(), t.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// The subset's meaning, from the specification, over a parsed instance.
inline bool schema_valid(const nlohmann::ordered_json& v, const nlohmann::ordered_json& s,
                         const nlohmann::ordered_json& root) {
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("$ref")) {
        const std::string r = s["$ref"];
        const auto slash = r.find('/', 2);
        return schema_valid(v, root[r.substr(2, slash - 2)][r.substr(slash + 1)], root);
    }
    if (s.contains("const") && v != s["const"]) return false;
    if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end())
        return false;
    if (s.contains("anyOf") &&
        std::none_of(s["anyOf"].begin(), s["anyOf"].end(),
                     [&](const nlohmann::ordered_json& o) { return schema_valid(v, o, root); }))
        return false;
    if (s.contains("oneOf") &&
        std::count_if(s["oneOf"].begin(), s["oneOf"].end(), [&](const nlohmann::ordered_json& o) {
            return schema_valid(v, o, root);
        }) != 1)
        return false;
    if (s.contains("type")) {
        std::vector<std::string> types;
        if (s["type"].is_string())
            types.push_back(s["type"]);
        else
            for (const auto& t : s["type"]) types.push_back(t);
        auto is = [&](const std::string& t) {
            if (t == "object") return v.is_object();
            if (t == "array") return v.is_array();
            if (t == "string") return v.is_string();
            if (t == "number") return v.is_number();
            if (t == "integer")
                return v.is_number_integer() ||
                       (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
            if (t == "boolean") return v.is_boolean();
            return v.is_null();
        };
        if (std::none_of(types.begin(), types.end(), is)) return false;
    }
    if (v.is_object()) {
        if (s.contains("required"))
            for (const auto& k : s["required"])
                if (!v.contains(k.get<std::string>())) return false;
        for (const auto& [k, x] : v.items()) {
            if (s.contains("properties") && s["properties"].contains(k)) {
                if (!schema_valid(x, s["properties"][k], root)) return false;
            } else if (s.contains("additionalProperties") &&
                       !schema_valid(x, s["additionalProperties"], root)) {
                return false;
            }
        }
    }
    if (v.is_number()) {
        const double x = v.get<double>();
        if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
        if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
        if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>())
            return false;
        if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>())
            return false;
    }
    if (v.is_string()) {
        const std::string t = v.get<std::string>();
        // ECMA-262's RegExp test: the pattern found anywhere (std::regex's ECMAScript grammar).
        if (s.contains("pattern") &&
            !std::regex_search(t, std::regex(s["pattern"].get<std::string>())))
            return false;
        if (s.contains("format") && !format_valid(s["format"].get<std::string>(), t)) return false;
        if (s.contains("minLength") && code_points(t) < s["minLength"].get<size_t>()) return false;
        if (s.contains("maxLength") && code_points(t) > s["maxLength"].get<size_t>()) return false;
    }
    if (v.is_array()) {
        if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
        if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
        if (s.contains("items"))
            for (const auto& x : v)
                if (!schema_valid(x, s["items"], root)) return false;
    }
    return true;
}

inline bool schema_valid(const nlohmann::ordered_json& v, const nlohmann::ordered_json& schema) {
    return schema_valid(v, schema, schema);
}

}  // namespace qforge::test
