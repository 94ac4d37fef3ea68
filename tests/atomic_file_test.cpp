// AtomicFile: output appears only on commit; errors, a full disk and Ctrl-C leave nothing.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "test_support.hpp"

using namespace qforge;
namespace fs = std::filesystem;

namespace {
size_t entries(const fs::path& dir) {
    return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}
}  // namespace

TEST_CASE("atomic file appears only after commit, with write_at patches", "[core][atomic]") {
    test::ScratchDir dir("atomic");
    const fs::path p = dir / "out.bin";
    {
        AtomicFile f(p.string());
        f.write("hello world", 11);
        f.pad_to(16);
        f.write_at(0, {reinterpret_cast<const uint8_t*>("J"), 1});
        REQUIRE_FALSE(fs::exists(p));
        REQUIRE(fs::exists(f.temp_path()));
        f.commit();
    }
    const auto bytes = test::read_file(p);
    REQUIRE(bytes.size() == 16);
    REQUIRE(std::string(bytes.begin(), bytes.begin() + 11) == "Jello world");
    REQUIRE(bytes[15] == 0);
    REQUIRE(entries(dir.path()) == 1);
}

TEST_CASE("atomic file without commit leaves nothing", "[core][atomic]") {
    test::ScratchDir dir("atomic-abort");
    { AtomicFile f((dir / "out.bin").string()); f.write("abc", 3); }
    REQUIRE(entries(dir.path()) == 0);
}

TEST_CASE("a full disk (file size limit) is an error naming the file, and leaves nothing",
          "[core][atomic]") {
    test::ScratchDir dir("atomic-full");
    const fs::path p = dir / "big.bin";
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        // Child: limit files to 64 KiB, as a full disk would, and try to write 1 MiB.
        struct rlimit lim = {64 << 10, 64 << 10};
        setrlimit(RLIMIT_FSIZE, &lim);
        std::vector<uint8_t> data(1 << 20, 7);
        try {
            AtomicFile f(p.string());
            f.write(data);
            f.commit();
        } catch (const Error& e) {
            const std::string msg = e.what();
            _exit(msg.find(p.string()) != std::string::npos && msg.find("write failed") != std::string::npos
                      ? 42
                      : 1);
        }
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 42);
    REQUIRE(entries(dir.path()) == 0);
}

TEST_CASE("Ctrl-C (SIGINT) while writing removes the temporary file", "[core][atomic]") {
    test::ScratchDir dir("atomic-sigint");
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        AtomicFile f((dir / "out.bin").string());
        std::vector<uint8_t> data(3 << 20, 1);
        f.write(data);
        raise(SIGINT);
        _exit(0);  // not reached: the handler re-raises with the default action
    }
    int status = 0;
    waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGINT);
    REQUIRE(entries(dir.path()) == 0);
}
