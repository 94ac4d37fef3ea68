// kernels/cpu/isa: the level the environment asks for is the level the binary reports
// (`qforge --version`, which reads the same choice the kernels dispatch on), lowered and never
// raised past the CPU's; the kernels' own agreement across levels is tests/kernels_qdot_test.cpp.
#include <catch2/catch.hpp>
#include <string>

#include "cli_support.hpp"
#include "kernels/cpu/isa.hpp"
#include "test_support.hpp"

namespace kernels_isa_test {

using namespace qforge;
using Catch::Matchers::Contains;

namespace {

// The level `qforge --version` reports under the given environment (QFORGE_NO_AVX2 and
// QFORGE_ISA cleared first, so the test's own environment does not leak in).
std::string reported_isa(const std::string& env) {
    const auto r =
        test::run_qforge("--version", "env -u QFORGE_NO_AVX2 -u QFORGE_ISA " + env + " ");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const std::string key = "CPU kernels: ";
    const auto at = r.output.find(key);
    REQUIRE(at != std::string::npos);
    const auto begin = at + key.size();
    return r.output.substr(begin, r.output.find_first_of(" \n", begin) - begin);
}

}  // namespace

TEST_CASE("QFORGE_ISA and QFORGE_NO_AVX2 lower the level qforge reports and uses", "[isa][cli]") {
    const Isa top = cpu_isa_supported();
    REQUIRE(reported_isa("") == isa_name(top));
    REQUIRE(reported_isa("QFORGE_NO_AVX2=1") == "scalar");
    REQUIRE(reported_isa("QFORGE_ISA=avx512 QFORGE_NO_AVX2=1") == "scalar");
    REQUIRE(reported_isa("QFORGE_ISA=no-such-level") == "scalar");
    for (Isa isa : kIsaLevels) {
        INFO(isa_name(isa));
        const std::string expect(isa_name(isa <= top ? isa : top));  // never above the CPU's
        REQUIRE(reported_isa("QFORGE_ISA=" + std::string(isa_name(isa))) == expect);
    }
}

}  // namespace kernels_isa_test
