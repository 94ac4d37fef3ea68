// The CUDA backend (cuda_backend.hpp). The forward pass is the CPU backend's, step for step
// (runtime/cpu_backend.cpp), as a sequence of launches on one stream:
//   embed -> per layer: rmsnorm, q/k/v products (+ biases), RoPE + fp16 cache write, attention,
//   output product += residual, rmsnorm, gate and up products, SwiGLU, down product += residual
//   -> final rmsnorm and LM head for the rows whose logits are wanted.
// Positions and token ids are read by the kernels from a small device buffer (step_: [0] the
// first position, [1..] the token ids), so one captured graph serves every decode step of a cache.
#include "runtime/cuda_backend.hpp"

#include "core/error.hpp"
#include "kernels/device_info.hpp"

#ifdef QFORGE_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "core/checked_math.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/launchers.hpp"
#include "kernels/cuda/matmul.hpp"
#include "runtime/rope.hpp"
#endif

namespace qforge {

#ifdef QFORGE_HAVE_CUDA

namespace {

using cuda::DeviceBuffer;
using cuda::DeviceMatrix;

uint32_t u32(uint64_t v) { return static_cast<uint32_t>(v); }
uint64_t pad32(uint64_t v) { return round_up(v, 32); }

// Device memory, fp16: per layer keys then values, each [capacity][kv_dim] (the CPU cache's
// layout). `id` keys the CUDA graphs captured against this cache's buffers.
class CudaKvCache final : public KvCache {
  public:
    CudaKvCache(const ModelConfig& c, uint64_t capacity, uint64_t id)
        : KvCache(capacity), kv_dim_(c.kv_dim()), id_(id) {
        const uint64_t dims[] = {c.num_layers, 2, capacity, kv_dim_};
        auto n = checked_product(dims);
        if (!n || *n > (uint64_t{1} << 40))
            throw Error("KV cache of " + std::to_string(capacity) + " positions is too large");
        data_ = DeviceBuffer<uint16_t>(*n);
    }
    uint16_t* keys(uint64_t layer) const { return data_.get() + (layer * 2) * capacity_ * kv_dim_; }
    uint16_t* values(uint64_t layer) const {
        return data_.get() + (layer * 2 + 1) * capacity_ * kv_dim_;
    }
    uint64_t id() const { return id_; }
    void set_size(uint64_t n) { size_ = n; }

  private:
    uint64_t kv_dim_;
    uint64_t id_;
    DeviceBuffer<uint16_t> data_;
};

CudaKvCache& cuda_cache(KvCache& cache) {
    auto* c = dynamic_cast<CudaKvCache*>(&cache);
    if (!c) throw Error("cuda backend: the KV cache was made by another backend");
    return *c;
}

}  // namespace

class CudaEngine {
  public:
    CudaEngine(const ModelConfig& config, std::string path, CudaBackendOptions options);
    ~CudaEngine();
    CudaEngine(const CudaEngine&) = delete;
    CudaEngine& operator=(const CudaEngine&) = delete;

    void upload(const Model& model);
    void randomize(QType qtype, uint64_t seed);

    std::unique_ptr<KvCache> new_cache(uint64_t capacity);
    void forward(std::span<const int32_t> tokens, CudaKvCache& cache, uint64_t logits_from,
                 std::span<float> logits);
    // Greedy steps on the device; `seconds` (if given) times the steps after `warmup` of them.
    std::vector<int32_t> greedy(CudaKvCache& cache, int32_t first, uint64_t steps,
                                uint64_t warmup = 0, double* seconds = nullptr);

    uint64_t decode_weight_bytes() const;
    uint64_t weight_bytes() const { return weight_bytes_; }
    std::string description() const { return description_; }

  private:
    struct Layer {
        DeviceMatrix q, k, v, o, gate, up, down;
        const float* attn_norm = nullptr;
        const float* mlp_norm = nullptr;
        const float* q_bias = nullptr;
        const float* k_bias = nullptr;
        const float* v_bias = nullptr;
    };
    enum class Graph : int { decode_no_logits, decode_logits, greedy };

