#include "quant/block_forward.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "kernels/cpu/qdot.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

namespace {

const char* weight_name(Weight w) {
    static const char* const names[] = {"q", "k", "v", "o", "gate", "up", "down", "lm_head"};
    return names[static_cast<size_t>(w)];
}

void require_dense(Rows r, uint64_t width, const char* what) {
    if (r.ld != width)
        throw Error(std::string("calibration forward: ") + what + " rows are " +
                    std::to_string(r.ld) + " apart, expected dense rows of " +
                    std::to_string(width));
}

// A block's scores (rows x len: queries at positions p0.., keys k0..) into attention weights:
// each row's seen keys [first, pos] (at [first - k0, pos - k0]) scaled, soft-capped where cap > 0,
// and through the runtime's softmax (activation.hpp); the keys it may not see 0.
void attention_weights(float* p, uint64_t p0, uint64_t rows, uint64_t k0, uint64_t len,
                       uint64_t window, float scale, float cap, Isa isa) {
    for (uint64_t r = 0; r < rows; ++r) {
        const uint64_t pos = p0 + r;
        const uint64_t first = window && pos + 1 > window ? pos + 1 - window : 0;
        float* pr = p + r * len;
        const uint64_t lo = first - k0, hi = pos - k0 + 1;
        for (uint64_t j = lo; j < hi; ++j) pr[j] *= scale;
        if (cap > 0.0f)
            for (uint64_t j = lo; j < hi; ++j) pr[j] = std::tanh(pr[j] / cap) * cap;
        softmax(isa, pr + lo, hi - lo);
        std::fill(pr, pr + lo, 0.0f);
        std::fill(pr + hi, pr + len, 0.0f);
    }
}

}  // namespace

BlockView layer_view(const Model& model, uint64_t layer) {
    BlockView v;
    for (int w = 0; w <= kBlockLinears; ++w)
        v.linear[static_cast<size_t>(w)] = model.weight(layer, Weight(w));
    for (int n = 0; n < kNorms; ++n) v.norm[static_cast<size_t>(n)] = &model.norm(layer, Norm(n));
    for (int b = 0; b < 3; ++b) v.qkv_bias[static_cast<size_t>(b)] = &model.bias(layer, Weight(b));
    return v;
}

Matrix f32_matrix(std::string name, const std::vector<float>& w, uint64_t rows, uint64_t cols) {
    if (w.size() != rows * cols)
        throw Error(name, {},
                    "float copy holds " + std::to_string(w.size()) + " values, expected " +
                        std::to_string(rows) + " x " + std::to_string(cols));
    return Matrix{std::move(name), QType::f32, reinterpret_cast<const uint8_t*>(w.data()), rows,
                  cols};
}

BlockForward::BlockForward(const ModelConfig& config, uint64_t sequences, uint64_t seq_len,
                           ThreadPool& pool, CalibProducts products)
    : c_(config),
      desc_(block_desc(config)),
      sequences_(sequences),
      seq_len_(seq_len),
      pool_(pool),
      products_(products),
      rope_(config, seq_len) {
    if (products == CalibProducts::bf16 && !bf16_dot_available())
        throw Error(
            "calibration: bf16 products need the avx512 level and AVX-512 BF16; this "
            "process runs " +
            cpu_isa_description());
    if (config.rope_local_theta > 0.0) rope_local_ = RopeTable(config, seq_len, true);
    if (sequences == 0 || seq_len == 0)
        throw Error("calibration: the batch needs at least one sequence of one token");
}

BlockActivations BlockForward::activations(float* x, Buffers& b) const {
    const uint64_t n = tokens(), d = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim();
    const uint64_t inter = c_.intermediate_size;
    b.h.resize(n * d);
    b.qkv_mlp.resize(n * std::max(qd + 2 * kvd, inter));
    float* qkv = b.qkv_mlp.data();
    return {{x, d},    {b.h.data(), d}, {qkv, qd}, {qkv + n * qd, kvd}, {qkv + n * (qd + kvd), kvd},
            {qkv, qd}, {qkv, inter}};
}

const Matrix& BlockForward::weight(Weight w) const {
    const Matrix& m = view[w];
    if (m.rows == 0 || !m.data)
        throw Error(std::string("calibration forward: weight ") + weight_name(w) + " is not set");
    return m;
}

