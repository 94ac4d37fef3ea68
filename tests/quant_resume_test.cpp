// `qforge quantize --resume DIR` on stories260K: a calibrated run stopped after a block (the
// QFORGE_TEST_STOP_AFTER_BLOCK test hook, which fails the run right after saving that block)
// leaves no output, and a rerun with the same DIR continues there and writes a file
// byte-identical to an uninterrupted run, header included. A DIR from another recipe, and a
// truncated or damaged block state, are refused with one line naming the problem.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_support.hpp"
#include "test_support.hpp"

namespace quant_resume_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using qforge::test::q;

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The lines of a command's output that report an error.
std::vector<std::string> error_lines(const std::string& output) {
    std::vector<std::string> out;
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);)
        if (line.find("error:") != std::string::npos) out.push_back(line);
    return out;
}

struct Fixture {
    fs::path f32, calib;
    std::string args(const std::string& method, const std::string& qtype,
                     const fs::path& out) const {
        return "quantize " + q(f32) + " -o " + q(out) + " --method " + method + " --qtype " +
               qtype + " --calib " + q(calib) + " --nsamples 8 --seqlen 64 -t 2 -q";
    }
};

// Uninterrupted, then stopped after `stop` and resumed: the same bytes.
void check_resume(const Fixture& fx, const test::ScratchDir& dir, const std::string& method,
                  int stop) {
    const fs::path a = dir / (method + "-a.qf"), b = dir / (method + "-b.qf");
    const fs::path state = dir / (method + "-state");
    auto ra = test::run_qforge(fx.args(method, "q4_g32", a));
    INFO(ra.output);
    REQUIRE(ra.exit_code == 0);

    const std::string hook = "export QFORGE_TEST_STOP_AFTER_BLOCK=" + std::to_string(stop) + ";";
    auto rb = test::run_qforge(fx.args(method, "q4_g32", b) + " --resume " + q(state), hook);
    INFO(rb.output);
    REQUIRE(rb.exit_code != 0);
    REQUIRE_THAT(rb.output,
                 Contains("stopped after block " + std::to_string(stop) + " (test hook)"));
    REQUIRE(test::files_containing(dir.path(), method + "-b.qf").empty());
    for (int i = 0; i <= stop; ++i) {
        char name[32];
        std::snprintf(name, sizeof name, "block-%04d.qfstate", i);
        REQUIRE(fs::exists(state / name));
    }
    REQUIRE(fs::exists(state / "run.json"));

    auto rc = test::run_qforge(fx.args(method, "q4_g32", b) + " --resume " + q(state));
    INFO(rc.output);
    REQUIRE(rc.exit_code == 0);
    REQUIRE_THAT(rc.output, Contains("resuming from " + state.string() + ": blocks 0.." +
                                     std::to_string(stop) + " done"));
    REQUIRE(slurp(a) == slurp(b));

    // Every block saved: a rerun computes nothing and still writes the same bytes.
    fs::remove(b);
    auto rd = test::run_qforge(fx.args(method, "q4_g32", b) + " --resume " + q(state));
    INFO(rd.output);
    REQUIRE(rd.exit_code == 0);
    REQUIRE_THAT(rd.output, Contains("blocks 0..4 done"));
    REQUIRE(slurp(a) == slurp(b));
}

Fixture make_fixture(const fs::path& data, const test::ScratchDir& dir) {
    const fs::path calib = dir / "stories.txt";
    test::write_file(calib, test::tinystories_head(data));
    return {test::convert_stories(data, "hf", dir), calib};
}

}  // namespace

TEST_CASE("resume: gptq stopped after a block and resumed is byte-identical",
          "[resume][quant][gptq][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("resume-gptq");
    check_resume(make_fixture(data, dir), dir, "gptq", 2);
}

TEST_CASE("resume: awq stopped after a block and resumed is byte-identical",
          "[resume][quant][awq][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("resume-awq");
    check_resume(make_fixture(data, dir), dir, "awq", 1);
}

TEST_CASE("resume: another run's directory and broken block states are refused with one line",
          "[resume][quant][gptq][broken][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("resume-broken");
    const Fixture fx = make_fixture(data, dir);
    const fs::path state = dir / "state", out = dir / "out.qf";
    auto r = test::run_qforge(fx.args("gptq", "q4_g32", out) + " --resume " + q(state),
                              "export QFORGE_TEST_STOP_AFTER_BLOCK=2;");
    INFO(r.output);
    REQUIRE(r.exit_code != 0);

    SECTION("another recipe") {
        auto o = test::run_qforge(fx.args("gptq", "q8_g32", out) + " --resume " + q(state));
        INFO(o.output);
        REQUIRE(o.exit_code != 0);
        const auto errors = error_lines(o.output);
        REQUIRE(errors.size() == 1);
        REQUIRE_THAT(errors[0], Contains("holds the state of a different run"));
        REQUIRE_THAT(errors[0], Contains("recipe.qtype differs"));
        REQUIRE(test::files_containing(dir.path(), "out.qf").empty());
    }
    SECTION("another calibration") {
        std::string args = fx.args("gptq", "q4_g32", out);
        args.replace(args.find("--nsamples 8"), 12, "--nsamples 4");
        auto o = test::run_qforge(args + " --resume " + q(state));
        INFO(o.output);
        REQUIRE(o.exit_code != 0);
        const auto errors = error_lines(o.output);
        REQUIRE(errors.size() == 1);
        REQUIRE_THAT(errors[0], Contains("calibration"));
        REQUIRE_THAT(errors[0], Contains("differs"));
    }
    SECTION("a truncated last block") {
        const fs::path f = state / "block-0002.qfstate";
        fs::resize_file(f, fs::file_size(f) - 7);
        auto o = test::run_qforge(fx.args("gptq", "q4_g32", out) + " --resume " + q(state));
        INFO(o.output);
        REQUIRE(o.exit_code != 0);
        const auto errors = error_lines(o.output);
        REQUIRE(errors.size() == 1);
        REQUIRE_THAT(errors[0], Contains("block-0002.qfstate"));
        REQUIRE_THAT(errors[0], Contains("truncated"));
        REQUIRE(test::files_containing(dir.path(), "out.qf").empty());
    }
    SECTION("a damaged earlier block, found when the writer reaches it") {
        const fs::path f = state / "block-0001.qfstate";
        std::string bytes = slurp(f);
        bytes[bytes.size() - 5] ^= 0x5a;  // inside the last section's zstd frame
        std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
        auto o = test::run_qforge(fx.args("gptq", "q4_g32", out) + " --resume " + q(state));
        INFO(o.output);
        REQUIRE(o.exit_code != 0);
        const auto errors = error_lines(o.output);
        REQUIRE(errors.size() == 1);
        REQUIRE_THAT(errors[0], Contains("block-0001.qfstate"));
        REQUIRE_THAT(errors[0], Contains("damaged"));
        REQUIRE(test::files_containing(dir.path(), "out.qf").empty());
    }
    SECTION("a missing earlier block") {
        fs::remove(state / "block-0000.qfstate");
        auto o = test::run_qforge(fx.args("gptq", "q4_g32", out) + " --resume " + q(state));
        INFO(o.output);
        REQUIRE(o.exit_code != 0);
        const auto errors = error_lines(o.output);
        REQUIRE(errors.size() == 1);
        REQUIRE_THAT(errors[0], Contains("block-0000.qfstate"));
        REQUIRE_THAT(errors[0], Contains("missing"));
    }
}

}  // namespace quant_resume_test
