// The module layering of docs/ARCHITECTURE.md, checked against the code: every
// `#include "module/..."` in a module's sources names the module itself or one its row allows.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace architecture_layering_test {

namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
    const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// module -> modules it may include, from the table after the "layering" marker.
std::map<std::string, std::set<std::string>> allowed_includes(const fs::path& doc) {
    std::ifstream in(doc);
    REQUIRE(in);
    std::map<std::string, std::set<std::string>> rules;
    std::string line;
    bool in_table = false;
    while (std::getline(in, line)) {
        if (line.find("<!-- layering:") != std::string::npos) {
            in_table = true;
            continue;
        }
        if (!in_table) continue;
        if (line.rfind("|", 0) != 0) {
            if (!rules.empty()) break;  // the table ended
            continue;
        }
        std::vector<std::string> cells;
        std::stringstream ss(line.substr(1));
        std::string cell;
        while (std::getline(ss, cell, '|')) cells.push_back(trim(cell));
        if (cells.size() < 2 || cells[0] == "module" || cells[0].rfind("---", 0) == 0) continue;
        std::set<std::string>& may = rules[cells[0]];
        std::stringstream deps(cells[1]);
        std::string dep;
        while (std::getline(deps, dep, ',')) {
            dep = trim(dep);
            if (!dep.empty()) may.insert(dep);
        }
    }
    return rules;
}

}  // namespace

TEST_CASE("layering: every module includes only what docs/ARCHITECTURE.md allows", "[layering]") {
    const fs::path root = QFORGE_SOURCE_DIR;
    const auto rules = allowed_includes(root / "docs" / "ARCHITECTURE.md");
    // The table has a row for every module folder with a CMake library.
    for (const char* m : {"core", "formats", "tokenizer", "kernels", "sources", "runtime", "quant",
                          "convert", "serve", "cli"}) {
        INFO("module " << m);
        REQUIRE(rules.count(m) == 1);
        REQUIRE(fs::is_directory(root / m));
    }
    // Every module a row allows is itself a row, and lies below it: no cycles.
    for (const auto& [m, may] : rules)
        for (const auto& dep : may) {
            INFO(m << " may include " << dep);
            REQUIRE(rules.count(dep) == 1);
            REQUIRE(rules.at(dep).count(m) == 0);
        }

    const std::regex include(R"(^\s*#\s*include\s+"([a-z_]+)/)");
    uint64_t checked = 0;
    std::vector<std::string> violations;
    for (const auto& [m, may] : rules)
        for (const auto& entry : fs::recursive_directory_iterator(root / m)) {
            const auto ext = entry.path().extension();
            if (!entry.is_regular_file() ||
                (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh"))
                continue;
            std::ifstream in(entry.path());
            std::string line;
            for (uint64_t n = 1; std::getline(in, line); ++n) {
                std::smatch match;
                if (!std::regex_search(line, match, include)) continue;
                const std::string dep = match[1];
                if (!rules.count(dep)) continue;  // a system or third-party header ("nlohmann/")
                ++checked;
                if (dep != m && !may.count(dep))
                    violations.push_back(fs::relative(entry.path(), root).string() + ":" +
                                         std::to_string(n) + " includes " + dep + "/, which " + m +
                                         " may not include");
            }
        }
    INFO(checked << " project includes checked");
    for (const auto& v : violations) UNSCOPED_INFO(v);
    CHECK(checked > 100);
    CHECK(violations.empty());
}

}  // namespace architecture_layering_test