void BlockForward::rms_norm(const float* x, const std::vector<float>& weight, float* out,
                            uint64_t n, NormShape shape, bool accumulate) const {
    const uint64_t d = shape.width;  // named: the lambda captures it (clang 14: no bindings)
    const double eps = c_.rms_norm_eps;
    pool_.parallel_for(n * shape.groups, [&](size_t b, size_t e) {
        for (size_t t = b; t < e; ++t)
            rms_norm_row(x + t * d, weight.data(), d, eps, out + t * d, accumulate);
    });
}

void BlockForward::apply_norm(Norm which, Rows in, Rows out, uint64_t n, bool accumulate) {
    if (hook) hook->before_norm(which, in, n);
    const std::vector<float>* w = view.norm[static_cast<size_t>(which)];
    if (!w || w->empty()) throw Error("calibration forward: a norm weight is not set");
    const NormShape shape = norm_shape(c_, which);
    require_dense(in, shape.width * shape.groups, "norm input");
    require_dense(out, shape.width * shape.groups, "norm output");
    rms_norm(in.data, *w, out.data, n, shape, accumulate);
}

void BlockForward::norm(uint64_t, Norm which, Rows in, Rows out, uint64_t n) {
    apply_norm(which, in, out, n, false);
}

void BlockForward::norm_add(uint64_t, Norm which, Rows in, Rows out, uint64_t n) {
    apply_norm(which, in, out, n, true);
}

BlockForward::Prepared BlockForward::prepare(const Matrix& w) const {
    Prepared p;
    p.rows = w.rows;
    p.cols = w.cols;
    if (w.qtype == QType::f32) {
        p.f32 = reinterpret_cast<const float*>(w.data);
    } else {
        p.owned.resize(w.rows * w.cols);
        pool_.parallel_for(w.rows, [&](size_t b, size_t e) {
            for (size_t r = b; r < e; ++r)
                row_to_f32(w.qtype, w.row(r), p.owned.data() + r * w.cols, w.cols);
        });
        p.f32 = p.owned.data();
    }
    if (products_ == CalibProducts::bf16) {
        p.bf16 = Bf16PackedRows(w.rows, w.cols);
        pool_.parallel_for(p.bf16.tiles(),
                           [&](size_t b, size_t e) { p.bf16.pack_f32(p.f32, w.cols, b, e); });
        p.owned = {};
        p.f32 = nullptr;
    }
    return p;
}

void BlockForward::apply(std::span<const Prepared> ws, const float* x, uint64_t n,
                         std::span<float* const> ys) const {
    const uint64_t cols = ws.front().cols;
    const uint64_t token_panels = (n + kPanelTokens - 1) / kPanelTokens;
    if (products_ == CalibProducts::bf16) {
        // Per panel of kPanelTokens tokens: its inputs rounded once, then every row of every
        // matrix; each output's chain depends on k alone (kernels/cpu/bf16_gemm.hpp), so panels
        // go to whichever thread comes free.
        pool_.run_chunks(token_panels, [&](size_t p, int) {
            thread_local Bf16Tokens tokens;
            const uint64_t t0 = p * kPanelTokens, nt = std::min(kPanelTokens, n - t0);
            tokens.resize(nt, cols);
            tokens.fill(x + t0 * cols, 0, nt);
            for (size_t i = 0; i < ws.size(); ++i)
                bf16_matmul(ws[i].bf16, 0, ws[i].rows, tokens, 0, nt, ys[i] + t0 * ws[i].rows,
                            ws[i].rows);
        });
        return;
    }
    // y[n][rows] = x[n][cols] * W[rows][cols]^T, in fixed panels of kPanelRows weight rows x
    // kPanelTokens tokens spread over the pool, each one single-threaded sgemm: every output's
    // summation depends only on the shapes, never on the thread count (quant/hessian.hpp's
    // BlasSingleThread must be alive).
    for (size_t i = 0; i < ws.size(); ++i) {
        const Prepared& w = ws[i];
        const uint64_t rows = w.rows;
        float* y = ys[i];
        const uint64_t row_panels = (rows + kPanelRows - 1) / kPanelRows;
        pool_.parallel_for(row_panels * token_panels, [&](size_t b, size_t e) {
            for (size_t p = b; p < e; ++p) {
                const uint64_t r0 = (p % row_panels) * kPanelRows,
                               t0 = (p / row_panels) * kPanelTokens;
                const uint64_t nr = std::min(kPanelRows, rows - r0),
                               nt = std::min(kPanelTokens, n - t0);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nt),
                            static_cast<int>(nr), static_cast<int>(cols), 1.0f, x + t0 * cols,
                            static_cast<int>(cols), w.f32 + r0 * cols, static_cast<int>(cols), 0.0f,
                            y + t0 * rows + r0, static_cast<int>(rows));
            }
        });
    }
}