    DeviceMatrix upload_matrix(const Matrix& m);
    DeviceMatrix random_matrix(QType qtype, uint64_t rows, uint64_t cols, uint64_t seed);
    const float* upload_vector(const std::vector<float>& v);
    void allocate_activations();
    void ensure_rope(uint64_t positions);
    void check_tokens(std::span<const int32_t> tokens) const;
    // Enqueues one step of m tokens; logits of rows [lf, m) go to logits_ (none when lf == m).
    void enqueue(uint64_t m, const CudaKvCache& cache, uint64_t lf);
    void enqueue_greedy_step(const CudaKvCache& cache);
    void mm(const DeviceMatrix& w, const float* x, uint64_t ldx, uint64_t m, float* y, uint64_t ldo,
            const float* bias, bool accumulate);
    void launch_graph(const CudaKvCache& cache, Graph kind);
    void clear_graphs();

    ModelConfig c_;
    std::string path_;
    CudaBackendOptions o_;
    std::string description_;
    int cc_major_ = 0, sm_count_ = 1;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    DeviceBuffer<uint8_t> cublas_workspace_;

    std::vector<DeviceBuffer<uint8_t>> weights_;  // every matrix
    std::vector<DeviceBuffer<float>> vectors_;    // norms and biases
    uint64_t weight_bytes_ = 0;
    DeviceMatrix embed_, lm_head_;
    std::vector<Layer> layers_;
    const float* final_norm_ = nullptr;

