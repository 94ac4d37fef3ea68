// Batched steps: Backend::forward_batch's default, and the CPU backend's batched forward.
//
// The CPU backend runs a step of several sequences as one batch of rows: embedding, norms and
// every product (q/k/v, o, gate/up, down, the output head) take all rows of the step at once, so
// each weight matrix is read once per step whatever the number of sequences; only attention is
// per sequence, each sequence's rows against its own cache, and the whole step's attention takes
// the parallel regions of one sequence's (CpuBackend::attend: RoPE and cache writes per row, then
// tasks of (row, KV head) over every sequence), so the pool is not woken once per sequence.
//
// Why a sequence's logits do not depend on the rest of the batch: every operation outside
// attention computes each row's outputs from that row alone, in an order fixed by the shapes.
// RMSNorm and RoPE loop per token; the float GEMM (kernels/cpu/float_gemm.hpp) gives every
// output the bits of dot_row of its row and token, at any tile of rows and tokens, and the
// decode path (one row: dot_row itself) is the same function; the quantized products
// (kernels/cpu/qdot.hpp) sum each output in an order that depends only on k and the instruction
// level, never on the tile or the number of tokens, and their int8 activations are quantized per
// token and per block of 32 (QActivations::prepare). The split of rows over threads and the
// tiling of rows per block (kQuantTile / n) change who computes an output, not how. Attention
// tasks are (token, KV head) pairs reading their own sequence's cache only. So a row's result is
// the same alone, in prefill, in decode and in any batch; tests/batch_forward_test.cpp checks it
// bit for bit.
#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "runtime/cpu_backend.hpp"

namespace qforge {

void Backend::forward_batch(std::span<const BatchSequence> batch, std::span<float> logits) {
    const uint64_t vocab = model().config().vocab_size;
    uint64_t wanted = 0;
    for (const BatchSequence& s : batch) wanted += s.logit_rows();
    if (logits.size() != wanted * vocab)
        throw Error("forward_batch: logits hold " + std::to_string(logits.size()) +
                    " floats, expected " + std::to_string(wanted * vocab));
    uint64_t row = 0;
    for (const BatchSequence& s : batch) {
        if (!s.cache || s.tokens.empty())
            throw Error("forward_batch: a sequence without a cache or tokens");
        const uint64_t n = s.tokens.size(), rows = s.logit_rows();
        forward(s.tokens, *s.cache, n - rows, logits.subspan(row * vocab, rows * vocab));
        row += rows;
    }
}

void CpuBackend::attention(uint64_t layer, Rows q, Rows k, Rows v, Rows out, uint64_t n) {
    if (!segments_.empty()) return attend(layer, q, k, v, out, segments_);
    const BatchSegment one{0, n, cache_, pos0_};
    attend(layer, q, k, v, out, {&one, 1});
}

void CpuBackend::forward_batch(std::span<const BatchSequence> batch, std::span<float> logits) {
    // Everything is checked before any cache changes.
    uint64_t total = 0, wanted = 0, capacity = 0;
    std::vector<int32_t> tokens;
    std::vector<BatchSegment> segments;
    for (const BatchSequence& s : batch) {
        auto* cache = dynamic_cast<CpuKvCache*>(s.cache);
        if (!cache) throw Error("cpu backend: a batched sequence's KV cache is missing or foreign");
        if (s.tokens.empty()) throw Error("forward_batch: a sequence has no tokens");
        for (const BatchSegment& seen : segments)
            if (seen.cache == cache) throw Error("forward_batch: a KV cache appears twice");
        const uint64_t n = s.tokens.size();
        if (cache->size() + n > cache->capacity())
            throw Error(model_.path(), {},
                        "context is full: " + std::to_string(cache->size()) + " + " +
                            std::to_string(n) + " tokens exceed the context of " +
                            std::to_string(cache->capacity()));
        for (int32_t id : s.tokens)
            if (id < 0 || static_cast<uint64_t>(id) >= c_.vocab_size)
                throw Error(model_.path(), {},
                            "token id " + std::to_string(id) + " is outside the vocabulary (" +
                                std::to_string(c_.vocab_size) + ")");
        segments.push_back({total, n, cache, cache->size()});
        tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
        total += n;
        wanted += s.logit_rows();
        capacity = std::max(capacity, cache->capacity());
    }
    if (total == 0) return;
    if (total > kMaxBatch)
        throw Error("forward_batch: " + std::to_string(total) + " tokens in one step, at most " +
                    std::to_string(kMaxBatch));
    if (logits.size() != wanted * c_.vocab_size)
        throw Error("forward_batch: logits hold " + std::to_string(logits.size()) +
                    " floats, expected " + std::to_string(wanted * c_.vocab_size));

    const BlockActivations a = prepare_step(capacity, total);
    segments_ = std::move(segments);
    try {
        run_model(*this, desc_, c_.num_layers, tokens.data(), total, a, total, {});
    } catch (...) {
        segments_.clear();
        cache_ = nullptr;
        throw;
    }
    // The output head on the rows whose logits are wanted (each sequence's last, or all of
    // them): those rows gathered to the front of x (in order; a row never moves past one still
    // to be read), normed into h.
    uint64_t out = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const uint64_t end = segments_[i].row0 + segments_[i].rows;
        for (uint64_t row = end - batch[i].logit_rows(); row < end; ++row, ++out)
            if (out != row)
                std::copy_n(a.x.data + row * a.x.ld, c_.hidden_size, a.x.data + out * a.x.ld);
    }
    if (wanted > 0) norm(c_.num_layers, Norm::final, a.x, a.h, wanted);
    if (wanted > 0)
        output_head(*this, desc_, c_.num_layers, a.h, wanted, {logits.data(), c_.vocab_size});
    for (const BatchSegment& s : segments_) s.cache->size_ = s.pos0 + s.rows;
    segments_.clear();
    cache_ = nullptr;
}

}  // namespace qforge
