// docs/FORMAT.md is the specification: its tables must agree with the code.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "formats/model_config.hpp"
#include "formats/qf_format.hpp"
#include "formats/qtype.hpp"

namespace qf_spec_test {

using namespace qforge;

namespace {

std::string read_doc() {
    std::ifstream f(std::string(QFORGE_SOURCE_DIR) + "/docs/FORMAT.md");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Rows of the markdown table that follows `heading`, as cells.
std::vector<std::vector<std::string>> table_after(const std::string& doc,
                                                  const std::string& heading) {
    std::vector<std::vector<std::string>> rows;
    size_t at = doc.find(heading);
    REQUIRE(at != std::string::npos);
    std::istringstream in(doc.substr(at));
    std::string line;
    bool in_table = false;
    while (std::getline(in, line)) {
        if (line.rfind("|", 0) != 0) {
            if (in_table) break;
            continue;
        }
        in_table = true;
        if (line.find("---") != std::string::npos) continue;
        std::vector<std::string> cells;
        std::stringstream ls(line.substr(1));
        std::string cell;
        while (std::getline(ls, cell, '|')) {
            cell.erase(0, cell.find_first_not_of(' '));
            cell.erase(cell.find_last_not_of(' ') + 1);
            cells.push_back(cell);
        }
        rows.push_back(cells);
    }
    REQUIRE(rows.size() > 1);
    rows.erase(rows.begin());  // column names
    return rows;
}

}  // namespace

TEST_CASE("FORMAT.md preamble table matches QfPreamble", "[formats][spec]") {
    const auto rows = table_after(read_doc(), "## Preamble");
    const std::map<std::string, std::pair<size_t, size_t>> code = {
        {"magic", {offsetof(QfPreamble, magic), sizeof(QfPreamble::magic)}},
        {"version", {offsetof(QfPreamble, version), sizeof(QfPreamble::version)}},
        {"endian_tag", {offsetof(QfPreamble, endian_tag), sizeof(QfPreamble::endian_tag)}},
        {"header_offset", {offsetof(QfPreamble, header_offset), sizeof(QfPreamble::header_offset)}},
        {"header_length", {offsetof(QfPreamble, header_length), sizeof(QfPreamble::header_length)}},
        {"data_offset", {offsetof(QfPreamble, data_offset), sizeof(QfPreamble::data_offset)}},
        {"data_length", {offsetof(QfPreamble, data_length), sizeof(QfPreamble::data_length)}},
        {"header_checksum",
         {offsetof(QfPreamble, header_checksum), sizeof(QfPreamble::header_checksum)}},
        {"tensor_alignment",
         {offsetof(QfPreamble, tensor_alignment), sizeof(QfPreamble::tensor_alignment)}},
        {"reserved", {offsetof(QfPreamble, reserved), sizeof(QfPreamble::reserved)}},
    };
    REQUIRE(rows.size() == code.size());
    size_t total = 0;
    for (const auto& r : rows) {
        INFO("field " << r.at(2));
        REQUIRE(code.count(r.at(2)));
        REQUIRE(std::stoul(r.at(0)) == code.at(r.at(2)).first);
        REQUIRE(std::stoul(r.at(1)) == code.at(r.at(2)).second);
        total += std::stoul(r.at(1));
    }
    REQUIRE(total == sizeof(QfPreamble));
    const std::string doc = read_doc();
    REQUIRE(doc.find("# The .qf format, version " + std::to_string(kQfVersion)) !=
            std::string::npos);
    REQUIRE(doc.find("`0x01020304`") != std::string::npos);
    REQUIRE(kQfEndianTag == 0x01020304);
    REQUIRE(doc.find("multiple of 4096") != std::string::npos);
    REQUIRE(kQfDataAlignment == 4096);
    REQUIRE(doc.find("(" + std::to_string(kQfTensorAlignment) + ")") != std::string::npos);
}

TEST_CASE("FORMAT.md quant-type table matches the code's table", "[formats][spec]") {
    const auto rows = table_after(read_doc(), "## Quant types");
    REQUIRE(rows.size() == std::size(kQTypes));
    for (size_t i = 0; i < rows.size(); ++i) {
        INFO("row " << rows[i].at(0));
        const QTypeTraits& t = kQTypes[i];
        REQUIRE(rows[i].size() == 6);
        REQUIRE(rows[i].at(0) == t.name);
        REQUIRE(std::stoul(rows[i].at(1)) == t.bits);
        if (t.is_float) {
            REQUIRE(rows[i].at(2) == "-");
            REQUIRE(rows[i].at(4) == "exact");
        } else {
            REQUIRE(rows[i].at(2) == (t.group ? std::to_string(t.group) : std::string("row")));
            const std::string zero = t.super_block  ? "6-bit min"
                                     : t.nonuniform ? "levels"
                                     : !t.symmetric ? "stored"
                                     : t.signed_codes
                                         ? std::to_string(t.implicit_zero) + " (int8 codes)"
                                         : std::to_string(t.implicit_zero);
            REQUIRE(rows[i].at(3) == zero);
            // The documented bound is the table's without its 2^-10 float-rounding allowance.
            const double bound = t.error_bound - 1.0 / 1024;
            REQUIRE(rows[i].at(4) == (bound == 0.5 ? "1/2" : std::to_string(std::lround(bound))));
            REQUIRE(bound == std::round(bound * 2) / 2);  // halves only, as the table writes them
        }
        char bpw[32];
        std::snprintf(bpw, sizeof bpw, "%.3f", qtype_bits_per_weight(t.type, 4096));
        REQUIRE(rows[i].at(5) == bpw);
    }
}

TEST_CASE("FORMAT.md lists every key of the normalized model config", "[formats][spec]") {
    const std::string doc = read_doc();
    const size_t begin = doc.find("### model");
    const size_t end = doc.find("###", begin + 4);
    const std::string section = doc.substr(begin, end - begin);
    ModelConfig c{};
    c.arch = Architecture::llama;
    const nlohmann::json j = model_config_to_json(c);
    for (const auto& [key, value] : j.items()) {
        INFO("model key " << key);
        REQUIRE(section.find("`" + key + "`") != std::string::npos);
    }
}

TEST_CASE("FORMAT.md non-uniform levels match the code's levels", "[formats][spec]") {
    const auto rows = table_after(read_doc(), "### Non-uniform rows");
    REQUIRE(rows.size() == 1);  // the codes row is the header
    REQUIRE(rows[0].size() == 17);
    REQUIRE(rows[0].at(0) == "level");
    for (const QTypeTraits& t : kQTypes) {
        if (!t.levels) continue;
        INFO(t.name);
        for (size_t c = 0; c < 16; ++c) REQUIRE(std::stoi(rows[0].at(c + 1)) == t.levels[c]);
    }
}

TEST_CASE("FORMAT.md super-block record matches QSuperRecord", "[formats][spec]") {
    const auto rows = table_after(read_doc(), "### Super-block rows");
    REQUIRE(rows.size() == 3);
    const std::string first[] = {"0 .. 1", "2 .. 3", "4 .. 15"};
    const size_t offsets[] = {offsetof(QSuperRecord, d), offsetof(QSuperRecord, dmin),
                              offsetof(QSuperRecord, sm)};
    const size_t ends[] = {offsetof(QSuperRecord, dmin), offsetof(QSuperRecord, sm),
                           sizeof(QSuperRecord)};
    for (size_t i = 0; i < 3; ++i) {
        INFO(rows[i].at(0));
        REQUIRE(rows[i].at(0) == first[i]);
        REQUIRE(rows[i].at(0) == std::to_string(offsets[i]) + " .. " + std::to_string(ends[i] - 1));
    }
    REQUIRE(rows[0].at(1).starts_with("d, binary16"));
    REQUIRE(rows[1].at(1).starts_with("dmin, binary16"));
}

}  // namespace qf_spec_test
