#include "runtime/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "kernels/cpu/float_gemm.hpp"
#include "runtime/paged_kv_cache.hpp"

namespace qforge {

namespace {
// Prefill: outputs per call of the fused kernels (rows x tokens), within the per-thread scratch.
// Float rows take more per call, 512 rows at 128 tokens: each call transposes its rows' weights
// once into the GEMM's panel and passes every token over it (the tokens themselves are packed once
// per product, float_tokens_).
constexpr uint64_t kQuantTile = 4096;
constexpr uint64_t kFloatTile = 65536;

float silu(float v) { return v / (1.0f + std::exp(-v)); }

// Chosen before a parallel region (whose workers must not throw).
float (*activation_fn(Activation act))(float) {
    switch (act) {
        case Activation::silu:
            return silu;
        case Activation::gelu_tanh:
            return gelu_tanh;
    }
    throw Error("cpu backend: unknown activation " + std::to_string(static_cast<int>(act)));
}
}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, ThreadPool& pool,
                                          CpuBackendOptions options) {
    return std::make_unique<CpuBackend>(model, pool, options);
}

CpuBackend::CpuBackend(const Model& model, ThreadPool& pool, CpuBackendOptions options)
    : model_(model),
      c_(model.config()),
      desc_(block_desc(c_)),
      pool_(pool),
      options_(options),
      isa_(options.isa.value_or(cpu_isa())) {
    if (isa_ > cpu_isa())
        throw Error("cpu backend: level " + std::string(isa_name(isa_)) +
                    " requested, this process runs at most " + std::string(isa_name(cpu_isa())));
    row_scratch_.assign(static_cast<size_t>(pool.size()),
                        std::vector<float>(kFloatTile + kMaxBatch));
    score_scratch_.resize(static_cast<size_t>(pool.size()));
    pack_matrices();
}

void CpuBackend::pack_matrices() {
    if (options_.bf16_activations && (isa_ < Isa::avx512 || !bf16_dot_available()))
        throw Error(
            "cpu backend: bf16 activations need the avx512 level and AVX-512 BF16; this "
            "process runs " +
            cpu_isa_description());
    const bool copy_floats = options_.repack && !std::getenv("QFORGE_NO_REPACK");
    const bool quantized = copy_floats && options_.int8_activations;
    auto add = [&](const Matrix& w) {
        if (w.rows == 0) return;
        if (quantized && qmatmul_packed_serves(isa_, w.qtype) && !packed_.count(&w)) {
            QPackedRows p(w.qtype, w.rows, w.cols);
            split(p.tiles(), p.bytes(),
                  [&](uint64_t b, uint64_t e, int) { p.pack(w.data, w.row_bytes(), b, e); });
            packed_.emplace(&w, std::move(p));
        } else if (options_.bf16_activations && w.qtype == QType::bf16 && !bf16_packed_.count(&w)) {
            Bf16PackedRows p(w.rows, w.cols);
            split(p.tiles(), p.tiles() * p.tile_bytes(),
                  [&](uint64_t b, uint64_t e, int) { p.pack(w.data, w.row_bytes(), b, e); });
            bf16_packed_.emplace(&w, std::move(p));
        } else if (copy_floats && !qtype_is_quantized(w.qtype) && !float_rows_.count(&w) &&
                   w.rows * w.row_bytes() >= kHugePageBytes && model_.in_file(w)) {
            AlignedBytes copy = stream_buffer(w.rows * w.row_bytes(), w.name);
            split(w.rows, w.rows * w.row_bytes(), [&](uint64_t b, uint64_t e, int) {
                std::memcpy(copy.get() + b * w.row_bytes(), w.row(b), (e - b) * w.row_bytes());
            });
            float_rows_.emplace(&w, std::move(copy));
        } else {
            return;
        }
        model_.release_pages(w);  // resident once: the packed copy
    };
    for (uint64_t layer = 0; layer < c_.num_layers; ++layer)
        for (int i = 0; i < kBlockLinears; ++i) add(model_.weight(layer, static_cast<Weight>(i)));
    add(model_.lm_head());
}

