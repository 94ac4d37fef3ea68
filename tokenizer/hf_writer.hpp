// The normalized tokenizer schema (docs/FORMAT.md, "tokenizer") written back as Hugging Face
// files: tokenizer.json, tokenizer_config.json and generation_config.json, for the two BPE
// families (bpe_byte_level, bpe_sentencepiece). The inverse of tokenizer/source_hf.cpp: reading
// the written files gives back the same schema (tests/hf_export_test.cpp checks it on every
// tokenizer.json fixture). llama2c vocabularies have no tokenizer.json form here (run.c's
// score-ordered merges are not HF's ranked merges) and are refused.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace qforge {

struct HfTokenizerFiles {
    nlohmann::json tokenizer;          // tokenizer.json
    nlohmann::json tokenizer_config;   // tokenizer_config.json
    nlohmann::json generation_config;  // generation_config.json (bos, eos and stop ids)
};

// An Error naming `source` for a schema this cannot write (llama2c, or a GGUF-only feature).
HfTokenizerFiles hf_tokenizer_files(const nlohmann::json& schema, const std::string& source);

}  // namespace qforge
