#include "quant/size_plan.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "quant/block_forward.hpp"
#include "quant/hessian.hpp"
#include "quant/rtn.hpp"
#include "runtime/model.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

std::optional<std::vector<size_t>> allocate_budget(const std::vector<SizeItem>& items,
                                                   uint64_t budget) {
    const size_t n = items.size();
    if (n == 0) return std::vector<size_t>{};
    // Units: at most 2^18 over the budget, and the choice table (one byte per item and unit)
    // within 256 MiB however many items there are.
    const uint64_t units = std::max<uint64_t>(1024, std::min<uint64_t>(1u << 18, (1u << 28) / n));
    const uint64_t unit = std::max<uint64_t>(1, (budget + units - 1) / units);
    const uint64_t cap = budget / unit;
    auto weight = [&](const SizeCandidate& c) { return (c.bytes + unit - 1) / unit; };
    for (const auto& it : items) {
        if (it.candidates.empty() || it.candidates.size() > 255)
            throw Error({}, it.name, "the size plan needs 1 to 255 candidate types per tensor");
        for (const auto& c : it.candidates)
            if (!std::isfinite(c.kld))
                throw Error({}, it.name,
                            "divergence for " + std::string(qtype_traits(c.qtype).name) +
                                " is not finite (the model's outputs overflow)");
    }
    constexpr double kNone = std::numeric_limits<double>::infinity();
    // best[b]: the least sum over the items so far using at most b units.
    std::vector<double> best(cap + 1, 0.0), next(cap + 1);
    std::vector<uint8_t> choice(n * (cap + 1));
    for (size_t i = 0; i < n; ++i) {
        const auto& cands = items[i].candidates;
        uint8_t* row = choice.data() + i * (cap + 1);
        for (uint64_t b = 0; b <= cap; ++b) {
            double v = kNone;
            uint8_t arg = 0;
            for (size_t c = 0; c < cands.size(); ++c) {
                const uint64_t w = weight(cands[c]);
                if (w > b || best[b - w] == kNone) continue;
                const double s = best[b - w] + cands[c].kld;
                if (s < v) v = s, arg = static_cast<uint8_t>(c);
            }
            next[b] = v;
            row[b] = arg;
        }
        best.swap(next);
    }
    if (best[cap] == kNone) {
        // Rounding up to units can lose the last fitting plans (within n units of the least
        // bytes): the smallest type of each, when that fits in bytes.
        uint64_t least = 0;
        std::vector<size_t> smallest(n);
        for (size_t i = 0; i < n; ++i) {
            const auto& cands = items[i].candidates;
            for (size_t c = 1; c < cands.size(); ++c)
                if (cands[c].bytes < cands[smallest[i]].bytes) smallest[i] = c;
            least += cands[smallest[i]].bytes;
        }
        if (least <= budget) return smallest;
        return std::nullopt;
    }
    std::vector<size_t> out(n);
    uint64_t b = cap;
    for (size_t i = n; i-- > 0;) {
        out[i] = choice[i * (cap + 1) + b];
        b -= weight(items[i].candidates[out[i]]);
    }
    return out;
}

namespace {

constexpr uint64_t kAlign = 64;  // the .qf tensor alignment (docs/FORMAT.md)

// Where a requested tensor sits in the forward.
struct Site {
    const Matrix* matrix = nullptr;
    bool embed = false;  // the embedding (tied: the output head too)
    bool head = false;   // the output head
    uint64_t layer = 0;  // block matrices
    Weight weight = Weight::q;
};

Site find_site(const Model& model, const std::string& name) {
    const bool tied = model.config().tie_word_embeddings;
    Site s;
    if (name == model.embed().name) {
        s.matrix = &model.embed();
        s.embed = true;
        s.head = tied;
        return s;
    }
    if (!tied && name == model.lm_head().name) {
        s.matrix = &model.lm_head();
        s.head = true;
        return s;
    }
    for (uint64_t l = 0; l < model.layers().size(); ++l)
        for (int w = 0; w < kBlockLinears; ++w) {
            const Matrix& m = model.weight(l, Weight(w));
            if (m.name == name) {
                s.matrix = &m;
                s.layer = l;
                s.weight = Weight(w);
                return s;
            }
        }
    throw Error(model.path(), name,
                "is not one of the model's matrices: the size plan cannot "
                "measure it");
}

// The float reference: per token, the probabilities and sum p log p.
struct Reference {
    std::vector<float> p;             // [tokens][vocab]
    std::vector<double> neg_entropy;  // sum_i p_i log p_i
};

class Measure {
  public:
    Measure(const Model& model, uint64_t windows, uint64_t seqlen, ThreadPool& pool)
        : model_(model), c_(model.config()), f_(c_, windows, seqlen, pool), pool_(pool) {}