void BlockForward::linear(const Matrix& w, const float* x, uint64_t n, float* y) const {
    const Prepared p[1] = {prepare(w)};
    float* const out[1] = {y};
    apply(p, x, n, out);
}

void BlockForward::products(uint64_t, Rows in, std::span<const Product> parts, uint64_t n) {
    if (parts.empty()) return;
    if (hook) hook->before_products(parts.front().weight, in, n);
    // The products of the shared input in one pass (bf16: its rounding once for all of them);
    // a product added to its output goes through sum_ first.
    std::vector<Prepared> ws;
    std::vector<float*> ys;
    ws.reserve(parts.size());
    bool summed = false;
    for (const Product& p : parts) {
        const Matrix& w = weight(p.weight);
        require_dense(in, w.cols, "product input");
        require_dense(p.out, w.rows, "product output");
        ws.push_back(prepare(w));
        ys.push_back(p.out.data);
        if (p.accumulate) {
            if (summed)
                throw Error("calibration forward: two products of one input add to outputs");
            summed = true;
            sum_.resize(n * w.rows);
            ys.back() = sum_.data();
        }
    }
    apply(ws, in.data, n, ys);
    for (size_t i = 0; i < parts.size(); ++i) {
        const Product& p = parts[i];
        const uint64_t rows = ws[i].rows;
        float* y = ys[i];
        const size_t bi = static_cast<size_t>(p.weight);
        const std::vector<float>* bias = bi < 3 ? view.qkv_bias[bi] : nullptr;
        const float* b = p.bias && bias && !bias->empty() ? bias->data() : nullptr;
        if (!b && !p.accumulate) continue;
        pool_.parallel_for(n, [&](size_t t0, size_t t1) {
            for (uint64_t t = t0; t < t1; ++t) {
                float* yt = y + t * rows;
                if (b)
                    for (uint64_t r = 0; r < rows; ++r) yt[r] += b[r];
                if (p.accumulate)  // y is sum_
                    for (uint64_t r = 0; r < rows; ++r) p.out.data[t * rows + r] += yt[r];
            }
        });
    }
}