const QPackedRows* CpuBackend::packed(const Matrix& w) const {
    const auto it = packed_.find(&w);
    return it == packed_.end() ? nullptr : &it->second;
}

const uint8_t* CpuBackend::rows_of(const Matrix& w) const {
    const auto it = float_rows_.find(&w);
    return it == float_rows_.end() ? w.data : it->second.get();
}

const Bf16PackedRows* CpuBackend::bf16_packed(const Matrix& w) const {
    const auto it = bf16_packed_.find(&w);
    return it == bf16_packed_.end() ? nullptr : &it->second;
}

std::unique_ptr<KvCache> CpuBackend::new_cache(uint64_t capacity) const {
    if (capacity == 0 || capacity > c_.max_position_embeddings)
        throw Error(model_.path(), {},
                    "a context of " + std::to_string(capacity) +
                        " positions is outside 1 .. max_position_embeddings (" +
                        std::to_string(c_.max_position_embeddings) + ")");
    return std::make_unique<CpuKvCache>(c_, capacity, options_.kv_type);
}

namespace {
class CpuKvPool final : public KvPool {
  public:
    CpuKvPool(const ModelConfig& c, uint64_t blocks, KvType type)
        : max_positions_(c.max_position_embeddings), pool_(c, blocks, type) {}
    std::unique_ptr<KvCache> take(uint64_t positions) override {
        if (positions == 0 || positions > max_positions_)
            throw Error("KV block pool: a cache of " + std::to_string(positions) +
                        " positions is outside 1 .. max_position_embeddings (" +
                        std::to_string(max_positions_) + ")");
        auto cache = std::make_unique<PagedKvCache>(pool_, positions);
        if (!cache->reserve(positions)) return nullptr;
        return cache;
    }
    bool extend(KvCache& cache, uint64_t positions) override {
        auto* paged = dynamic_cast<PagedKvCache*>(&cache);  // take()'s bound on positions too
        return paged && positions <= max_positions_ && paged->extend(positions);
    }
    std::unique_ptr<KvCache> share(const KvCache& from, uint64_t positions,
                                   uint64_t limit) override {
        return share_paged(pool_, from, positions, std::min(limit, max_positions_));
    }
    bool shared_from(const KvCache& cache, uint64_t position) const override {
        const auto* paged = dynamic_cast<const PagedKvCache*>(&cache);
        return paged && paged->shared_from(position);
    }
    uint64_t free_blocks() const override { return pool_.free_blocks(); }
    uint64_t total_blocks() const override { return pool_.total_blocks(); }

  private:
    uint64_t max_positions_;
    KvBlockPool pool_;
};
}  // namespace

std::unique_ptr<KvPool> CpuBackend::new_kv_pool(uint64_t blocks) const {
    return std::make_unique<CpuKvPool>(c_, blocks, options_.kv_type);
}

template <class F>
void CpuBackend::split(uint64_t n, uint64_t work, F&& fn, uint64_t grain, size_t parts_per_thread) {
    if (work < options_.min_parallel_work || pool_.size() == 1) {
        fn(uint64_t{0}, n, 0);
        return;
    }
    // Parts claimed as threads come free (ThreadPool::run_chunks), each a whole number of `grain`
    // items but the last: outputs never depend on which thread computes them, so neither do the
    // results.
    const uint64_t units = (n + grain - 1) / grain;
    const size_t chunks =
        std::min<size_t>(units, static_cast<size_t>(pool_.size()) * parts_per_thread);
    pool_.run_chunks(chunks, [&](size_t chunk, int thread) {
        auto [b, e] = split_range(units, chunks, chunk);
        b = std::min<uint64_t>(n, b * grain);
        e = std::min<uint64_t>(n, e * grain);
        if (b < e) fn(uint64_t{b}, uint64_t{e}, thread);
    });
}

