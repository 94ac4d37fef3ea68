// The tokenizer fixtures written by scripts/make_tokenizer_fixtures.py with the PyPI `tokenizers`
// package (tests/data/tokenizers/README.md): the texts, the families, and a report of the first
// difference between two sequences. Shared by pretokenizer_test.cpp and
// tokenizer_hf_fixtures_test.cpp.
#pragma once

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace qforge::test {

inline const std::filesystem::path kTokenizerFixtures =
    std::filesystem::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "tokenizers";

// Families with a tokenizer.json, tokenizer_config.json and expected.json each.
inline const std::vector<std::string> kTokenizerFamilies = {
    "gpt2", "llama3", "qwen2", "qwen3", "smollm2", "llama2", "llama2-metaspace"};

inline nlohmann::json read_json_file(const std::filesystem::path& p) {
    const auto bytes = read_file(p);
    return nlohmann::json::parse(bytes.begin(), bytes.end());
}

struct FixtureText {
    std::string name;
    std::string text;                // valid UTF-8, as the reference tokenized it
    std::optional<std::string> raw;  // the invalid UTF-8 bytes `text` was made from, if any
    bool from_shared = false;        // an excerpt of ../shared/data
};

// The texts of texts.json. English prose excerpts live in ../shared/data (never copied into the
// repository); they are read from there when `shared` is given and left out otherwise.
inline std::vector<FixtureText> load_fixture_texts(
    const std::optional<std::filesystem::path>& shared) {
    std::vector<FixtureText> out;
    const nlohmann::json texts = read_json_file(kTokenizerFixtures / "texts.json");
    for (const auto& t : texts.at("texts")) {
        FixtureText ft;
        ft.name = t.at("name").get<std::string>();
        if (t.contains("shared")) {
            if (!shared) continue;
            const auto& ref = t.at("shared");
            const auto bytes = read_file(*shared / ref.at("file").get<std::string>());
            const auto offset = ref.at("offset").get<size_t>();
            const auto length = ref.at("length").get<size_t>();
            if (offset + length > bytes.size()) {
                throw std::runtime_error("shared excerpt past the end of " +
                                         ref.at("file").get<std::string>());
            }
            ft.text.assign(bytes.begin() + static_cast<std::ptrdiff_t>(offset),
                           bytes.begin() + static_cast<std::ptrdiff_t>(offset + length));
            ft.from_shared = true;
        } else {
            ft.text = t.at("text").get<std::string>();
        }
        if (t.contains("raw_hex")) {
            const auto hex = t.at("raw_hex").get<std::string>();
            std::string raw;
            for (size_t i = 0; i + 1 < hex.size(); i += 2) {
                raw.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
            }
            ft.raw = raw;
        }
        out.push_back(std::move(ft));
    }
    return out;
}

// Printable form of a string for failure messages (control bytes and quotes escaped).
inline std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '\n')
            out += "\\n";
        else if (c == '\t')
            out += "\\t";
        else if (c == '\r')
            out += "\\r";
        else if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else
            out += static_cast<char>(c);
    }
    return out + "\"";
}

// "" when equal; else the first differing position with a few elements of context on each side,
// each element shown by `show`.
template <class T, class Show>
std::string first_difference(const std::vector<T>& got, const std::vector<T>& want, Show show) {
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    if (i == got.size() && i == want.size()) return "";
    const size_t from = i >= 3 ? i - 3 : 0;
    auto context = [&](const std::vector<T>& v) {
        std::ostringstream s;
        for (size_t k = from; k < v.size() && k < i + 4; ++k)
            s << (k == i ? " >>" : " ") << show(v[k]);
        return s.str();
    };
    std::ostringstream msg;
    msg << "first difference at position " << i << " (got " << got.size() << ", expected "
        << want.size() << ")\n  got:     " << context(got) << "\n  expected:" << context(want);
    return msg.str();
}

}  // namespace qforge::test