void BlockForward::attention(uint64_t layer, Rows q_rows, Rows k_rows, Rows v_rows, Rows out_rows,
                             uint64_t n) {
    const uint64_t hd = c_.head_dim, qd = c_.q_dim(), kvd = c_.kv_dim(), half = hd / 2;
    if (n != tokens())
        throw Error("calibration forward: attention runs on the whole batch of " +
                    std::to_string(tokens()) + " tokens, not " + std::to_string(n));
    require_dense(q_rows, qd, "query");
    require_dense(k_rows, kvd, "key");
    require_dense(v_rows, kvd, "value");
    require_dense(out_rows, qd, "attention output");
    float *q = q_rows.data, *k = k_rows.data, *out = out_rows.data;
    const float* v = v_rows.data;
    const uint64_t group = c_.num_heads / c_.num_kv_heads;
    const float scale = desc_.query_scale, cap = desc_.attn_softcap;
    const RopeTable& rope = c_.local_rope(layer) ? rope_local_ : rope_;
    pool_.parallel_for(n, [&](size_t b, size_t e) {
        for (size_t t = b; t < e; ++t) {
            const uint64_t pos = t % seq_len_;
            const float* cs = rope.cos.data() + pos * half;
            const float* sn = rope.sin.data() + pos * half;
            for (uint64_t h = 0; h < c_.num_heads; ++h)
                rope_rotate(q + t * qd + h * hd, cs, sn, half);
            for (uint64_t h = 0; h < c_.num_kv_heads; ++h)
                rope_rotate(k + t * kvd + h * hd, cs, sn, half);
        }
    });
    if (products_ == CalibProducts::bf16) {
        attention_bf16(layer, q, k, v, out);
        return;
    }
    const uint64_t window = c_.attention_window(layer);
    // One task per (sequence, query head), its queries in blocks of kAttentionBlock positions:
    // S = Q K^T over the keys any query of the block sees (one single-threaded sgemm; the keys
    // a query may not see get weight 0), each row's softmax, then O = P V (a second sgemm).
    // Every output's sums follow the shapes alone, never the threads. A block reads its queries
    // (the first sgemm) before it writes their outputs, and no other block reads them: out may
    // be q.
    const uint64_t blocks = (seq_len_ + kAttentionBlock - 1) / kAttentionBlock;
    const Isa isa = cpu_isa();
    pool_.parallel_for(sequences_ * c_.num_heads, [&](size_t b, size_t e) {
        std::vector<float> p(kAttentionBlock * seq_len_);
        for (size_t task = b; task < e; ++task) {
            const uint64_t seq = task / c_.num_heads, h = task % c_.num_heads, kvh = h / group;
            const uint64_t t0 = seq * seq_len_;  // the sequence's first token
            const float* kh = k + t0 * kvd + kvh * hd;
            const float* vh = v + t0 * kvd + kvh * hd;
            for (uint64_t blk = 0; blk < blocks; ++blk) {
                const uint64_t p0 = blk * kAttentionBlock,
                               p1 = std::min(seq_len_, p0 + kAttentionBlock);
                // Keys [k0, p1): the union of what the block's queries see.
                const uint64_t k0 = window && p0 + 1 > window ? p0 + 1 - window : 0;
                const uint64_t rows = p1 - p0, len = p1 - k0;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                            static_cast<int>(len), static_cast<int>(hd), 1.0f,
                            q + (t0 + p0) * qd + h * hd, static_cast<int>(qd), kh + k0 * kvd,
                            static_cast<int>(kvd), 0.0f, p.data(), static_cast<int>(len));
                attention_weights(p.data(), p0, rows, k0, len, window, scale, cap, isa);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                            static_cast<int>(hd), static_cast<int>(len), 1.0f, p.data(),
                            static_cast<int>(len), vh + k0 * kvd, static_cast<int>(kvd), 0.0f,
                            out + (t0 + p0) * qd + h * hd, static_cast<int>(qd));
            }
        }
    });
}

// bf16 products: one task per (sequence, KV head). Its keys are packed once as bf16 rows; per
// block of kAttentionBlock query positions, the values the block sees as bf16 columns (the
// packed rows of V^T over keys [k0, p1)); then for each query head of the group, S = Q K^T is
// bf16_matmul with the block's queries as the tokens, each row's softmax in f32 as above, and
// O = P V bf16_matmul with P's rows (rounded to bf16) as the tokens. Every output's chain
// depends on the shapes alone, never on the threads. Rounding: q, k, v and P to bf16 (8
// significant bits); the error bound is derived in tests/quant_block_forward_test.cpp.
void BlockForward::attention_bf16(uint64_t layer, const float* q, const float* k, const float* v,
                                  float* out) {
    const uint64_t hd = c_.head_dim, qd = c_.q_dim(), kvd = c_.kv_dim();
    const uint64_t group = c_.num_heads / c_.num_kv_heads;
    const uint64_t window = c_.attention_window(layer);
    const uint64_t blocks = (seq_len_ + kAttentionBlock - 1) / kAttentionBlock;
    const float scale = desc_.query_scale, cap = desc_.attn_softcap;
    const Isa isa = cpu_isa();
    pool_.run_chunks(sequences_ * c_.num_kv_heads, [&](size_t task, int) {
        thread_local Bf16PackedRows keys, values;
        thread_local Bf16Tokens queries, probs;
        thread_local std::vector<float> qb, p;
        const uint64_t seq = task / c_.num_kv_heads, kvh = task % c_.num_kv_heads;
        const uint64_t t0 = seq * seq_len_;
        const float* vh = v + t0 * kvd + kvh * hd;
        keys.reshape(seq_len_, hd);
        keys.pack_f32(k + t0 * kvd + kvh * hd, kvd, 0, keys.tiles());
        for (uint64_t blk = 0; blk < blocks; ++blk) {
            const uint64_t p0 = blk * kAttentionBlock,
                           p1 = std::min(seq_len_, p0 + kAttentionBlock);
            const uint64_t k0 = window && p0 + 1 > window ? p0 + 1 - window : 0;
            const uint64_t rows = p1 - p0, len = p1 - k0;
            values.reshape(hd, len);
            values.pack_columns(vh + k0 * kvd, kvd, 0, values.tiles());
            for (uint64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
                qb.resize(rows * hd);
                for (uint64_t r = 0; r < rows; ++r)
                    std::copy_n(q + (t0 + p0 + r) * qd + h * hd, hd, qb.data() + r * hd);
                queries.prepare(qb.data(), rows, hd);
                p.resize(rows * len);
                bf16_matmul(keys, k0, p1, queries, 0, rows, p.data(), len);
                attention_weights(p.data(), p0, rows, k0, len, window, scale, cap, isa);
                probs.prepare(p.data(), rows, len);
                bf16_matmul(values, 0, hd, probs, 0, rows, out + (t0 + p0) * qd + h * hd, qd);
            }
        }
    });
}

