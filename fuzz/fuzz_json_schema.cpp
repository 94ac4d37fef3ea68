// Constrained generation's JSON schemas and documents (runtime/json_grammar.hpp): a schema text,
// the file separator, then a document's bytes. The schema is compiled or refused with
// qforge::Error; the document is fed byte by byte until the matcher refuses one. The contract:
// a text the matcher calls whole is JSON nlohmann reads, and a text it took is never a dead end
// (some byte continues it, or it is whole).
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/json_io.hpp"
#include "fuzz/fuzz_support.hpp"
#include "runtime/json_grammar.hpp"

using namespace qforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto parts = fuzz::split_files(data, size, 2);
    fuzz::run_reader([&] {
        const JsonGrammar g =
            JsonGrammar::from_schema(parse_ordered_json(parts[0], "schema"), "schema");
        JsonMatcher m(g);
        std::string taken;
        for (char c : parts[1]) {
            JsonMatcher next = m;
            if (!next.feed(static_cast<uint8_t>(c))) break;
            m = next;
            taken += c;
        }
        if (m.complete() && !nlohmann::json::accept(taken)) {
            std::fprintf(stderr, "\n==qforge-fuzz== a whole document is not JSON\n");
            std::abort();
        }
        if (!m.complete()) {
            bool continues = false;
            for (int c = 0; c < 256 && !continues; ++c) {
                JsonMatcher next = m;
                continues = next.feed(static_cast<uint8_t>(c));
            }
            if (!continues) {
                std::fprintf(stderr, "\n==qforge-fuzz== a taken text is a dead end\n");
                std::abort();
            }
        }
    });
    return 0;
}
