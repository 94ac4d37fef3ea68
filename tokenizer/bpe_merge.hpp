// The BPE merge loop shared by every family: repeatedly merge the adjacent pair with the best
// priority (lowest value), the leftmost one on ties, until no pair merges. Hugging Face BPE uses
// the merge rank as priority; llama2.c's run.c uses the merged piece's score (negated here).
// A heap of candidate pairs over a linked list of symbols makes this O(n log n) in the length of
// a word, with no rescans: SentencePiece-style tokenizers have no pre-tokenizer, so a whole text
// can be one word.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace qforge {

class MergeTable {
  public:
    struct Merge {
        double priority;  // lower merges first
        int32_t merged;   // id of the merged token
    };
    // A later entry for the same pair replaces an earlier one, as HF's merge map (built by
    // collecting the ranked list into a hash map) does.
    void add(int32_t left, int32_t right, double priority, int32_t merged);
    const Merge* find(int32_t left, int32_t right) const {
        auto it = pairs_.find(key(left, right));
        return it == pairs_.end() ? nullptr : &it->second;
    }
    size_t size() const { return pairs_.size(); }

  private:
    static uint64_t key(int32_t l, int32_t r) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
    }
    std::unordered_map<uint64_t, Merge> pairs_;
};

// Merges the token ids in `symbols` in place.
void bpe_merge(std::vector<int32_t>& symbols, const MergeTable& table);

// The same result by the textbook O(n^2) loop (scan every pair, merge the best, repeat). The
// reference the heap version is tested against.
void bpe_merge_reference(std::vector<int32_t>& symbols, const MergeTable& table);

}  // namespace qforge