void BlockForward::gated_products(uint64_t, Rows in, Activation act, Rows out, uint64_t n) {
    if (hook) hook->before_products(Weight::gate, in, n);
    if (act != Activation::silu && act != Activation::gelu_tanh)
        throw Error("calibration forward: unknown activation " +
                    std::to_string(static_cast<int>(act)));
    const bool gelu = act == Activation::gelu_tanh;
    const Matrix &gate = weight(Weight::gate), &up = weight(Weight::up);
    const uint64_t d = gate.cols, inter = gate.rows;
    require_dense(in, d, "gate/up input");
    require_dense(out, inter, "gate/up output");
    gate_.resize(std::min(kGateChunk, n) * inter);
    up_.resize(gate_.size());
    const float* g = gate_.data();
    const float* u = up_.data();
    const Prepared gu[2] = {prepare(gate), prepare(up)};
    float* const outs[2] = {gate_.data(), up_.data()};
    for (uint64_t t0 = 0; t0 < n; t0 += kGateChunk) {
        const uint64_t nt = std::min(kGateChunk, n - t0);
        apply(gu, in.data + t0 * d, nt, outs);
        float* m = out.data + t0 * inter;
        pool_.parallel_for(nt * inter, [&](size_t b, size_t e) {
            if (gelu)
                for (size_t i = b; i < e; ++i) m[i] = gelu_tanh(g[i]) * u[i];
            else  // the runtime's SiLU (activation.hpp)
                silu_mul(cpu_isa(), g + b, u + b, m + b, e - b);
        });
    }
}

std::vector<float> embed_tokens(const Model& model, const std::vector<int32_t>& tokens) {
    const uint64_t d = model.config().hidden_size;
    std::vector<float> x(tokens.size() * d);
    for (size_t t = 0; t < tokens.size(); ++t) {
        if (tokens[t] < 0 || static_cast<uint64_t>(tokens[t]) >= model.config().vocab_size)
            throw Error(
                model.path(), {},
                "calibration token id " + std::to_string(tokens[t]) + " is outside the vocabulary");
        row_to_f32(model.embed().qtype, model.embed().row(static_cast<uint64_t>(tokens[t])),
                   x.data() + t * d, d);
    }
    const float scale = block_desc(model.config()).embed_scale;
    if (scale > 0.0f)
        for (float& v : x) v *= scale;
    return x;
}

void run_layer(BlockForward& f, const Model& model, uint64_t layer, std::vector<float>& x) {
    if (x.size() != f.tokens() * f.config().hidden_size)
        throw Error("calibration forward: the hidden states hold " + std::to_string(x.size()) +
                    " values, expected " + std::to_string(f.tokens() * f.config().hidden_size));
    f.view = layer_view(model, layer);
    BlockForward::Buffers buffers;
    run_block(f, f.desc(), layer, f.activations(x.data(), buffers), f.tokens());
}

}  // namespace qforge
