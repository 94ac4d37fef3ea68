// llama2.c checkpoints (Karpathy's run.c "version 0" export, e.g. stories260K.bin) as a
// ModelSource (sources/model_source.hpp).
//
// The file: a 28-byte header of 7 little-endian int32 (Llama2cHeader), then float32 arrays with
// every layer of one kind stored together, in the order of kFileOrder (llama2c.cpp):
// token_embedding [V,D], rms_att [L,D], wq [L,D,D], wk [L,KV,D], wv [L,KV,D], wo [L,D,D],
// rms_ffn [L,D], w1 [L,H,D], w2 [L,D,H], w3 [L,H,D], rms_final [D], freq_cis_real [S,hd/2],
// freq_cis_imag [S,hd/2] (unused), and wcls [V,D] only when vocab_size is negative (an unshared
// classifier). KV is n_kv_heads * head_dim rows. Matrices are [out, in] row-major.
//
// llama2.c's RoPE rotates adjacent pairs (2i, 2i+1) of each head; Hugging Face (and our runtime)
// rotates the two halves (i, i + head_dim/2). Conversion reorders the rows of wq and wk so the
// stored model is the Hugging Face one: a .qf from stories260K.bin is bit-identical in its
// tensors to one converted from the HF checkpoint that transformers' convert_llama_weights_to_hf
// would make.
//
// The newer exports that start with the magic "ak42" (versions 1 and 2 of llama2.c's export.py,
// other numbers in forks) are refused with a message saying so.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/model_config.hpp"

namespace qforge {

// The legacy header, as run.c's Config reads it. Every field is a count; a negative vocab_size
// means the classifier (wcls) is stored separately after the freq_cis arrays.
struct Llama2cHeader {
    int32_t dim;         // hidden size D
    int32_t hidden_dim;  // MLP width H
    int32_t n_layers;
    int32_t n_heads;     // query heads; head_dim = dim / n_heads
    int32_t n_kv_heads;  // key/value heads (GQA when fewer than n_heads)
    int32_t vocab_size;  // > 0: shared classifier (tied embeddings); < 0: wcls follows
    int32_t seq_len;     // maximum sequence length (max_position_embeddings)
};
static_assert(sizeof(Llama2cHeader) == 28, "the llama2.c header is 7 packed int32");

// The first four bytes of the newer exports: "ak42" read as a little-endian uint32.
inline constexpr uint32_t kLlama2cMagic = 0x616b3432;

// Whether `path` is a llama2.c checkpoint as detect_model_file (sources/detect.hpp) decides:
// a file starting with the "ak42" magic, or whose legacy header implies exactly its length, or
// one named *.bin that is no other known kind. Never throws.
bool is_llama2c_checkpoint(const std::string& path);

// Whether the file's first 28 bytes are a valid legacy header that implies exactly `size`
// bytes. Reads at most the header; never throws.
bool llama2c_header_implies_size(const std::string& path, uint64_t size);

// The header's model, as the HF conversion of the same model describes it (llama, rms_norm_eps
// 1e-5, rope_theta 10000, max_position_embeddings = seq_len, bos 1, eos 2, f32). Throws Error
// naming `file` and the field when a value is out of range.
ModelConfig llama2c_model_config(const Llama2cHeader& header, const std::string& file);

}  // namespace qforge
