// Shared by the libFuzzer harnesses (fuzz/fuzz_*.cpp). The readers take paths and map files, so
// each input is written to a file in a per-process scratch directory (on /dev/shm when it is
// writable, else $TMPDIR or /tmp) and the product's own entry point opens it.
//
// The contract under test: for any bytes, a reader either succeeds or throws qforge::Error. Any
// other exception (std::bad_alloc, std::length_error, a nlohmann::json exception, ...) is a bug:
// run_reader() prints it and aborts, so libFuzzer records the input as a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "core/error.hpp"

namespace qforge::fuzz {

// Splits one fuzz input into several files: the parts between separators, in order. Missing
// parts are empty. The separator is in every harness's dictionary (fuzz/*.dict).
inline constexpr std::string_view kFileSeparator = "\n@@qforge-file@@\n";

std::vector<std::string_view> split_files(const uint8_t* data, size_t size, size_t parts);

// The scratch directory of this process, created on first use and removed at exit.
const std::filesystem::path& scratch_dir();

// Writes `bytes` to scratch_dir()/name (creating parent folders) and returns the path.
std::string write_file(const std::string& name, std::string_view bytes);

// Empties scratch_dir() (between inputs, so a file of one input never leaks into the next).
void clear_scratch();

// The fixture directory tests/data of the source tree (fixed valid files some harnesses pair
// with the fuzzed one).
std::string fixture(const std::string& relative);

// Reads a whole file (fixtures, at start-up); aborts when it cannot.
std::string read_fixture(const std::string& relative);

// Whether QFORGE_FUZZ_VERBOSE is set: then every refusal is printed (to see how far a seed gets).
bool verbose();

// Runs `fn`; a qforge::Error is the expected outcome of bad input and is swallowed, anything
// else aborts with its type and message.
template <class Fn>
void run_reader(Fn&& fn) {
    try {
        fn();
    } catch (const qforge::Error& e) {
        // the reader refused the input with a proper error: fine
        if (verbose()) std::fprintf(stderr, "qforge-fuzz: refused: %s\n", e.what());
    } catch (const std::exception& e) {
        std::fprintf(stderr,
                     "\n==qforge-fuzz== a reader let a non-qforge exception escape: %s: %s\n",
                     typeid(e).name(), e.what());
        std::abort();
    } catch (...) {
        std::fprintf(stderr, "\n==qforge-fuzz== a reader let a non-std exception escape\n");
        std::abort();
    }
}

// A small little-endian reader over the fuzz input, for harnesses that take a few control
// values before the file bytes.
struct InputCursor {
    std::span<const uint8_t> bytes;
    uint8_t u8() {
        if (bytes.empty()) return 0;
        uint8_t v = bytes[0];
        bytes = bytes.subspan(1);
        return v;
    }
    uint32_t u32() {
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(u8()) << (8 * i);
        return v;
    }
    std::string_view rest() const {
        return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
    }
};

}  // namespace qforge::fuzz
