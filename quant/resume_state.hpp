// `qforge quantize --resume DIR`: the layer-sequential engine's per-block state on disk, so an
// interrupted calibrated quantization continues at the first block it had not finished and ends
// with a file byte-identical to an uninterrupted run.
//
// DIR holds
//   run.json             {"format": "qforge-resume", "version": 1, "fingerprint": {...}}: the
//                        input files' hashes, the recipe, the calibrated options and the hash of
//                        the calibration tokens. A DIR whose fingerprint differs is refused,
//                        naming the first key that differs.
//   block-NNNN.qfstate   one per finished block (N = the block's index, from 0), each written
//                        atomically (temporary file + rename), so a file under its final name is
//                        complete unless damaged afterwards.
//
// A .qfstate file (integers little-endian, as every supported host stores them):
//   StateFileHeader      magic "QFSTATE\0", version, section count, the block's index
//   sections             each a StateSection followed by `stored_bytes` of one zstd frame (with
//                        zstd's content checksum, so a damaged payload is detected) that
//                        decompresses to exactly `raw_bytes`:
//     kind 1 meta        CBOR (doubles stored exactly): {"linears": [LinearReport...],
//                        "awq_group": the block's AWQ scale record or null, "awq_clips": [...]}
//     kind 2 hidden      the hidden states after the block: tokens x hidden float32, bit-exact
//     kind 3 tensor      `index` = source tensor index; its bytes as handed to the writer
//                        (packed quantized rows, or folded float vectors in their planned type)
//   nothing after the last section (a longer or shorter file is refused).
// Sections are compressed one by one, so serving a block's tensors does not decompress its
// hidden states, and resuming decompresses the hidden states of the last block only.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qforge {

struct StateFileHeader {
    char magic[8];      // "QFSTATE\0"
    uint32_t version;   // kStateFileVersion
    uint32_t sections;  // StateSection records that follow
    uint64_t layer;     // the block this file finishes; equals the NNNN of its name
};
static_assert(sizeof(StateFileHeader) == 24, "StateFileHeader is 24 bytes on disk");

struct StateSection {
    uint32_t kind;          // StateSectionKind
    uint32_t reserved;      // 0
    uint64_t index;         // kind tensor: the source tensor index; else 0
    uint64_t raw_bytes;     // after decompression
    uint64_t stored_bytes;  // the zstd frame that follows
};
static_assert(sizeof(StateSection) == 32, "StateSection is 32 bytes on disk");

enum class StateSectionKind : uint32_t { meta = 1, hidden = 2, tensor = 3 };

constexpr uint32_t kStateFileVersion = 1;

// One finished block, as saved and as loaded (parts not asked for stay empty).
struct BlockState {
    uint64_t layer = 0;
    nlohmann::json meta;                             // see "kind 1 meta" above
    std::vector<float> hidden;                       // [tokens][hidden] after the block
    std::map<size_t, std::vector<uint8_t>> tensors;  // source tensor index -> bytes
};

class ResumeDir {
  public:
    // Creates `dir` and its run.json, or checks an existing run.json against `fingerprint`
    // (qforge::Error naming the key that differs), then counts the finished blocks: the highest
    // block-NNNN.qfstate and every one before it must exist (else an error naming the missing
    // file); no more than `num_layers`.
    ResumeDir(std::string dir, const nlohmann::json& fingerprint, uint64_t num_layers);

    const std::string& dir() const { return dir_; }
    uint64_t blocks_done() const { return blocks_done_; }  // blocks 0 .. blocks_done - 1
    std::string block_path(uint64_t layer) const;

    void save(const BlockState& state) const;
    // Throws qforge::Error naming the file when it is truncated, damaged or of another version.
    BlockState load(uint64_t layer, bool want_hidden, bool want_tensors) const;

  private:
    std::string dir_;
    uint64_t blocks_done_ = 0;
};

}  // namespace qforge
