// Text <-> token ids, token for token identical to each model's own tokenizer.
// Families: byte-level BPE with a regex pre-tokenizer (GPT-2, Llama 3, Qwen2, SmolLM2),
// SentencePiece-style BPE (Llama 2, Mistral, TinyLlama: Metaspace, byte fallback), and the
// llama2.c vocabulary (tok512.bin). All are built from the normalized schema stored in the
// .qf header (docs/FORMAT.md, "tokenizer"), which formats/tokenizer_source.cpp produces.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qforge {

class Tokenizer {
  public:
    // From the normalized schema (the "tokenizer" object of a .qf header).
    static Tokenizer from_schema(const nlohmann::json& schema, const std::string& source);
    // From a file: a .qf, a tokenizer.json (tokenizer_config.json beside it is read too) or a
    // llama2.c vocabulary (.bin).
    static Tokenizer load(const std::string& path);

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

    // Invalid UTF-8 in `text` is replaced by U+FFFD first (as Python's errors="replace").
    // With add_special, BOS/EOS are added as the tokenizer's add_bos/add_eos say.
    std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;
    // With skip_special, tokens marked special are left out.
    std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
    // The text of one token as it continues a decoded stream (for streaming generation);
    // `previous` is the id before it (llama2.c strips the leading space after BOS).
    std::string decode_piece(int32_t previous, int32_t id) const;

    size_t vocab_size() const;
    std::optional<int32_t> bos_id() const;
    std::optional<int32_t> eos_id() const;
    bool add_bos() const;
    std::vector<int32_t> stop_ids() const;     // generation stops on any of them
    std::string_view piece(int32_t id) const;  // the vocabulary string of a token
    bool is_special(int32_t id) const;
    const std::string& chat_template() const;  // empty when none
    const std::string& source() const;         // the file it was loaded from, for errors

  private:
    struct Impl;
    static Tokenizer from_checked_schema(const nlohmann::json& schema, const std::string& source);
    explicit Tokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace qforge
