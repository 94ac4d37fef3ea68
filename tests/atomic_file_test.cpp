// AtomicFile and AtomicDirectory: output appears only on commit, complete; errors, a full disk,
// Ctrl-C and SIGKILL leave nothing; nothing that is not a regular file is ever written over.
// Each case runs with O_TMPFILE and with the named-temporary fallback (QFORGE_NO_O_TMPFILE).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "test_support.hpp"

namespace atomic_file_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

size_t entries(const fs::path& dir) {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

// Sets or clears QFORGE_NO_O_TMPFILE for one scope.
struct TempMode {
    explicit TempMode(bool named) {
        if (named)
            ::setenv("QFORGE_NO_O_TMPFILE", "1", 1);
        else
            ::unsetenv("QFORGE_NO_O_TMPFILE");
    }
    ~TempMode() { ::unsetenv("QFORGE_NO_O_TMPFILE"); }
};

struct Stat {
    dev_t dev;
    ino_t ino;
    mode_t mode;
    dev_t rdev;
    bool operator==(const Stat&) const = default;
};

Stat lstat_of(const fs::path& p) {
    struct stat st {};
    REQUIRE(::lstat(p.c_str(), &st) == 0);
    return {st.st_dev, st.st_ino, st.st_mode, st.st_rdev};
}

// A forked test child starts as a fresh qforge process would: Catch2's own fatal-signal handlers
// replaced by the default dispositions, so AtomicFile installs its cleanup handler.
void default_signals() {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
}

int wait_status(pid_t pid) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return status;
}

}  // namespace

TEST_CASE("atomic file appears only after commit, with write_at patches", "[core][atomic]") {
    const bool named = GENERATE(false, true);
    TempMode mode(named);
    test::ScratchDir dir("atomic");
    const fs::path p = dir / "out.bin";
    {
        AtomicFile f(p.string());
        REQUIRE(f.anonymous() == !named);
        f.write("hello world", 11);
        f.pad_to(16);
        f.write_at(0, {reinterpret_cast<const uint8_t*>("J"), 1});
        REQUIRE_FALSE(fs::exists(p));
        // O_TMPFILE: no name at all before commit; the fallback: one hidden temporary.
        REQUIRE(entries(dir.path()) == (named ? 1u : 0u));
        f.commit();
    }
    const auto bytes = test::read_file(p);
    REQUIRE(bytes.size() == 16);
    REQUIRE(std::string(bytes.begin(), bytes.begin() + 11) == "Jello world");
    REQUIRE(bytes[15] == 0);
    REQUIRE(entries(dir.path()) == 1);
}

TEST_CASE("atomic file replaces an existing regular file whole, leaving nothing else",
          "[core][atomic][hostile][output]") {
    const bool named = GENERATE(false, true);
    TempMode mode(named);
    test::ScratchDir dir("atomic-replace");
    const fs::path p = dir / "out.bin";
    test::write_file(p, std::string("the old contents"));
    {
        AtomicFile f(p.string());
        f.write("new", 3);
        REQUIRE(test::read_file(p).size() == 16);  // the old file stays whole until commit
        f.commit();
    }
    REQUIRE(test::read_file(p) == std::vector<uint8_t>{'n', 'e', 'w'});
    REQUIRE(entries(dir.path()) == 1);

    // A symlink there is replaced by the file; its target is left alone.
    const fs::path target = dir / "target.bin", link = dir / "link.bin";
    test::write_file(target, std::string("target"));
    fs::create_symlink(target, link);
    {
        AtomicFile f(link.string());
        f.write("via link", 8);
        f.commit();
    }
    REQUIRE_FALSE(fs::is_symlink(link));
    REQUIRE(test::read_file(link).size() == 8);
    REQUIRE(test::read_file(target).size() == 6);
    REQUIRE(entries(dir.path()) == 3);
}

TEST_CASE("atomic file without commit leaves nothing", "[core][atomic]") {
    const bool named = GENERATE(false, true);
    TempMode mode(named);
    test::ScratchDir dir("atomic-abort");
    {
        AtomicFile f((dir / "out.bin").string());
        f.write("abc", 3);
    }
    REQUIRE(entries(dir.path()) == 0);
}