    uint64_t tokens() const { return f_.tokens(); }

    // Runs blocks [from, to) on x in place; block `at` (if any) with its matrix replaced by `m`.
    void blocks(std::vector<float>& x, uint64_t from, uint64_t to, const Site* at = nullptr,
                const Matrix* m = nullptr) {
        for (uint64_t l = from; l < to; ++l) {
            f_.view = layer_view(model_, l);
            if (at && !at->embed && !at->head && at->layer == l) f_.view[at->weight] = *m;
            run_block(f_, f_.desc(), l, f_.activations(x.data(), buffers_), tokens());
        }
    }

    // Per token: the logits of the final hidden states x through `head`, then f(t, logits).
    template <class F>
    void logits(const std::vector<float>& x, const Matrix& head, F&& f) {
        const uint64_t d = c_.hidden_size, v = c_.vocab_size, n = tokens();
        std::vector<float> h(x.size());
        f_.view = layer_view(model_, 0);  // its final norm
        f_.norm(0, Norm::final, {const_cast<float*>(x.data()), d}, {h.data(), d}, n);
        const float cap = static_cast<float>(c_.final_logit_softcapping);
        constexpr uint64_t kChunk = 64;
        logits_.resize(kChunk * v);
        for (uint64_t t0 = 0; t0 < n; t0 += kChunk) {
            const uint64_t m = std::min(kChunk, n - t0);
            f_.linear(head, h.data() + t0 * d, m, logits_.data());
            if (cap > 0.0f)
                for (uint64_t i = 0; i < m * v; ++i) logits_[i] = std::tanh(logits_[i] / cap) * cap;
            // One chunk per token, claimed by whichever thread is free (a token's figures do not
            // depend on the thread).
            pool_.run_chunks(m, [&](size_t t, int) { f(t0 + t, logits_.data() + t * v); });
        }
    }

    // log sum exp of one token's logits (s: the caller's scratch).
    double log_sum_exp(const float* l, std::vector<float>& s) const {
        const uint64_t v = c_.vocab_size;
        const float mx = *std::max_element(l, l + v);
        s.assign(l, l + v);
        exp_shifted(cpu_isa(), s.data(), v, mx);
        double sum = 0.0;
        for (float e : s) sum += e;
        return static_cast<double>(mx) + std::log(sum);
    }

    Reference reference(const std::vector<float>& x) {
        Reference r;
        const uint64_t v = c_.vocab_size;
        r.p.resize(tokens() * v);
        r.neg_entropy.resize(tokens());
        logits(x, model_.lm_head(), [&](uint64_t t, const float* l) {
            std::vector<float> tmp;
            const double lse = log_sum_exp(l, tmp);
            double ne = 0.0;
            float* p = r.p.data() + t * v;
            for (uint64_t i = 0; i < v; ++i) {
                const double lp = static_cast<double>(l[i]) - lse;
                p[i] = static_cast<float>(std::exp(lp));
                ne += static_cast<double>(p[i]) * lp;
            }
            r.neg_entropy[t] = ne;
        });
        return r;
    }

    // Mean KL(reference || model on x through head).
    double kld(const Reference& ref, const std::vector<float>& x, const Matrix& head) {
        std::vector<double> per(tokens());
        const uint64_t v = c_.vocab_size;
        logits(x, head, [&](uint64_t t, const float* l) {
            std::vector<float> tmp;
            const double lse = log_sum_exp(l, tmp);
            const float* p = ref.p.data() + t * v;
            double cross = 0.0;  // sum p_i l_i
            for (uint64_t i = 0; i < v; ++i) cross += static_cast<double>(p[i]) * l[i];
            per[t] = ref.neg_entropy[t] - cross + lse;
        });
        double sum = 0.0;
        for (double k : per) sum += k;
        return sum / static_cast<double>(tokens());
    }

  private:
    const Model& model_;
    const ModelConfig& c_;
    BlockForward f_;
    ThreadPool& pool_;
    BlockForward::Buffers buffers_;
    std::vector<float> logits_;
};

}  // namespace