template <class F>
void CpuBackend::for_tokens(uint64_t n, F&& fn) {
    // Per-token work (RMSNorm, RoPE) is a few operations per hidden element.
    split(n, 4 * n * c_.hidden_size, [&](uint64_t b, uint64_t e, int) {
        for (uint64_t t = b; t < e; ++t) fn(t);
    });
}

void CpuBackend::forward(std::span<const int32_t> tokens, KvCache& cache, uint64_t logits_from,
                         std::span<float> logits) {
    auto* cpu_cache = dynamic_cast<CpuKvCache*>(&cache);
    if (!cpu_cache) throw Error("cpu backend: the KV cache was made by another backend");
    const uint64_t n = tokens.size();
    if (logits_from > n) throw Error("forward: logits_from is past the last token");
    if (logits.size() != (n - logits_from) * c_.vocab_size)
        throw Error("forward: logits hold " + std::to_string(logits.size()) + " floats, expected " +
                    std::to_string((n - logits_from) * c_.vocab_size));
    if (cache.size() + n > cache.capacity())
        throw Error(model_.path(), {},
                    "context is full: " + std::to_string(cache.size()) + " + " + std::to_string(n) +
                        " tokens exceed the context of " + std::to_string(cache.capacity()));
    for (int32_t id : tokens)
        if (id < 0 || static_cast<uint64_t>(id) >= c_.vocab_size)
            throw Error(model_.path(), {},
                        "token id " + std::to_string(id) + " is outside the vocabulary (" +
                            std::to_string(c_.vocab_size) + ")");

    const BlockActivations a = prepare_step(cache.capacity(), std::min(n, kMaxBatch));
    cache_ = cpu_cache;
    for (uint64_t start = 0; start < n; start += kMaxBatch) {
        const uint64_t m = std::min(kMaxBatch, n - start);
        // Logits rows of this step: tokens [max(start, logits_from), start + m).
        const uint64_t first = std::max(start, logits_from);
        float* out =
            first < start + m ? logits.data() + (first - logits_from) * c_.vocab_size : nullptr;
        pos0_ = cache.size();
        run_model(*this, desc_, c_.num_layers, tokens.data() + start, m, a,
                  first < start + m ? first - start : m, {out, c_.vocab_size});
        cpu_cache->size_ = pos0_ + m;
    }
    cache_ = nullptr;
}

BlockActivations CpuBackend::prepare_step(uint64_t capacity, uint64_t batch) {
    if (rope_positions_ < capacity) {
        rope_ = RopeTable(c_, capacity);
        if (c_.rope_local_theta > 0.0) rope_local_ = RopeTable(c_, capacity, true);
        rope_positions_ = capacity;
    }
    const uint64_t group = c_.num_heads / c_.num_kv_heads;
    for (auto& s : score_scratch_)
        if (s.size() < group * capacity) s.resize(group * capacity);
    if (x_.size() < batch * c_.hidden_size) {
        x_.resize(batch * c_.hidden_size);
        h_.resize(batch * c_.hidden_size);
        qkv_.resize(batch * (c_.q_dim() + 2 * c_.kv_dim()));
        att_.resize(batch * c_.q_dim());
        gate_.resize(batch * c_.intermediate_size);
        up_.resize(batch * c_.intermediate_size);
    }
    const uint64_t qd = c_.q_dim(), kvd = c_.kv_dim(), qkv_ld = qd + 2 * kvd;
    return {{x_.data(), c_.hidden_size},
            {h_.data(), c_.hidden_size},
            {qkv_.data(), qkv_ld},
            {qkv_.data() + qd, qkv_ld},
            {qkv_.data() + qd + kvd, qkv_ld},
            {att_.data(), qd},
            {gate_.data(), c_.intermediate_size}};
}

