// What the harnesses do with a reader's result, so that a value the reader accepted is also
// used the way the commands use it: a tokenizer encodes and decodes, a written .qf is reopened.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/tokenizer.hpp"

namespace qforge::fuzz {

// Texts that reach the pre-tokenizers' branches: spaces, digits, contractions, non-ASCII,
// special-token strings and invalid UTF-8.
inline constexpr const char* kSampleTexts[] = {
    "Hello world! It's 2024, isn't it?  Tabs\tand\nnewlines.",
    ("  leading spaces, 12345678 digits, caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 "
     "\xf0\x9f\x98\x80"),
    "<s></s><|endoftext|><|im_start|>user<|im_end|><unk>",
    "bad utf-8: \xff\xfe\xc0\x80 \xed\xa0\x80 end",
    "",
};

// Encodes the sample texts (and `extra`), decodes the ids back, streams them piece by piece and
// renders the chat template when there is one. Errors are the caller's to judge.
inline void exercise_tokenizer(const Tokenizer& tok, std::string_view extra = {}) {
    volatile size_t sink = tok.vocab_size() + tok.stop_ids().size();
    auto round = [&](std::string_view text) {
        for (bool special : {true, false}) {
            const auto ids = tok.encode(text, special);
            sink = sink + tok.decode(ids, !special).size();
            int32_t prev = -1;
            for (int32_t id : ids) {
                sink = sink + tok.decode_piece(prev, id).size() + tok.piece(id).size() +
                       static_cast<size_t>(tok.is_special(id));
                prev = id;
            }
        }
    };
    for (const char* t : kSampleTexts) round(t);
    if (!extra.empty()) round(extra);
    if (!tok.chat_template().empty()) {
        try {
            sink = sink + render_chat_prompt(tok, "You are terse.", "Hi there").size();
        } catch (const Error&) {
            // a template outside the supported subset: generate falls back to the raw prompt
        }
    }
}

// A .qf that a converter wrote must open again: anything the converter accepted and wrote but
// the reader refuses is a bug (an accepted file no command can load).
inline void reopen_written_qf(const std::string& path) {
    try {
        QfFile qf(path, QfOpenOptions{.verify_checksums = true});
        ModelConfig cfg = model_config_from_json(qf.model(), path);
        (void)cfg;
        if (qf.has_tokenizer()) exercise_tokenizer(Tokenizer::from_schema(qf.tokenizer(), path));
    } catch (const Error& e) {
        std::fprintf(stderr, "\n==qforge-fuzz== a converter wrote a .qf that does not load: %s\n",
                     e.what());
        std::abort();
    }
}

}  // namespace qforge::fuzz
