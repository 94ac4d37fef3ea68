// Pieces every model source shares (sources/model_source.hpp): provenance entries for input
// files, the layer-count sanity check, finding and checking the tokenizer, and the RoPE row
// reordering that llama2.c and llama.cpp's GGUF layouts need. One place, so every input kind
// records the same header keys with the same meaning.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "formats/model_config.hpp"

namespace qforge {

// {"file": name only, "bytes", "hash": xxh3-128}. Read with read() rather than through a
// mapping, so hashing a large checkpoint does not add its pages to our resident memory.
nlohmann::json source_entry(const std::string& path);

// Refuses a config whose layer count the checkpoint cannot hold (each layer has tensors of its
// own), before the per-layer tensor list is built: 2^31 layers declared beside a 3-tensor file
// must not become billions of expected names. `what` names the key, e.g. "num_hidden_layers".
void check_layers_fit(uint64_t num_layers, uint64_t tensor_count, const std::string& file,
                      const std::string& what);

// The tokenizer to embed: `given` when not empty, else `found`; null (and a warning) when there
// is none. Sets `tokenizer_file` to the file used. It must fit the model `config` read from
// `input` (formats/qf_validate.hpp: no more tokens than vocab_size, no special id past it);
// fewer tokens are the padding rows real models have, reported as a warning: generation never
// samples an id without a token.
nlohmann::json resolve_tokenizer(const std::string& given, const std::optional<std::string>& found,
                                 const std::string& input, const ModelConfig& config,
                                 std::string& tokenizer_file, std::vector<std::string>& warnings);

// Reorders the rows (llama2.c checkpoints and llama.cpp's GGUF q/k layout) of a q or k
// projection ([n_heads * head_dim, cols], `row_bytes` per row) from adjacent-pair RoPE to
// rotate-half RoPE: within each head, output row j * (head_dim/2) + i is input row 2i + j
// (j in {0, 1}). This is transformers' convert_llama_weights_to_hf permute,
// w.view(n_heads, head_dim/2, 2, cols).transpose(1, 2).reshape(n_heads * head_dim, cols).
void permute_rope_pairs_to_halves(std::span<const uint8_t> in, std::span<uint8_t> out,
                                  uint64_t n_heads, uint64_t head_dim, uint64_t row_bytes);
// The inverse (GGUF export writes llama.cpp's layout): output row 2i + j is input row
// j * (head_dim/2) + i within each head, so the two functions undo each other exactly.
void permute_rope_halves_to_pairs(std::span<const uint8_t> in, std::span<uint8_t> out,
                                  uint64_t n_heads, uint64_t head_dim, uint64_t row_bytes);

}  // namespace qforge