namespace {
// Host rows: the CPU backend's op-level step (backend.hpp).
class CpuOpsStep final : public OpsStep {
  public:
    CpuOpsStep(ForwardOps& ops, const BlockActivations& rows, Rows logits, const int32_t* tokens)
        : ops_(ops), rows_(rows), logits_(logits), tokens_(tokens) {}
    ForwardOps& ops() override { return ops_; }
    const BlockActivations& rows() const override { return rows_; }
    Rows logits() const override { return logits_; }
    const int32_t* tokens() const override { return tokens_; }
    void write(Rows dst, const float* src, uint64_t n, uint64_t width) override {
        for (uint64_t t = 0; t < n; ++t)
            std::copy(src + t * width, src + (t + 1) * width, dst.data + t * dst.ld);
    }
    void read(Rows src, float* dst, uint64_t n, uint64_t width) override {
        for (uint64_t t = 0; t < n; ++t)
            std::copy(src.data + t * src.ld, src.data + t * src.ld + width, dst + t * width);
    }

  private:
    ForwardOps& ops_;
    BlockActivations rows_;
    Rows logits_;
    const int32_t* tokens_;
};
}  // namespace

void CpuBackend::run_ops(std::span<const int32_t> tokens, KvCache& cache,
                         const std::function<void(OpsStep&)>& fn) {
    auto* cpu_cache = dynamic_cast<CpuKvCache*>(&cache);
    if (!cpu_cache) throw Error("cpu backend: the KV cache was made by another backend");
    const uint64_t n = tokens.size();
    if (n > kMaxBatch || cache.size() + n > cache.capacity())
        throw Error("cpu backend: run_ops takes one step of at most " + std::to_string(kMaxBatch) +
                    " tokens that fits the cache");
    for (int32_t id : tokens)
        if (id < 0 || static_cast<uint64_t>(id) >= c_.vocab_size)
            throw Error("cpu backend: token id " + std::to_string(id) +
                        " is outside the vocabulary");
    const BlockActivations a = prepare_step(cache.capacity(), n);
    std::vector<float> logits(n * c_.vocab_size);
    CpuOpsStep step(*this, a, {logits.data(), c_.vocab_size}, tokens.data());
    cache_ = cpu_cache;
    pos0_ = cache.size();
    try {
        fn(step);
    } catch (...) {
        cache_ = nullptr;
        throw;
    }
    cache_ = nullptr;
    cpu_cache->size_ = pos0_ + n;
}

void CpuBackend::rows_times_tokens(const Matrix& w, uint64_t r0, uint64_t r1, const float* x,
                                   uint64_t n, float* y, uint64_t ldy, const float* bias,
                                   bool accumulate, float* scratch) {
    const uint64_t cols = w.cols;
    auto store = [&](float* dst, uint64_t r, float v) {
        if (bias) v += bias[r];
        if (accumulate)
            *dst += v;
        else
            *dst = v;
    };
    const Bf16PackedRows* bf16 = bf16_packed(w);
    if (n == 1 && !qtype_is_quantized(w.qtype) && !bf16) {  // decode: each row once
        for (uint64_t rb = r0; rb < r1; rb += kFloatTile) {
            const uint64_t re = std::min(r1, rb + kFloatTile);
            dot_rows(isa_, w.qtype, rows_of(w), w.row_bytes(), rb, re, x, cols, scratch);
            for (uint64_t r = rb; r < re; ++r) store(y + r, r, scratch[r - rb]);
        }
        return;
    }
    // Blocks of rows x tokens through the fused kernel (float rows: the float GEMM, whose outputs
    // are dot_row's bits) into scratch, then stored.
    const uint64_t tile = qtype_is_quantized(w.qtype) ? kQuantTile : kFloatTile;
    uint64_t rows_per_block = std::max<uint64_t>(1, tile / std::max<uint64_t>(n, 1));
    if (rows_per_block > kQmatmulRowGrain) rows_per_block -= rows_per_block % kQmatmulRowGrain;
    const QPackedRows* p = packed(w);
    if (p && !bias && !accumulate) {  // straight into y: no pass through scratch
        // Whole 32-row pairs: the packed kernels compute 32 rows at a time, so a block of fewer
        // (over 128 tokens, kQuantTile / n < 32) computed its pair again for each block.
        const uint64_t rows = std::max(rows_per_block, kQmatmulRowGrain);
        for (uint64_t rb = r0; rb < r1; rb += rows)
            qmatmul_packed_isa(isa_, *p, rb, std::min(r1, rb + rows), acts_, 0, n, y + rb, ldy);
        return;
    }
    for (uint64_t rb = r0; rb < r1; rb += rows_per_block) {
        const uint64_t re = std::min(r1, rb + rows_per_block);
        if (p)
            qmatmul_packed_isa(isa_, *p, rb, re, acts_, 0, n, scratch, re - rb);
        else if (bf16)  // decode too: one token is a 1-token tile, the same bits
            bf16_matmul(*bf16, rb, re, bf16_tokens_, 0, n, scratch, re - rb);
        else if (qtype_is_quantized(w.qtype))
            qmatmul_isa(isa_, w.qtype, w.data, w.row_bytes(), rb, re, acts_, 0, n, scratch,
                        re - rb);
        else
            float_matmul_prepared(w.qtype, rows_of(w), w.row_bytes(), rb, re, float_tokens_, 0, n,
                                  scratch, re - rb);
        for (uint64_t t = 0; t < n; ++t)
            for (uint64_t r = rb; r < re; ++r)
                store(y + t * ldy + r, r, scratch[t * (re - rb) + (r - rb)]);
    }
}

