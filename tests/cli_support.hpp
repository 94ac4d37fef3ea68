// Test helpers that need the converter (convert/) or the qforge binary: the second piece of the
// test support, linked by qforge_tests only. tests/test_support.hpp is the first piece, with
// core and formats alone, so the CUDA-only GPU-check build (no convert, tokenizer or CLI) links
// it too.
#pragma once

#include <filesystem>
#include <string>

#include "test_support.hpp"

namespace qforge::test {

// Converts <data>/stories260K/<variant> ("hf" or "hf-fp16") with its tok512.bin into
// <dir>/<variant>.qf and returns that path.
std::filesystem::path convert_stories(const std::filesystem::path& data, const std::string& variant,
                                      const ScratchDir& dir);

struct CommandResult {
    int exit_code;
    std::string output;  // stdout and stderr together
};
// The shell words that start qforge: QFORGE_TEST_RUNNER (say, `qemu-x86_64 -cpu max`, to run
// the children started through here under the same emulated CPU as the test binary) then the
// binary, quoted.
std::string qforge_command();
// Runs the qforge binary with the given argument string (shell-quoted by the caller), after
// `shell_prefix` (e.g. "ulimit -f 100;").
CommandResult run_qforge(const std::string& args, const std::string& shell_prefix = "");
// Runs a shell command line (sh -c), stdout and stderr together.
CommandResult run_shell(const std::string& command);
// A path as one shell word of run_qforge's and run_shell's command lines: in single quotes (the
// tests' scratch and fixture paths hold none).
inline std::string q(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

}  // namespace qforge::test
