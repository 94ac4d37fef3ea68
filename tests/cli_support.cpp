#include "cli_support.hpp"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "convert/convert.hpp"

namespace qforge::test {

namespace fs = std::filesystem;

fs::path convert_stories(const fs::path& data, const std::string& variant, const ScratchDir& dir) {
    ConvertOptions o;
    o.input = (data / "stories260K" / variant).string();
    o.output = (dir / (variant + ".qf")).string();
    o.tokenizer = (data / "stories260K" / "tok512.bin").string();
    convert_checkpoint(o);
    return o.output;
}

std::string qforge_command() {
    const char* runner = std::getenv("QFORGE_TEST_RUNNER");
    return std::string(runner ? runner : "") + " '" + QFORGE_BINARY + "'";
}

CommandResult run_qforge(const std::string& args, const std::string& shell_prefix) {
    return run_shell(shell_prefix + " QFORGE_NO_PROGRESS=1 " + qforge_command() + " " + args);
}

CommandResult run_shell(const std::string& command) {
    const std::string cmd = command + " 2>&1";
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (!pipe) throw std::runtime_error("popen failed: " + cmd);
    std::string out;
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
    int status = ::pclose(pipe);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return {code, out};
}

}  // namespace qforge::test