void CpuBackend::prepare_activations(std::span<const Matrix* const> matrices, const float* x,
                                     uint64_t n) {
    bool quantized = false, floats = false, bf16 = false;
    for (const Matrix* m : matrices)
        if (bf16_packed(*m)) {
            if (!bf16) bf16_tokens_.prepare(x, n, m->cols);
            bf16 = true;
        } else if (qtype_is_quantized(m->qtype)) {
            if (!quantized) {  // per token: several are split over the threads
                acts_.resize(
                    options_.int8_activations ? QActivations::Mode::int8 : QActivations::Mode::f32,
                    n, m->cols);
                // Whole groups of tile tokens where the AMX layout is kept (threads writing
                // tokens of one group would share its cache lines).
                const uint64_t unit = acts_.has_tiles() ? QActivations::kTileTokens : 1;
                if (n <= unit)
                    acts_.prepare_tokens(x, 0, n);
                else
                    split((n + unit - 1) / unit, 8 * n * m->cols, [&](uint64_t b, uint64_t e, int) {
                        acts_.prepare_tokens(x, b * unit, std::min(n, e * unit));
                    });
            }
            quantized = true;
        } else {
            if (!floats && n > 1)  // decode reads x in place (dot_rows)
                float_tokens_.prepare(isa_, x, m->cols, m->cols, n);
            floats = true;
        }
}

void CpuBackend::own_product(const Matrix& w, const float* x, uint64_t n, float* y, uint64_t ldy,
                             const float* bias, bool accumulate) {
    const uint64_t cols = w.cols;
    if (w.col_perm) {
        gathered_.resize(n * cols);
        for (uint64_t t = 0; t < n; ++t)
            for (uint64_t j = 0; j < cols; ++j)
                gathered_[t * cols + j] = x[t * cols + w.col_perm[j]];
        x = gathered_.data();
    }
    const Matrix* one[] = {&w};
    prepare_activations(one, x, n);
    split(
        w.rows, w.rows * cols * n,
        [&](uint64_t b, uint64_t e, int thread) {
            rows_times_tokens(w, b, e, x, n, y, ldy, bias, accumulate,
                              row_scratch_[static_cast<size_t>(thread)].data());
        },
        kQmatmulRowGrain);
}

