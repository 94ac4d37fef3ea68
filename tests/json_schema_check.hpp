// A JSON schema validator for the subset runtime/json_grammar.hpp takes, written from the JSON
// Schema specification over parsed instances: the independent check of what constrained
// generation produces (tests/json_grammar_test.cpp, generate_test.cpp, serve_http_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qforge::test {

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
