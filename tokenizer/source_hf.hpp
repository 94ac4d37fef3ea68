// Internal to tokenizer/source*.cpp: the tokenizer.json reader and a shared UTF-8 check.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace qforge {

// Strict UTF-8: no overlong forms, surrogates or values past U+10FFFF.
bool is_valid_utf8(std::string_view s);

// tokenizer.json (+ tokenizer_config.json, generation_config.json beside it) -> the schema.
nlohmann::json load_hf_tokenizer(const std::string& path);

}  // namespace qforge