void CpuBackend::products(uint64_t layer, Rows in, std::span<const Product> parts, uint64_t n) {
    // A part with a column permutation has an input of its own: each part is then its own
    // product (act-order imports only; every other model keeps the fused path below).
    bool permuted = false;
    for (const auto& p : parts) permuted |= model_.weight(layer, p.weight).col_perm != nullptr;
    if (permuted) {
        for (const auto& p : parts)
            own_product(model_.weight(layer, p.weight), in.data, n, p.out.data, p.out.ld,
                        p.bias ? model_.bias(layer, p.weight).data() : nullptr, p.accumulate);
        return;
    }
    const Matrix* matrices[3] = {};  // fused products have at most three parts
    for (size_t i = 0; i < parts.size() && i < 3; ++i)
        matrices[i] = &model_.weight(layer, parts[i].weight);
    prepare_activations({matrices, std::min<size_t>(parts.size(), 3)}, in.data, n);  // one input
    uint64_t total = 0, work = 0;
    for (const auto& p : parts) {
        const Matrix& w = model_.weight(layer, p.weight);
        total += w.rows;
        work += w.rows * w.cols * n;
    }
    split(
        total, work,
        [&](uint64_t b, uint64_t e, int thread) {
            uint64_t base = 0;
            for (const auto& p : parts) {
                const Matrix& w = model_.weight(layer, p.weight);
                const uint64_t lo = std::max<uint64_t>(b, base),
                               hi = std::min<uint64_t>(e, base + w.rows);
                const float* bias = p.bias ? model_.bias(layer, p.weight).data() : nullptr;
                if (lo < hi)
                    rows_times_tokens(w, lo - base, hi - base, in.data, n, p.out.data, p.out.ld,
                                      bias, p.accumulate,
                                      row_scratch_[static_cast<size_t>(thread)].data());
                base += w.rows;
            }
        },
        kQmatmulRowGrain);
}

void CpuBackend::embed(const int32_t* tokens, uint64_t n, Rows out) {
    const Matrix& e = model_.embed();
    for (uint64_t t = 0; t < n; ++t)
        row_to_f32(e.qtype, rows_of(e) + static_cast<uint64_t>(tokens[t]) * e.row_bytes(),
                   out.data + t * out.ld, e.cols);
}

void CpuBackend::norm(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) {
    rms_norm(layer, which, in, out, n, false);
}

void CpuBackend::norm_add(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) {
    rms_norm(layer, which, in, out, n, true);
}

void CpuBackend::scale(Rows rows, uint64_t n, uint64_t width, float s) {
    for (uint64_t t = 0; t < n; ++t)
        for (uint64_t i = 0; i < width; ++i) rows.data[t * rows.ld + i] *= s;
}

void CpuBackend::softcap(Rows rows, uint64_t n, uint64_t width, float cap) {
    for (uint64_t t = 0; t < n; ++t)
        for (uint64_t i = 0; i < width; ++i) {
            float& v = rows.data[t * rows.ld + i];
            v = std::tanh(v / cap) * cap;
        }
}

void CpuBackend::rms_norm(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n,
                          bool accumulate) {
    const std::vector<float>& weight = model_.norm(layer, which);
    // Named, not a structured binding: the lambda below captures them, which clang 14 (Debian
    // 12's) refuses for bindings.
    const NormShape shape = norm_shape(c_, which);
    const uint64_t d = shape.width, groups = shape.groups;
    const double eps = c_.rms_norm_eps;
    for_tokens(n, [&](uint64_t t) {
        for (uint64_t g = 0; g < groups; ++g)
            rms_norm_row(in.data + t * in.ld + g * d, weight.data(), d, eps,
                         out.data + t * out.ld + g * d, accumulate);
    });
}