TEST_CASE("atomic file never writes over a device, FIFO, socket or directory",
          "[core][atomic][hostile][output]") {
    const bool named = GENERATE(false, true);
    TempMode mode(named);
    test::ScratchDir dir("atomic-special");
    const fs::path fifo = dir / "fifo", sub = dir / "sub", to_dev = dir / "to-null";
    REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
    fs::create_directory(sub);
    fs::create_symlink("/dev/null", to_dev);
    for (const fs::path& p : {fs::path("/dev/null"), fs::path("/dev/full"), fifo, sub, to_dev}) {
        INFO(p);
        const Stat before = lstat_of(p);
        try {
            AtomicFile f(p.string());
            FAIL("accepted " << p);
        } catch (const Error& e) {
            REQUIRE_THAT(e.what(), Contains(p.string()) && Contains("refusing to write over it"));
        }
        REQUIRE(lstat_of(p) == before);
    }
    REQUIRE(entries(dir.path()) == 3);

    // Checked again at commit: a FIFO made at the target while the file was being written.
    const fs::path late = dir / "late";
    {
        AtomicFile f(late.string());
        f.write("abc", 3);
        REQUIRE(::mkfifo(late.c_str(), 0644) == 0);
        const Stat before = lstat_of(late);
        REQUIRE_THROWS_WITH(
            f.commit(), Contains(late.string()) && Contains("a FIFO") && !Contains("qforge-tmp"));
        REQUIRE(lstat_of(late) == before);
    }
    REQUIRE(entries(dir.path()) == 4);
}

TEST_CASE("atomic file: a missing directory is an error up front, naming it",
          "[core][atomic][hostile][output]") {
    const bool named = GENERATE(false, true);
    TempMode mode(named);
    test::ScratchDir dir("atomic-nodir");
    const fs::path p = dir / "missing" / "out.bin";
    REQUIRE_THROWS_WITH(AtomicFile(p.string()), Contains(p.string()) &&
                                                    Contains("does not exist") &&
                                                    !Contains("qforge-tmp"));
    REQUIRE(entries(dir.path()) == 0);
}

TEST_CASE("a full disk (file size limit) is an error naming the file, and leaves nothing",
          "[core][atomic][hostile][output]") {
    const bool named = GENERATE(false, true);
    TempMode mode(named);
    test::ScratchDir dir("atomic-full");
    const fs::path p = dir / "big.bin";
    test::write_file(p, std::string("old"));
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
            // The final path and the errno text, never the temporary name.
            const std::string msg = e.what();
            const bool ok = msg.rfind(p.string() + ": write failed: ", 0) == 0 &&
                            msg.find(std::strerror(EFBIG)) != std::string::npos &&
                            msg.find("qforge-tmp") == std::string::npos;
            _exit(ok ? 42 : 1);
        }
        _exit(0);
    }
    const int status = wait_status(pid);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 42);
    REQUIRE(entries(dir.path()) == 1);
    REQUIRE(test::read_file(p).size() == 3);  // the old file, untouched
}

TEST_CASE("Ctrl-C (SIGINT) while writing removes the temporary file", "[core][atomic]") {
    const bool named = GENERATE(false, true);
    TempMode mode(named);
    test::ScratchDir dir("atomic-sigint");
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        default_signals();
        AtomicFile f((dir / "out.bin").string());
        std::vector<uint8_t> data(3 << 20, 1);
        f.write(data);
        raise(SIGINT);
        _exit(0);  // not reached: the handler re-raises with the default action
    }
    const int status = wait_status(pid);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGINT);
    REQUIRE(entries(dir.path()) == 0);
}