    uint64_t batch_ = 0, ld_d_ = 0, ld_qkv_ = 0, ld_q_ = 0, ld_i_ = 0;
    uint32_t dims_per_lane_ = 1;
    DeviceBuffer<float> x_, h_, qkv_, att_, gate_, up_, logits_;
    DeviceBuffer<uint16_t> x16_, w16_;
    DeviceBuffer<float> workspace_;
    DeviceBuffer<int32_t> step_;     // [0] position of token 0, [1 ..] token ids
    DeviceBuffer<int32_t> history_;  // greedy: the token chosen after each position
    int32_t* staging_ = nullptr;     // pinned host copy of step_
    DeviceBuffer<float> cos_, sin_;
    uint64_t rope_positions_ = 0;
    cuda::MatmulContext mctx_;
    std::map<std::pair<uint64_t, int>, cudaGraphExec_t> graphs_;
    uint64_t next_cache_id_ = 1;
};

CudaEngine::CudaEngine(const ModelConfig& config, std::string path, CudaBackendOptions options)
    : c_(config), path_(std::move(path)), o_(options) {
    std::string why;
    const auto gpus = list_gpus(&why);
    if (gpus.empty()) throw Error("cuda backend: " + why);
    if (o_.device < 0 || static_cast<size_t>(o_.device) >= gpus.size())
        throw Error("cuda backend: device " + std::to_string(o_.device) + " does not exist (" +
                    std::to_string(gpus.size()) + " visible)");
    const GpuDevice& dev = gpus[static_cast<size_t>(o_.device)];
    cc_major_ = dev.cc_major;
    sm_count_ = dev.sm_count;
    description_ = dev.name + " (sm_" + std::to_string(dev.cc_major) +
                   std::to_string(dev.cc_minor) + ", " + std::to_string(dev.sm_count) + " SMs)";
    if (o_.max_batch == 0 || o_.max_batch > (uint64_t{1} << 20))
        throw Error("cuda backend: max_batch must be 1 .. 2^20");
    cuda::check_attention_config(c_.head_dim, c_.num_heads, c_.num_kv_heads);
    dims_per_lane_ = cuda::attention_dims_per_lane(c_.head_dim);

    QF_CUDA_CHECK(cudaSetDevice(o_.device));
    QF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    auto cublas_check = [](cublasStatus_t st, const char* what) {
        if (st != CUBLAS_STATUS_SUCCESS)
            throw Error(std::string("cuda backend: ") + what + ": " + cublasGetStatusString(st));
    };
    cublas_check(cublasCreate(&cublas_), "cublasCreate");
    cublas_check(cublasSetStream(cublas_, stream_), "cublasSetStream");
    // A fixed workspace, so cuBLAS never allocates while a graph is being captured.
    cublas_workspace_ = DeviceBuffer<uint8_t>(uint64_t{32} << 20);
    cublas_check(cublasSetWorkspace(cublas_, cublas_workspace_.get(), cublas_workspace_.bytes()),
                 "cublasSetWorkspace");
    QF_CUDA_CHECK(
        cudaMallocHost(reinterpret_cast<void**>(&staging_), (1 + o_.max_batch) * sizeof(int32_t)));
}

CudaEngine::~CudaEngine() {
    if (stream_) cudaStreamSynchronize(stream_);
    clear_graphs();
    if (staging_) cudaFreeHost(staging_);
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
}

void CudaEngine::clear_graphs() {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
}

DeviceMatrix CudaEngine::upload_matrix(const Matrix& m) {
    DeviceMatrix d;
    try {
        d.fmt = cuda::gpu_matrix_format(m.qtype, m.cols);
    } catch (const cuda::UnsupportedOnCuda& e) {
        throw cuda::UnsupportedOnCuda(path_, m.name, e.configuration());
    }
    d.rows = m.rows;
    DeviceBuffer<uint8_t> buf(d.bytes());
    if (!d.fmt.repacked()) {
        buf.upload(m.data, d.bytes());
    } else {
        // Repack in slabs of about 64 MiB of host memory.
        const uint64_t slab = std::max<uint64_t>(1, (uint64_t{64} << 20) / d.fmt.row_bytes);
        std::vector<uint8_t> host(std::min(slab, m.rows) * d.fmt.row_bytes);
        for (uint64_t r0 = 0; r0 < m.rows; r0 += slab) {
            const uint64_t n = std::min(slab, m.rows - r0);
            cuda::repack_rows_for_gpu(d.fmt, m.row(r0), m.row_bytes(), n, host.data());
            buf.upload(host.data(), n * d.fmt.row_bytes, r0 * d.fmt.row_bytes);
        }
    }
    d.data = buf.get();
    weight_bytes_ += buf.bytes();
    weights_.push_back(std::move(buf));
    return d;
}

DeviceMatrix CudaEngine::random_matrix(QType qtype, uint64_t rows, uint64_t cols, uint64_t seed) {
    DeviceMatrix d;
    d.fmt = cuda::gpu_matrix_format(qtype, cols);
    d.rows = rows;
    DeviceBuffer<uint8_t> buf(d.bytes());
    d.data = buf.get();
    const float stddev = 1.0f / std::sqrt(static_cast<float>(cols));
    const cuda::RowsParams p = cuda::to_rows_params(d);
    if (d.fmt.quantized()) {
        // Codes uniform over 16 (q4) or 255 (q8) levels: deviation about 4.6 or 73.6 steps.
        const float steps = d.fmt.kind == cuda::WeightKind::q4 ? 4.6f : 73.6f;
        cuda::fill_random_quant_rows_launch(p, stddev / steps, seed, stream_);
    } else {
        cuda::fill_random_float_rows_launch(p, u32(cols), stddev, seed, stream_);
    }
    weight_bytes_ += buf.bytes();
    weights_.push_back(std::move(buf));
    return d;
}

const float* CudaEngine::upload_vector(const std::vector<float>& v) {
    DeviceBuffer<float> buf(v.size());
    buf.upload(v);
    const float* p = buf.get();
    vectors_.push_back(std::move(buf));
    return p;
}

void CudaEngine::upload(const Model& model) {
    embed_ = upload_matrix(model.embed());
    lm_head_ = &model.lm_head() == &model.embed() ? embed_ : upload_matrix(model.lm_head());
    for (const LayerWeights& w : model.layers()) {
        Layer l;
        l.q = upload_matrix(w.q);
        l.k = upload_matrix(w.k);
        l.v = upload_matrix(w.v);
        l.o = upload_matrix(w.o);
        l.gate = upload_matrix(w.gate);
        l.up = upload_matrix(w.up);
        l.down = upload_matrix(w.down);
        l.attn_norm = upload_vector(w.attn_norm);
        l.mlp_norm = upload_vector(w.mlp_norm);
        if (c_.attention_bias) {
            l.q_bias = upload_vector(w.q_bias);
            l.k_bias = upload_vector(w.k_bias);
            l.v_bias = upload_vector(w.v_bias);
        }
        layers_.push_back(l);
    }
    final_norm_ = upload_vector(model.final_norm());
    allocate_activations();
}

void CudaEngine::randomize(QType qtype, uint64_t seed) {
    const uint64_t d = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim(),
                   inter = c_.intermediate_size;
    uint64_t s = seed;
    embed_ = random_matrix(qtype, c_.vocab_size, d, ++s);
    lm_head_ = c_.tie_word_embeddings ? embed_ : random_matrix(qtype, c_.vocab_size, d, ++s);
    const float* norm = upload_vector(std::vector<float>(d, 1.0f));
    const float* bias_q = c_.attention_bias ? upload_vector(std::vector<float>(qd, 0.0f)) : nullptr;
    const float* bias_kv =
        c_.attention_bias ? upload_vector(std::vector<float>(kvd, 0.0f)) : nullptr;
    for (uint64_t i = 0; i < c_.num_layers; ++i) {
        Layer l;
        l.q = random_matrix(qtype, qd, d, ++s);
        l.k = random_matrix(qtype, kvd, d, ++s);
        l.v = random_matrix(qtype, kvd, d, ++s);
        l.o = random_matrix(qtype, d, qd, ++s);
        l.gate = random_matrix(qtype, inter, d, ++s);
        l.up = random_matrix(qtype, inter, d, ++s);
        l.down = random_matrix(qtype, d, inter, ++s);
        l.attn_norm = l.mlp_norm = norm;
        l.q_bias = bias_q;
        l.k_bias = l.v_bias = bias_kv;
        layers_.push_back(l);
    }
    final_norm_ = norm;
    QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    allocate_activations();
}

void CudaEngine::allocate_activations() {
    const uint64_t d = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim(),
                   inter = c_.intermediate_size;
    batch_ = o_.max_batch;
    ld_d_ = pad32(d);
    ld_qkv_ = pad32(qd + 2 * kvd);
    ld_q_ = pad32(qd);
    ld_i_ = pad32(inter);
    auto zeroed = [](uint64_t n) {
        DeviceBuffer<float> b(n);
        b.fill_bytes(0);  // padding columns stay zero: the products read whole chunks
        return b;
    };
    x_ = zeroed(batch_ * ld_d_);
    h_ = zeroed(batch_ * ld_d_);
    qkv_ = zeroed(batch_ * ld_qkv_);
    att_ = zeroed(batch_ * ld_q_);
    gate_ = zeroed(batch_ * ld_i_);
    up_ = zeroed(batch_ * ld_i_);
    logits_ = zeroed(batch_ * c_.vocab_size);
    step_ = DeviceBuffer<int32_t>(1 + batch_);
    step_.fill_bytes(0);
    history_ = DeviceBuffer<int32_t>(c_.max_position_embeddings + 1);

    // Matmul scratch, sized for the largest matrix, so nothing is allocated during a capture.
    std::vector<const DeviceMatrix*> all = {&embed_, &lm_head_};
    for (const Layer& l : layers_)
        for (const DeviceMatrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
            all.push_back(m);
    uint64_t max_kpad = 0, max_rows = 0, ws = 0;
    bool any_quant = false;
    const bool forced_mma = o_.forced_path == cuda::MatmulPath::mma;
    const uint64_t mma_m = forced_mma ? batch_ : std::min(batch_, cuda::kMmaMaxTokens);
    std::map<std::pair<uint64_t, uint64_t>, bool> seen;  // (qtype, k, rows) shapes planned
    for (const DeviceMatrix* m : all) {
        max_kpad = std::max(max_kpad, m->fmt.kpad);
        max_rows = std::max(max_rows, m->rows);
        any_quant = any_quant || m->fmt.quantized();
        const auto key =
            std::make_pair(m->fmt.kpad * 64 + static_cast<uint64_t>(m->fmt.qtype), m->rows);
        if (!m->fmt.quantized() || seen.count(key)) continue;
        seen[key] = true;
        ws = std::max(ws, cuda::mma_workspace_floats(m->fmt, m->rows, mma_m, sm_count_));
    }
    const bool batched = batch_ > cuda::kGemvMaxTokens || o_.forced_path.has_value();
    const auto scratch = cuda::matmul_scratch_size(batch_, max_kpad, max_rows);
    if (batched) {
        x16_ = DeviceBuffer<uint16_t>(scratch.x16_halves);
        if (any_quant) w16_ = DeviceBuffer<uint16_t>(scratch.w16_halves);
        if (ws) workspace_ = DeviceBuffer<float>(ws);
    }
    mctx_.stream = stream_;
    mctx_.cublas = cublas_;
    mctx_.cc_major = cc_major_;
    mctx_.sm_count = sm_count_;
    mctx_.x16 = x16_.get();
    mctx_.x16_halves = x16_.size();
    mctx_.w16 = w16_.get();
    mctx_.w16_halves = w16_.size();
    mctx_.workspace = workspace_.get();
    mctx_.workspace_floats = workspace_.size();
    mctx_.forced = o_.forced_path;
}

void CudaEngine::ensure_rope(uint64_t positions) {
    if (positions <= rope_positions_) return;
    const RopeTable t(c_, positions);
    DeviceBuffer<float> cs(t.cos.size()), sn(t.sin.size());
    cs.upload(t.cos);
    sn.upload(t.sin);
    QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    clear_graphs();  // they point at the old tables
    cos_ = std::move(cs);
    sin_ = std::move(sn);
    rope_positions_ = positions;
}

std::unique_ptr<KvCache> CudaEngine::new_cache(uint64_t capacity) {
    if (capacity == 0 || capacity > c_.max_position_embeddings)
        throw Error(path_, {},
                    "a context of " + std::to_string(capacity) +
                        " positions is outside 1 .. max_position_embeddings (" +
                        std::to_string(c_.max_position_embeddings) + ")");
    return std::make_unique<CudaKvCache>(c_, capacity, next_cache_id_++);
}

void CudaEngine::mm(const DeviceMatrix& w, const float* x, uint64_t ldx, uint64_t m, float* y,
                    uint64_t ldo, const float* bias, bool accumulate) {
    cuda::matmul(mctx_, w, x, ldx, m, {y, ldo, bias, accumulate});
}

void CudaEngine::enqueue(uint64_t m, const CudaKvCache& cache, uint64_t lf) {
    const uint64_t d = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim(),
                   inter = c_.intermediate_size;
    const int32_t* pos = step_.get();
    const int32_t* tokens = step_.get() + 1;
    const double eps = c_.rms_norm_eps;
    float *x = x_.get(), *h = h_.get(), *qkv = qkv_.get(), *att = att_.get();
    cuda::embed_rows_launch(cuda::to_rows_params(embed_), tokens, u32(m), u32(d), x, ld_d_,
                            stream_);
    for (uint64_t li = 0; li < layers_.size(); ++li) {
        const Layer& l = layers_[li];
        cuda::rms_norm_launch(x, ld_d_, l.attn_norm, eps, u32(m), u32(d), h, ld_d_, stream_);
        mm(l.q, h, ld_d_, m, qkv, ld_qkv_, l.q_bias, false);
        mm(l.k, h, ld_d_, m, qkv + qd, ld_qkv_, l.k_bias, false);
        mm(l.v, h, ld_d_, m, qkv + qd + kvd, ld_qkv_, l.v_bias, false);
        cuda::RopeParams rp;
        rp.qkv = qkv;
        rp.ld = ld_qkv_;
        rp.n = u32(m);
        rp.heads = u32(c_.num_heads);
        rp.kv_heads = u32(c_.num_kv_heads);
        rp.head_dim = u32(c_.head_dim);
        rp.cos = cos_.get();
        rp.sin = sin_.get();
        rp.pos0 = pos;
        rp.k_cache = cache.keys(li);
        rp.v_cache = cache.values(li);
        cuda::rope_store_kv_launch(rp, stream_);
        cuda::AttentionParams ap;
        ap.qkv = qkv;
        ap.ld = ld_qkv_;
        ap.n = u32(m);
        ap.heads = rp.heads;
        ap.kv_heads = rp.kv_heads;
        ap.head_dim = rp.head_dim;
        ap.k_cache = cache.keys(li);
        ap.v_cache = cache.values(li);
        ap.pos0 = pos;
        ap.out = att;
        ap.ldo = ld_q_;
        cuda::attention_launch(ap, dims_per_lane_, stream_);
        mm(l.o, att, ld_q_, m, x, ld_d_, nullptr, true);
        cuda::rms_norm_launch(x, ld_d_, l.mlp_norm, eps, u32(m), u32(d), h, ld_d_, stream_);
        mm(l.gate, h, ld_d_, m, gate_.get(), ld_i_, nullptr, false);
        mm(l.up, h, ld_d_, m, up_.get(), ld_i_, nullptr, false);
        cuda::swiglu_launch(gate_.get(), up_.get(), ld_i_, u32(m), u32(inter), stream_);
        mm(l.down, gate_.get(), ld_i_, m, x, ld_d_, nullptr, true);
    }
    if (lf >= m) return;
    const uint64_t rows = m - lf;
    cuda::rms_norm_launch(x + lf * ld_d_, ld_d_, final_norm_, eps, u32(rows), u32(d), h, ld_d_,
                          stream_);
    mm(lm_head_, h, ld_d_, rows, logits_.get(), c_.vocab_size, nullptr, false);
}

void CudaEngine::enqueue_greedy_step(const CudaKvCache& cache) {
    enqueue(1, cache, 0);
    int32_t* next = step_.get() + 1;
    cuda::argmax_rows_launch(logits_.get(), c_.vocab_size, 1, u32(c_.vocab_size), next, stream_);
    cuda::record_token_launch(next, step_.get(), history_.get(), stream_);
}

void CudaEngine::launch_graph(const CudaKvCache& cache, Graph kind) {
    const auto key = std::make_pair(cache.id(), static_cast<int>(kind));
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
        if (graphs_.size() >= 8) clear_graphs();
        QF_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        try {
            if (kind == Graph::greedy)
                enqueue_greedy_step(cache);
            else
                enqueue(1, cache, kind == Graph::decode_logits ? 0 : 1);
        } catch (...) {
            cudaGraph_t broken = nullptr;
            cudaStreamEndCapture(stream_, &broken);
            if (broken) cudaGraphDestroy(broken);
            throw;
        }
        cudaGraph_t graph = nullptr;
        QF_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
        cudaGraphExec_t exec = nullptr;
        const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        QF_CUDA_CHECK(err);
        it = graphs_.emplace(key, exec).first;
    }
    QF_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
}

void CudaEngine::check_tokens(std::span<const int32_t> tokens) const {
    for (int32_t id : tokens)
        if (id < 0 || static_cast<uint64_t>(id) >= c_.vocab_size)
            throw Error(path_, {},
                        "token id " + std::to_string(id) + " is outside the vocabulary (" +
                            std::to_string(c_.vocab_size) + ")");
}

void CudaEngine::forward(std::span<const int32_t> tokens, CudaKvCache& cache, uint64_t logits_from,
                         std::span<float> logits) {
    const uint64_t n = tokens.size(), v = c_.vocab_size;
    if (logits_from > n) throw Error("forward: logits_from is past the last token");
    if (logits.size() != (n - logits_from) * v)
        throw Error("forward: logits hold " + std::to_string(logits.size()) + " floats, expected " +
                    std::to_string((n - logits_from) * v));
    if (cache.size() + n > cache.capacity())
        throw Error(path_, {},
                    "context is full: " + std::to_string(cache.size()) + " + " + std::to_string(n) +
                        " tokens exceed the context of " + std::to_string(cache.capacity()));
    if (c_.sliding_window && cache.size() + n > *c_.sliding_window)
        throw Error(path_, {},
                    "sliding-window attention is not implemented: position " +
                        std::to_string(cache.size() + n - 1) + " is beyond sliding_window " +
                        std::to_string(*c_.sliding_window));
    check_tokens(tokens);
    ensure_rope(cache.capacity());

    for (uint64_t start = 0; start < n; start += batch_) {
        const uint64_t m = std::min(batch_, n - start);
        const uint64_t first = std::max(start, logits_from);  // logits rows [first, start + m)
        const uint64_t lf = first < start + m ? first - start : m;
        const uint64_t pos0 = cache.size();
        staging_[0] = static_cast<int32_t>(pos0);
        std::memcpy(staging_ + 1, tokens.data() + start, m * sizeof(int32_t));
        QF_CUDA_CHECK(cudaMemcpyAsync(step_.get(), staging_, (1 + m) * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream_));
        if (m == 1 && o_.use_graphs)
            launch_graph(cache, lf == 0 ? Graph::decode_logits : Graph::decode_no_logits);
        else
            enqueue(m, cache, lf);
        if (lf < m)
            QF_CUDA_CHECK(cudaMemcpyAsync(logits.data() + (first - logits_from) * v, logits_.get(),
                                          (m - lf) * v * sizeof(float), cudaMemcpyDeviceToHost,
                                          stream_));
        // Also keeps staging_ untouched until its copy has run.
        QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
        cache.set_size(pos0 + m);
    }
}

std::vector<int32_t> CudaEngine::greedy(CudaKvCache& cache, int32_t first, uint64_t steps,
                                        uint64_t warmup, double* seconds) {
    const int32_t one[] = {first};
    check_tokens(one);
    if (cache.size() + steps > cache.capacity())
        throw Error(path_, {},
                    "context is full: " + std::to_string(cache.size()) + " + " +
                        std::to_string(steps) + " tokens exceed the context of " +
                        std::to_string(cache.capacity()));
    if (c_.sliding_window && cache.size() + steps > *c_.sliding_window)
        throw Error(path_, {}, "sliding-window attention is not implemented");
    ensure_rope(cache.capacity());
    const uint64_t pos0 = cache.size();
    staging_[0] = static_cast<int32_t>(pos0);
    staging_[1] = first;
    QF_CUDA_CHECK(cudaMemcpyAsync(step_.get(), staging_, 2 * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
    cuda::Event start, stop;
    for (uint64_t i = 0; i < steps; ++i) {
        if (i == warmup) start.record(stream_);
        if (o_.use_graphs)
            launch_graph(cache, Graph::greedy);
        else
            enqueue_greedy_step(cache);
    }
    stop.record(stream_);
    QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (seconds) *seconds = warmup < steps ? stop.ms_since(start) / 1000.0 : 0.0;
    cache.set_size(pos0 + steps);
    return history_.download(steps, pos0);
}

uint64_t CudaEngine::decode_weight_bytes() const {
    uint64_t n = lm_head_.bytes();
    for (const Layer& l : layers_)
        n += l.q.bytes() + l.k.bytes() + l.v.bytes() + l.o.bytes() + l.gate.bytes() + l.up.bytes() +
             l.down.bytes();
    return n;
}

// ---------------------------------------------------------------------------------------------

CudaBackend::CudaBackend(const Model& model, CudaBackendOptions options)
    : model_(model), engine_(std::make_unique<CudaEngine>(model.config(), model.path(), options)) {
    engine_->upload(model);
}

CudaBackend::~CudaBackend() = default;

std::unique_ptr<KvCache> CudaBackend::new_cache(uint64_t capacity) const {
    return engine_->new_cache(capacity);
}

void CudaBackend::forward(std::span<const int32_t> tokens, KvCache& cache, uint64_t logits_from,
                          std::span<float> logits) {
    engine_->forward(tokens, cuda_cache(cache), logits_from, logits);
}

std::vector<int32_t> CudaBackend::greedy_decode(KvCache& cache, int32_t first, uint64_t steps) {
    return engine_->greedy(cuda_cache(cache), first, steps);
}

std::string CudaBackend::device_description() const { return engine_->description(); }

CudaSyntheticModel::CudaSyntheticModel(const ModelConfig& config, QType qtype, uint64_t seed,
                                       CudaBackendOptions options)
    : engine_(std::make_unique<CudaEngine>(
          config, "synthetic " + std::string(qtype_traits(qtype).name), options)) {
    engine_->randomize(qtype, seed);
}

CudaSyntheticModel::~CudaSyntheticModel() = default;

uint64_t CudaSyntheticModel::decode_weight_bytes() const { return engine_->decode_weight_bytes(); }
uint64_t CudaSyntheticModel::weight_bytes() const { return engine_->weight_bytes(); }

CudaSyntheticModel::DecodeTiming CudaSyntheticModel::time_greedy_decode(uint64_t warmup,
                                                                        uint64_t steps) {
    auto cache = engine_->new_cache(warmup + steps + 1);
    DecodeTiming t;
    t.steps = steps;
    engine_->greedy(cuda_cache(*cache), 1, warmup + steps, warmup, &t.seconds);
    t.tokens_per_s = t.seconds > 0 ? static_cast<double>(steps) / t.seconds : 0.0;
    return t;
}

#else  // !QFORGE_HAVE_CUDA

class CudaEngine {};

namespace {
[[noreturn]] void no_cuda() {
    throw Error("cuda backend: qforge was built without CUDA (configure with -DQFORGE_CUDA=ON)");
}
}  // namespace

CudaBackend::CudaBackend(const Model& model, CudaBackendOptions) : model_(model) { no_cuda(); }
CudaBackend::~CudaBackend() = default;
std::unique_ptr<KvCache> CudaBackend::new_cache(uint64_t) const { no_cuda(); }
void CudaBackend::forward(std::span<const int32_t>, KvCache&, uint64_t, std::span<float>) {
    no_cuda();
}
std::vector<int32_t> CudaBackend::greedy_decode(KvCache&, int32_t, uint64_t) { no_cuda(); }
std::string CudaBackend::device_description() const { no_cuda(); }
CudaSyntheticModel::CudaSyntheticModel(const ModelConfig&, QType, uint64_t, CudaBackendOptions) {
    no_cuda();
}
CudaSyntheticModel::~CudaSyntheticModel() = default;
uint64_t CudaSyntheticModel::decode_weight_bytes() const { no_cuda(); }
uint64_t CudaSyntheticModel::weight_bytes() const { no_cuda(); }
CudaSyntheticModel::DecodeTiming CudaSyntheticModel::time_greedy_decode(uint64_t, uint64_t) {
    no_cuda();
}

#endif

std::unique_ptr<Backend> make_cuda_backend(const Model& model, CudaBackendOptions options) {
    return std::make_unique<CudaBackend>(model, options);
}

}  // namespace qforge
