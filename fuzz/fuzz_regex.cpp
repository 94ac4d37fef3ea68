// Constrained generation's regular expressions (runtime/regex_dfa.hpp): a pattern, the file
// separator, then a text. The pattern is compiled or refused with qforge::Error (the sizes are
// bounded: a pattern never stalls or exhausts memory); the text is walked byte by byte until the
// DFA refuses one. The contract: every state a taken text reaches can still end a match (some
// byte continues it, or it is whole), and a state calls itself finished only when it is whole
// and nothing continues it.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_support.hpp"
#include "runtime/regex_dfa.hpp"

using namespace qforge;

namespace {
[[noreturn]] void broken(const char* what) {
    std::fprintf(stderr, "\n==qforge-fuzz== %s\n", what);
    std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto parts = fuzz::split_files(data, size, 2);
    fuzz::run_reader([&] {
        const RegexDfa d = RegexDfa::compile(parts[0], "pattern");
        uint32_t s = d.start();
        for (char c : parts[1]) {
            const uint32_t next = d.next(s, static_cast<uint8_t>(c));
            if (next == RegexDfa::kDead) break;
            s = next;
        }
        bool continues = false;
        for (int c = 0; c < 256 && !continues; ++c)
            continues = d.next(s, static_cast<uint8_t>(c)) != RegexDfa::kDead;
        if (!continues && !d.accepting(s)) broken("a taken text is a dead end");
        if (d.finished(s) != (d.accepting(s) && !continues)) broken("finished is wrong");
    });
    return 0;
}