std::vector<SizeItem> measure_sensitivity(const Model& model, const CalibrationSet& calib,
                                          uint64_t tokens,
                                          const std::vector<SensitivityRequest>& requests,
                                          ThreadPool& pool, const SensitivityProgress& progress) {
    const ModelConfig& c = model.config();
    if (calib.nsamples == 0 || calib.seqlen == 0)
        throw Error(model.path(), {}, "the size plan needs calibration windows");
    const uint64_t windows = std::clamp<uint64_t>(tokens / calib.seqlen, 1, calib.nsamples);
    const uint64_t d = c.hidden_size;
    std::vector<Site> sites;
    uint64_t total = 0;
    for (const auto& r : requests) {
        const Site s = find_site(model, r.name);
        if (qtype_is_quantized(s.matrix->qtype))
            throw Error(model.path(), r.name,
                        "is stored as " + std::string(qtype_traits(s.matrix->qtype).name) +
                            ": the size plan measures float weights");
        for (QType q : r.qtypes)
            if (!qtype_tensor_bytes(q, std::vector<uint64_t>{s.matrix->rows, s.matrix->cols}))
                throw Error(model.path(), r.name,
                            "cannot be stored as " + std::string(qtype_traits(q).name));
        sites.push_back(s);
        total += r.qtypes.size();
    }

    BlasSingleThread blas;
    Measure m(model, windows, calib.seqlen, pool);
    const std::vector<int32_t> ids(calib.tokens.begin(),
                                   calib.tokens.begin() + static_cast<ptrdiff_t>(m.tokens()));
    const float embed_scale = block_desc(c).embed_scale;

    // The float pass: each block's input, then the reference distributions.
    std::vector<std::vector<float>> inputs(c.num_layers + 1);
    inputs[0] = embed_tokens(model, ids);
    for (uint64_t l = 0; l < c.num_layers; ++l) {
        inputs[l + 1] = inputs[l];
        m.blocks(inputs[l + 1], l, l + 1);
    }
    const Reference ref = m.reference(inputs[c.num_layers]);

    std::vector<SizeItem> out;
    std::vector<uint8_t> packed;
    std::vector<float> deq, x;
    uint64_t done = 0;
    for (size_t r = 0; r < requests.size(); ++r) {
        const Site& s = sites[r];
        const Matrix& w = *s.matrix;
        SizeItem item{requests[r].name, {}};
        for (QType q : requests[r].qtypes) {
            const uint64_t bytes = *qtype_tensor_bytes(q, std::vector<uint64_t>{w.rows, w.cols});
            packed.resize(bytes);
            if (auto fail =
                    rtn_quantize(w.qtype, {w.data, w.bytes()}, w.rows, w.cols, q, packed, &pool))
                throw Error(model.path(), w.name,
                            "row " + std::to_string(fail->row) + " cannot be stored as " +
                                std::string(qtype_traits(q).name) + " (non-finite or too large)");
            deq.resize(w.rows * w.cols);
            const uint64_t rb = *qtype_row_bytes(q, w.cols);
            constexpr uint64_t kRows = 64;
            pool.run_chunks((w.rows + kRows - 1) / kRows, [&](size_t chunk, int) {
                for (uint64_t i = chunk * kRows; i < std::min(w.rows, (chunk + 1) * kRows); ++i)
                    row_to_f32(q, packed.data() + i * rb, deq.data() + i * w.cols, w.cols);
            });
            const Matrix dm = f32_matrix(w.name, deq, w.rows, w.cols);
            double kld = 0.0;
            if (s.embed) {  // the lookup of the calibration tokens in the quantized rows
                x.resize(ids.size() * d);
                for (size_t t = 0; t < ids.size(); ++t)
                    for (uint64_t j = 0; j < d; ++j) {
                        const float v = deq[static_cast<uint64_t>(ids[t]) * d + j];
                        x[t * d + j] = embed_scale > 0.0f ? v * embed_scale : v;
                    }
                m.blocks(x, 0, c.num_layers);
                kld = m.kld(ref, x, s.head ? dm : model.lm_head());
            } else if (s.head) {
                kld = m.kld(ref, inputs[c.num_layers], dm);
            } else {
                x = inputs[s.layer];
                m.blocks(x, s.layer, c.num_layers, &s, &dm);
                kld = m.kld(ref, x, model.lm_head());
            }
            item.candidates.push_back({q, (bytes + kAlign - 1) / kAlign * kAlign, kld});
            if (progress) progress(++done, total);
        }
        out.push_back(std::move(item));
    }
    return out;
}

}  // namespace qforge