void CpuBackend::attend(uint64_t layer, Rows q, Rows k, Rows v, Rows out,
                        std::span<const BatchSegment> segments) {
    if (segments.empty()) return;
    const uint64_t hd = c_.head_dim, half = hd / 2;
    const uint64_t group = c_.num_heads / c_.num_kv_heads;
    const RopeTable& rope = c_.local_rope(layer) ? rope_local_ : rope_;
    const uint64_t n = segments.back().row0 + segments.back().rows;
    // The segment holding step row `t` (segments are in row order, each starting where the last
    // ends).
    auto segment_of = [&](uint64_t t) -> const BatchSegment& {
        return *(
            std::upper_bound(segments.begin(), segments.end(), t,
                             [](uint64_t row, const BatchSegment& s) { return row < s.row0; }) -
            1);
    };
    // RoPE on the new tokens' queries and keys; their keys and values into their caches.
    for_tokens(n, [&](uint64_t t) {
        const BatchSegment& s = segment_of(t);
        const uint64_t pos = s.pos0 + (t - s.row0);
        const float* cs = rope.cos.data() + pos * half;
        const float* sn = rope.sin.data() + pos * half;
        float* qt = q.data + t * q.ld;
        float* kt = k.data + t * k.ld;
        for (uint64_t h = 0; h < c_.num_heads; ++h) rope_rotate(qt + h * hd, cs, sn, half);
        for (uint64_t h = 0; h < c_.num_kv_heads; ++h) rope_rotate(kt + h * hd, cs, sn, half);
        if (const uint64_t c = s.cache->store(layer, pos, kt, v.data + t * v.ld))
            fp16_saturations_.fetch_add(c, std::memory_order_relaxed);
    });
    const float scale = desc_.query_scale, cap = desc_.attn_softcap;
    const uint64_t window = c_.attention_window(layer);
    // One task: the `group` query heads of one token that share a key/value head, so each cached
    // key and value row is read once for all of them. A task reads its own sequence's cache only
    // and computes the same way whichever thread runs it and whatever else is in the step.
    // A task's row, KV head, cache and its causal keys first .. pos (the last `window` of them
    // in a windowed layer).
    struct Task {
        uint64_t row = 0, kvh = 0, first = 0, len = 0;
        const CpuKvCache* cache = nullptr;
    };
    auto task_of = [&](uint64_t task) {
        const uint64_t row = task / c_.num_kv_heads;
        const BatchSegment& s = segment_of(row);
        const uint64_t pos = s.pos0 + (row - s.row0);
        const uint64_t first = window && pos + 1 > window ? pos + 1 - window : 0;
        return Task{row, task % c_.num_kv_heads, first, pos + 1 - first, s.cache};
    };
    // One task's products; `next` (if any) is the task its thread runs after it. Each call
    // prefetches what the one after it reads: a run's scores the next run's keys (the last
    // run's, the first run's values), a run's mix the next run's values (the last run's, the
    // next task's first keys). The cache's runs lie in separate blocks, where the hardware
    // prefetcher starts over: from DRAM this reads 1.2-1.4x faster than prefetching each run's
    // values during its scores (kernels bench attention/*/dram, 512-2048 positions).
    auto one = [&](const Task& task, const Task* next, float* scores) {
        const uint64_t row = task.row, kvh = task.kvh, first = task.first, len = task.len;
        const CpuKvCache* cache = task.cache;  // named: run_at captures them (as rms_norm's)
        const float* qh = q.data + row * q.ld + kvh * group * hd;
        // The stored keys (which = 0) or values (1) of the run that starts at position first + j.
        auto run_at = [&](uint64_t which, uint64_t j) {
            return cache->stored(layer, which, kvh, first + j,
                                 std::min(len - j, CpuKvCache::run_from(first + j)));
        };
        // Runs of positions that lie together in the cache (kernels/cpu/attention.hpp: each
        // score and output element is computed the same way whatever the runs are).
        // The cache's own rows, f32 or f16 (widened in the kernels' registers: the same bits).
        const bool halves = cache->type() == KvType::f16;
        for (uint64_t j = 0, run; j < len; j += run) {
            run = std::min(len - j, CpuKvCache::run_from(first + j));
            const Ahead ahead = j + run < len ? run_at(0, j + run) : run_at(1, 0);
            const void* keys = cache->stored(layer, 0, kvh, first + j, run).at;
            if (halves)
                head_scores(isa_, qh, group, hd, static_cast<const uint16_t*>(keys), hd, run, scale,
                            scores + j, len, ahead);
            else
                head_scores(isa_, qh, group, hd, static_cast<const float*>(keys), hd, run, scale,
                            scores + j, len, ahead);
        }
        if (cap > 0.0f)
            for (uint64_t j = 0; j < group * len; ++j) scores[j] = std::tanh(scores[j] / cap) * cap;
        float* o = out.data + row * out.ld + kvh * group * hd;
        std::fill(o, o + group * hd, 0.0f);
        for (uint64_t g = 0; g < group; ++g) softmax(isa_, scores + g * len, len);
        const Ahead keys_next =
            next ? next->cache->stored(layer, 0, next->kvh, next->first,
                                       std::min(next->len, CpuKvCache::run_from(next->first)))
                 : Ahead{};
        for (uint64_t j = 0, run; j < len; j += run) {
            run = std::min(len - j, CpuKvCache::run_from(first + j));
            const Ahead ahead = j + run < len ? run_at(1, j + run) : keys_next;
            const void* values = cache->stored(layer, 1, kvh, first + j, run).at;
            if (halves)
                head_mix(isa_, scores + j, len, group, hd, static_cast<const uint16_t*>(values), hd,
                         run, o, ahead);
            else
                head_mix(isa_, scores + j, len, group, hd, static_cast<const float*>(values), hd,
                         run, o, ahead);
        }
    };
    uint64_t work = 0;
    for (const BatchSegment& s : segments)
        work += s.rows * c_.num_heads * (s.pos0 + s.rows) * hd * 2;
    split(
        n * c_.num_kv_heads, work,
        [&](uint64_t b, uint64_t e, int thread) {
            // Each task found once: it is the previous one's `next`.
            for (Task task = task_of(b), next; b < e; ++b, task = next) {
                if (b + 1 < e) next = task_of(b + 1);
                one(task, b + 1 < e ? &next : nullptr,
                    score_scratch_[static_cast<size_t>(thread)].data());
            }
        },
        1, kAttentionPartsPerThread);
}

