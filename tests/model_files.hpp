// The real models scripts/get_models.sh puts in models/ (or $QFORGE_MODELS_DIR): tests that use
// one skip with a printed reason when it is absent (a clean clone, CI).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "test_support.hpp"

namespace qforge::test {

inline std::optional<std::filesystem::path> models_file(const std::string& name) {
    const char* env = std::getenv("QFORGE_MODELS_DIR");
    const std::filesystem::path dir =
        env ? std::filesystem::path(env) : std::filesystem::path(QFORGE_SOURCE_DIR) / "models";
    const std::filesystem::path p = dir / name;
    return std::filesystem::exists(p) ? std::optional(p) : std::nullopt;
}

}  // namespace qforge::test

// models/<file>, or skip the current test saying how to fetch it (`what`: get_models.sh's name).
#define QF_REQUIRE_MODEL(var, file, what)                                                         \
    auto var##_opt = ::qforge::test::models_file(file);                                           \
    if (!var##_opt)                                                                               \
        QF_SKIP(std::string("models/") + (file) + " is absent (scripts/get_models.sh " + (what) + \
                " fetches it, or set QFORGE_MODELS_DIR)");                                        \
    const std::filesystem::path var = *var##_opt
