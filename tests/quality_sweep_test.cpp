// scripts/quality_sweep.sh on stories260K: each chosen type x method is one CSV row whose figures
// are those of `qforge quantize` and `qforge ppl` run directly with the same options; a size-plan
// type (@SIZE) is a file within that size; rows already
// in the CSV are kept, not measured again; without gnuplot the plot is SKIPPED with a message and
// the script still succeeds.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_support.hpp"
#include "test_support.hpp"

namespace quality_sweep_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using qforge::test::q;

std::string text_of(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The CSV's row for `type,method,` split at commas.
std::vector<std::string> csv_row(const std::string& csv, const std::string& key) {
    const size_t at = csv.find("\n" + key);
    REQUIRE(at != std::string::npos);
    const std::string line = csv.substr(at + 1, csv.find('\n', at + 1) - at - 1);
    std::vector<std::string> cells;
    std::stringstream in(line);
    for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
    return cells;
}

std::string fixed(double v, int digits) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
}

}  // namespace

TEST_CASE("quality_sweep.sh: rows equal quantize and ppl run directly, kept on a rerun",
          "[scripts][cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("quality-sweep");
    const fs::path f32 = test::convert_stories(data, "hf", dir);
    const std::string text = test::tinystories_head(data);
    const size_t cut = text.find('\n', text.size() / 2) + 1;
    const fs::path calib = dir / "calib.txt", eval = dir / "eval.txt", csv = dir / "s.csv";
    test::write_file(eval, text.substr(0, cut));
    test::write_file(calib, text.substr(cut));

    const std::string sweep = "cd " + q(dir.path()) +
                              " && QFORGE_NO_PROGRESS=1 QFORGE_BIN=" + q(QFORGE_BINARY) +
                              " OUT=" + q(csv) +
                              " CTX=64 CHUNKS=3 NSAMPLES=4 SEQLEN=64 THREADS=1 "
                              "GNUPLOT=qforge-test-no-gnuplot bash " +
                              q(fs::path(QFORGE_SOURCE_DIR) / "scripts/quality_sweep.sh") + " " +
                              q(f32) + " " + q(eval) + " " + q(calib);
    const auto first = test::run_shell(sweep + " 'q4_g32:rtn' 'q4k_g32:rtn-calib'");
    INFO(first.output);
    REQUIRE(first.exit_code == 0);
    REQUIRE_THAT(first.output, Contains("plot SKIPPED: qforge-test-no-gnuplot is not installed"));
    const std::string table = text_of(csv);
    REQUIRE(table.rfind("type,method,file_bytes,bpw,ppl,ppl_stderr,kld,top1,quantize_s,status\n",
                        0) == 0);
    REQUIRE(std::count(table.begin(), table.end(), '\n') == 4);  // header, float and two rows

    // The same quantization and evaluation run directly, started as the sweep starts its
    // QFORGE_BIN (not through QFORGE_TEST_RUNNER): both sides at one level, since a calibration
    // forward at another level rounds differently.
    auto native = [](const std::string& args) {
        return test::run_shell("QFORGE_NO_PROGRESS=1 " + q(QFORGE_BINARY) + " " + args);
    };
    const std::string direct_q = "quantize " + q(f32) + " -o " + q(dir / "d.qf") +
                                 " --qtype q4k_g32 --method rtn --calib " + q(calib) +
                                 " --nsamples 4 --seqlen 64 -t 1 -q";
    REQUIRE(native(direct_q).exit_code == 0);
    const auto ppl =
        native("ppl " + q(dir / "d.qf") + " -f " + q(eval) +
               " --protocol llamacpp --ctx 64 --chunks 3 -t 1 --kl-base " + q(f32) + " --json -q");
    REQUIRE(ppl.exit_code == 0);
    const auto j = nlohmann::json::parse(ppl.output.substr(ppl.output.find('{')));
    const auto row = csv_row(table, "q4k_g32,rtn-calib,");
    REQUIRE(row.size() == 10);
    REQUIRE(row[2] == std::to_string(fs::file_size(dir / "d.qf")));
    REQUIRE(row[4] == fixed(j.at("ppl").get<double>(), 4));
    REQUIRE(row[6] == fixed(j.at("kld").get<double>(), 5));
    REQUIRE(row[9] == "ok");
    const auto base = csv_row(table, "float,-,");
    REQUIRE(base[4] == fixed(j.at("base_ppl").get<double>(), 4));
    REQUIRE(csv_row(table, "q4_g32,rtn,")[9] == "ok");

    // A size-plan type: the file within the size, the pattern adding its type.
    const auto sized = test::run_shell(sweep + " '@260k:rtn-calib'");
    INFO(sized.output);
    REQUIRE(sized.exit_code == 0);
    const auto plan_row = csv_row(text_of(csv), "@260k,rtn-calib,");
    REQUIRE(plan_row.size() == 10);
    REQUIRE(plan_row[9] == "ok");
    REQUIRE(std::stoull(plan_row[2]) <= 260000);
    const std::string with_plan = text_of(csv);

    // A rerun measures nothing already there; a pattern that matches nothing is named.
    const auto again = test::run_shell(sweep + " 'q4_g32:rtn' 'q9:rtn'");
    INFO(again.output);
    REQUIRE(again.exit_code == 0);
    REQUIRE(text_of(csv) == with_plan);
    REQUIRE_THAT(again.output, Contains("'q9:rtn' matches no TYPE:METHOD"));
}

}  // namespace quality_sweep_test