TEST_CASE("SIGKILL while writing leaves nothing (O_TMPFILE) and the old file whole",
          "[core][atomic][hostile][output]") {
    test::ScratchDir dir("atomic-sigkill");
    const fs::path p = dir / "out.bin";
    for (const bool existing : {false, true}) {
        if (existing) test::write_file(p, std::string("old"));
        int ready[2];
        REQUIRE(::pipe(ready) == 0);
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            AtomicFile f(p.string());
            std::vector<uint8_t> data(3 << 20, 1);
            f.write(data);
            f.write(data);  // past the buffer: bytes are in the file
            const char c = f.anonymous() ? 'a' : 'n';
            if (::write(ready[1], &c, 1) != 1) _exit(1);
            for (;;) ::pause();
        }
        ::close(ready[1]);
        char c = 0;
        REQUIRE(::read(ready[0], &c, 1) == 1);
        ::close(ready[0]);
        REQUIRE(c == 'a');
        REQUIRE(::kill(pid, SIGKILL) == 0);
        const int status = wait_status(pid);
        REQUIRE(WIFSIGNALED(status));
        REQUIRE(entries(dir.path()) == (existing ? 1u : 0u));
        if (existing) REQUIRE(test::read_file(p).size() == 3);
    }
}

TEST_CASE("atomic directory: appears on commit, errors and signals remove its temporary tree",
          "[core][atomic][hostile][output]") {
    const bool named = GENERATE(false, true);
    TempMode mode(named);
    test::ScratchDir dir("atomic-dir");
    const fs::path out = dir / "export";
    auto write_one = [](const fs::path& p, const std::string& text) {
        AtomicFile f(p.string());
        f.write(text.data(), text.size());
        f.commit();
    };

    SECTION("commit renames it into place (over an empty directory too)") {
        for (const bool empty_target : {false, true}) {
            if (empty_target) fs::create_directory(out);
            {
                AtomicDirectory d(out.string() + "/");
                REQUIRE(d.final_path() == out.string());
                write_one(fs::path(d.temp_path()) / "a.json", "{}");
                REQUIRE(entries(dir.path()) == (empty_target ? 2u : 1u));
                d.commit();
            }
            REQUIRE(entries(dir.path()) == 1);
            REQUIRE(entries(out) == 1);
            fs::remove_all(out);
        }
    }
    SECTION("without commit (an error) nothing is left") {
        {
            AtomicDirectory d(out.string());
            write_one(fs::path(d.temp_path()) / "a.json", "{}");
            AtomicFile pending((fs::path(d.temp_path()) / "b.bin").string());
            pending.write("x", 1);
        }
        REQUIRE(entries(dir.path()) == 0);
    }
    SECTION("a non-empty directory at the target: commit fails, the target and dir unchanged") {
        fs::create_directory(out);
        test::write_file(out / "keep", std::string("keep"));
        {
            AtomicDirectory d(out.string());
            write_one(fs::path(d.temp_path()) / "a.json", "{}");
            REQUIRE_THROWS_WITH(d.commit(), Contains(out.string()) && Contains("not an empty") &&
                                                !Contains("qforge-tmp"));
        }
        REQUIRE(entries(dir.path()) == 1);
        REQUIRE(entries(out) == 1);
    }
    SECTION("a file, a device or a missing parent is refused before anything is made") {
        test::write_file(dir / "file", std::string("x"));
        for (const fs::path& p : {dir / "file", fs::path("/dev/null"), dir / "no" / "such"}) {
            INFO(p);
            REQUIRE_THROWS_WITH(AtomicDirectory(p.string()), Contains(p.string()));
        }
        REQUIRE(entries(dir.path()) == 1);
    }
    SECTION("SIGINT and SIGTERM remove the temporary tree, finished files and pending ones") {
        for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
            pid_t pid = fork();
            REQUIRE(pid >= 0);
            if (pid == 0) {
                default_signals();
                AtomicDirectory d(out.string());
                for (int i = 0; i < 40; ++i)
                    write_one(fs::path(d.temp_path()) / ("f" + std::to_string(i)), "data");
                AtomicFile pending((fs::path(d.temp_path()) / "pending").string());
                pending.write("x", 1);
                raise(sig);
                _exit(0);
            }
            const int status = wait_status(pid);
            REQUIRE(WIFSIGNALED(status));
            REQUIRE(WTERMSIG(status) == sig);
            REQUIRE(entries(dir.path()) == 0);
        }
    }
}

}  // namespace atomic_file_test