void CpuBackend::gated_products(uint64_t layer, Rows in, Activation act, Rows out, uint64_t n) {
    const Matrix& gate = model_.weight(layer, Weight::gate);
    const Matrix& up = model_.weight(layer, Weight::up);
    const uint64_t inter = gate.rows;
    float (*const activation)(float) = activation_fn(act);
    if (gate.col_perm || up.col_perm) {  // act-order imports: each product gathers its input
        own_product(gate, in.data, n, out.data, out.ld, nullptr, false);
        own_product(up, in.data, n, up_.data(), inter, nullptr, false);
        for (uint64_t t = 0; t < n; ++t)
            for (uint64_t r = 0; r < inter; ++r)
                out.data[t * out.ld + r] =
                    activation(out.data[t * out.ld + r]) * up_[t * inter + r];
        return;
    }
    const Matrix* both[] = {&gate, &up};
    prepare_activations(both, in.data, n);
    split(
        inter, 2 * inter * gate.cols * n,
        [&](uint64_t b, uint64_t e, int thread) {
            float* scratch = row_scratch_[static_cast<size_t>(thread)].data();
            rows_times_tokens(gate, b, e, in.data, n, out.data, out.ld, nullptr, false, scratch);
            rows_times_tokens(up, b, e, in.data, n, up_.data(), inter, nullptr, false, scratch);
            for (uint64_t t = 0; t < n; ++t) {
                float* o = out.data + t * out.ld;
                if (act ==
                    Activation::silu) {  // the vector kernel: 8% of a SmolLM2 prefill was expf
                    silu_mul(isa_, o + b, up_.data() + t * inter + b, o + b, e - b);
                    continue;
                }
                for (uint64_t r = b; r < e; ++r) o[r] = activation(o[r]) * up_[t * inter + r];
            }
        },
        kQmatmulRowGrain);
}

}  // namespace qforge
