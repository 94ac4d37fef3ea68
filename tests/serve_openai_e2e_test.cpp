// End-to-end: `qforge serve` on stories260K answering the official PyPI `openai` client
// (tests/e2e/openai_client_test.py: completions streamed and not against `qforge generate`,
// seeded sampling, models, refusals, the API key; runs with the first Python that imports openai:
// $QFORGE_PYTHON, then python3, and skips with the reason otherwise), and measured by
// scripts/load_test.py (tests/e2e/load_test_check.py, standard library only).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli_support.hpp"
#include "kernels/device_info.hpp"

namespace serve_openai_e2e_test {

using namespace qforge;

namespace {
// tests/e2e/SCRIPT run by `python` against the qforge binary and stories260K converted to a .qf:
// exit status 0 and its `verdict` line.
void run_script(const std::filesystem::path& data, const std::string& python, const char* script,
                const char* verdict) {
    test::ScratchDir dir(std::string("serve-e2e-") + script);
    const auto model = test::convert_stories(data, "hf", dir);
    const auto r =
        test::run_shell("'" + python + "' '" + std::string(QFORGE_SOURCE_DIR) + "/tests/e2e/" +
                        script + "' '" + QFORGE_BINARY + "' '" + model.string() + "'");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Contains(verdict));
}
}  // namespace

TEST_CASE("serve answers the official openai client (streaming and not)", "[serve][e2e]") {
    QF_REQUIRE_SHARED_DATA(data);
    std::string python;
    for (const char* candidate :
         {static_cast<const char*>(std::getenv("QFORGE_PYTHON")), "python3"}) {
        if (!candidate || !*candidate) continue;
        const std::string probe =
            std::string("'") + candidate + "' -c 'import openai' >/dev/null 2>&1";
        if (std::system(probe.c_str()) == 0) {
            python = candidate;
            break;
        }
    }
    if (python.empty())
        QF_SKIP("no Python with the openai package (pip install openai; or set QFORGE_PYTHON)");
    run_script(data, python, "openai_client_test.py", "openai e2e: ok");
}

// scripts/load_test.py (standard library only) against the server: its counts, latencies,
// resident memory and /health step counters, batching at four streams, and every request an
// error where no server listens (tests/e2e/load_test_check.py).
TEST_CASE("scripts/load_test.py measures qforge serve and counts failed requests", "[serve][e2e]") {
    QF_REQUIRE_SHARED_DATA(data);
    if (std::system("python3 -c 'import json' >/dev/null 2>&1") != 0) QF_SKIP("no python3");
    run_script(data, "python3", "load_test_check.py", "load test e2e: ok");
}

TEST_CASE("serve --backend cuda without a device: one error line naming CUDA", "[serve][cli]") {
    if (!list_gpus().empty())
        QF_SKIP("a CUDA device is present (the [cuda] scheduler case serves on it)");
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("serve-cuda-none");
    const auto model = test::convert_stories(data, "hf", dir);
    const auto r = test::run_qforge("serve '" + model.string() + "' --port 0 --backend cuda");
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("qforge: error: ") && Catch::Contains("CUDA"));
    CHECK_THAT(r.output, !Catch::Contains("qforge serve: "));  // never started serving
}

}  // namespace serve_openai_e2e_test
