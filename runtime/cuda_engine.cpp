#include "runtime/cuda_engine.hpp"

#ifdef QFORGE_HAVE_CUDA
#include <cstdlib>

#include "kernels/device_info.hpp"

namespace qforge {

CudaEngine::CudaEngine(const ModelConfig& config, std::string path, CudaBackendOptions options)
    : c_(config), desc_(block_desc(config)), path_(std::move(path)), o_(options) {
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
    QF_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&cache_rows_host_),
                                 o_.max_batch * sizeof(cuda::CacheRow)));
    QF_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&fault_host_), sizeof(int32_t)));
    *fault_host_ = 0;
}

CudaEngine::~CudaEngine() {
    if (stream_) cudaStreamSynchronize(stream_);
    clear_graphs();
    if (staging_) cudaFreeHost(staging_);
    if (cache_rows_host_) cudaFreeHost(cache_rows_host_);
    if (tables_host_) cudaFreeHost(tables_host_);
    if (fault_host_) cudaFreeHost(fault_host_);
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
}

void CudaEngine::clear_graphs() {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
}

namespace {
cuda::GpuMatrixFormat gpu_format_of(const Matrix& m, const std::string& path) {
    try {
        return cuda::gpu_matrix_format(m.qtype, m.cols);
    } catch (const cuda::UnsupportedOnCuda& e) {
        throw cuda::UnsupportedOnCuda(path, m.name, e.configuration());
    }
}
}  // namespace

// m's rows into buf at `offset` bytes, repacked for the GPU where its layout differs.
void CudaEngine::upload_rows(const Matrix& m, const DeviceMatrix& d, DeviceBuffer<uint8_t>& buf,
                             uint64_t offset) {
    if (!d.fmt.repacked()) {
        buf.upload(m.data, d.bytes(), offset);
        return;
    }
    // Repack in slabs of about 64 MiB of host memory.
    const uint64_t slab = std::max<uint64_t>(1, (uint64_t{64} << 20) / d.fmt.row_bytes);
    std::vector<uint8_t> host(std::min(slab, m.rows) * d.fmt.row_bytes);
    for (uint64_t r0 = 0; r0 < m.rows; r0 += slab) {
        const uint64_t n = std::min(slab, m.rows - r0);
        cuda::repack_rows_for_gpu(d.fmt, m.row(r0), m.row_bytes(), n, host.data());
        buf.upload(host.data(), n * d.fmt.row_bytes, offset + r0 * d.fmt.row_bytes);
    }
}

DeviceMatrix CudaEngine::upload_matrix(const Matrix& m) {
    DeviceMatrix d;
    d.fmt = gpu_format_of(m, path_);
    d.rows = m.rows;
    DeviceBuffer<uint8_t> buf(d.bytes());
    upload_rows(m, d, buf, 0);
    d.data = buf.get();
    weight_bytes_ += buf.bytes();
    weights_.push_back(std::move(buf));
    return d;
}

DeviceMatrix CudaEngine::upload_group(std::span<const Matrix* const> ms,
                                      std::span<DeviceMatrix> out) {
    DeviceMatrix fused;
    fused.fmt = gpu_format_of(*ms[0], path_);
    bool alike = true;
    for (const Matrix* m : ms) {
        const cuda::GpuMatrixFormat f = gpu_format_of(*m, path_);
        alike = alike && f.qtype == fused.fmt.qtype && f.source == fused.fmt.source &&
                f.k == fused.fmt.k && f.row_bytes == fused.fmt.row_bytes;
        fused.rows += m->rows;
    }
    if (!alike) {
        for (size_t i = 0; i < ms.size(); ++i) out[i] = upload_matrix(*ms[i]);
        return {};
    }
    DeviceBuffer<uint8_t> buf(fused.bytes());
    uint64_t offset = 0;
    for (size_t i = 0; i < ms.size(); ++i) {
        out[i].fmt = fused.fmt;
        out[i].rows = ms[i]->rows;
        upload_rows(*ms[i], out[i], buf, offset);
        out[i].data = buf.get() + offset;
        offset += out[i].bytes();
    }
    fused.data = buf.get();
    weight_bytes_ += buf.bytes();
    weights_.push_back(std::move(buf));
    return fused;
}

DeviceMatrix CudaEngine::random_matrix(QType qtype, uint64_t rows, uint64_t cols, uint64_t seed) {
    DeviceMatrix d;
    const uint64_t one[] = {rows};
    random_group(qtype, one, cols, --seed, {&d, 1});
    return d;
}

DeviceMatrix CudaEngine::random_group(QType qtype, std::span<const uint64_t> rows, uint64_t cols,
                                      uint64_t& seed, std::span<DeviceMatrix> out) {
    DeviceMatrix fused;
    fused.fmt = cuda::gpu_matrix_format(qtype, cols);
    // The random fill writes fp16 scales and zeros: the file layouts the GPU reads as they are.
    if (fused.fmt.super_rows || fused.fmt.source != fused.fmt.qtype)
        throw cuda::UnsupportedOnCuda("random weights of " + std::string(qtype_traits(qtype).name) +
                                      " on the device");
    for (uint64_t r : rows) fused.rows += r;
    DeviceBuffer<uint8_t> buf(fused.bytes());
    fused.data = buf.get();
    const float stddev = 1.0f / std::sqrt(static_cast<float>(cols));
    uint64_t offset = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
        DeviceMatrix& d = out[i];
        d.fmt = fused.fmt;
        d.rows = rows[i];
        d.data = buf.get() + offset;
        offset += d.bytes();
        const cuda::RowsParams p = cuda::to_rows_params(d);
        if (d.fmt.quantized()) {
            // Codes uniform over 16 (q4) or 255 (q8) levels: deviation about 4.6 or 73.6 steps.
            const float steps = d.fmt.kind == cuda::WeightKind::q4 ? 4.6f : 73.6f;
            cuda::fill_random_quant_rows_launch(p, stddev / steps, ++seed, stream_);
        } else {
            cuda::fill_random_float_rows_launch(p, u32(cols), stddev, ++seed, stream_);
        }
    }
    weight_bytes_ += buf.bytes();
    weights_.push_back(std::move(buf));
    return fused;
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
        const Matrix* qkv[] = {&w.q, &w.k, &w.v};
        DeviceMatrix qkv_out[3];
        const DeviceMatrix fused_qkv = upload_group(qkv, qkv_out);
        if (o_.fuse_products) l.qkv = fused_qkv;
        l.q = qkv_out[0], l.k = qkv_out[1], l.v = qkv_out[2];
        l.o = upload_matrix(w.o);
        const Matrix* gu[] = {&w.gate, &w.up};
        DeviceMatrix gu_out[2];
        const DeviceMatrix fused_gu = upload_group(gu, gu_out);
        if (o_.fuse_products) l.gate_up = fused_gu;
        l.gate = gu_out[0], l.up = gu_out[1];
        l.down = upload_matrix(w.down);
        l.attn_norm = upload_vector(w.attn_norm);
        l.mlp_norm = upload_vector(w.mlp_norm);
        if (!w.q_norm.empty()) l.q_norm = upload_vector(w.q_norm);
        if (!w.k_norm.empty()) l.k_norm = upload_vector(w.k_norm);
        if (!w.attn_post_norm.empty()) l.attn_post_norm = upload_vector(w.attn_post_norm);
        if (!w.mlp_post_norm.empty()) l.mlp_post_norm = upload_vector(w.mlp_post_norm);
        if (c_.attention_bias) {
            std::vector<float> bias = w.q_bias;
            bias.insert(bias.end(), w.k_bias.begin(), w.k_bias.end());
            bias.insert(bias.end(), w.v_bias.begin(), w.v_bias.end());
            l.qkv_bias = upload_vector(bias);
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
    const float* head_norm = upload_vector(std::vector<float>(c_.head_dim, 1.0f));
    const float* bias =
        c_.attention_bias ? upload_vector(std::vector<float>(qd + 2 * kvd, 0.0f)) : nullptr;
    for (uint64_t i = 0; i < c_.num_layers; ++i) {
        Layer l;
        const uint64_t qkv_rows[] = {qd, kvd, kvd}, gu_rows[] = {inter, inter};
        DeviceMatrix qkv[3], gu[2];
        const DeviceMatrix fused_qkv = random_group(qtype, qkv_rows, d, s, qkv);
        if (o_.fuse_products) l.qkv = fused_qkv;
        l.q = qkv[0], l.k = qkv[1], l.v = qkv[2];
        l.o = random_matrix(qtype, d, qd, ++s);
        const DeviceMatrix fused_gu = random_group(qtype, gu_rows, d, s, gu);
        if (o_.fuse_products) l.gate_up = fused_gu;
        l.gate = gu[0], l.up = gu[1];
        l.down = random_matrix(qtype, d, inter, ++s);
        l.attn_norm = l.mlp_norm = l.attn_post_norm = l.mlp_post_norm = norm;
        l.q_norm = l.k_norm = head_norm;
        l.qkv_bias = bias;
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
    ld_gu_ = pad32(2 * inter);
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
    gate_up_ = zeroed(batch_ * ld_gu_);
    argmax_scratch_ = DeviceBuffer<uint8_t>(uint64_t{8} * cuda::kArgmaxMaxParts);
    if (o_.split_attention_from <= c_.max_position_embeddings) {
        const uint32_t n = u32(std::min(batch_, cuda::kGemvMaxTokens));
        attention_ws_ = DeviceBuffer<float>(
            cuda::attention_workspace_floats(n, u32(c_.num_heads), u32(c_.head_dim)));
        attention_counters_ = DeviceBuffer<unsigned>(
            cuda::attention_counters(n, u32(c_.num_heads), u32(c_.num_kv_heads)));
        attention_counters_.fill_bytes(0);
    }
    logits_ = zeroed(batch_ * c_.vocab_size);
    cache_rows_ = DeviceBuffer<cuda::CacheRow>(batch_);
    step_ = DeviceBuffer<int32_t>(1 + batch_);
    step_.fill_bytes(0);
    history_ = DeviceBuffer<int32_t>(c_.max_position_embeddings + 1);
    fault_ = DeviceBuffer<int32_t>(1);
    fault_.fill_bytes(0);
    saturated_ = DeviceBuffer<unsigned long long>(1);
    saturated_.fill_bytes(0);

    // Matmul scratch, sized for the largest matrix, so nothing is allocated during a capture.
    std::vector<const DeviceMatrix*> all = {&embed_, &lm_head_};
    for (const Layer& l : layers_)
        for (const DeviceMatrix* m :
             {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.qkv, &l.gate_up})
            if (m->data) all.push_back(m);
    uint64_t max_kpad = 0, max_rows = 0, ws = 0;
    bool any_slab = false;
    const bool forced_mma = o_.forced_path == cuda::MatmulPath::mma;
    const uint64_t mma_m = forced_mma ? batch_ : std::min(batch_, cuda::kMmaMaxTokens);
    std::map<std::pair<uint64_t, uint64_t>, bool> seen;  // (qtype, k, rows) shapes planned
    for (const DeviceMatrix* m : all) {
        max_kpad = std::max(max_kpad, m->fmt.kpad);
        max_rows = std::max(max_rows, m->rows);
        // The cuBLAS path's slabs: dequantized rows, and bf16 rows widened to f32.
        any_slab = any_slab || m->fmt.quantized() || m->fmt.kind == cuda::WeightKind::bf16;
        const auto key =
            std::make_pair(m->fmt.kpad * 64 + static_cast<uint64_t>(m->fmt.qtype), m->rows);
        if (!m->fmt.quantized() || seen.count(key)) continue;
        seen[key] = true;
        ws = std::max(ws, cuda::mma_workspace_floats(m->fmt, m->rows, mma_m, sm_count_));
    }
    const bool batched = batch_ > cuda::kGemvMaxTokens || o_.forced_path.has_value();
    const auto scratch = cuda::matmul_scratch_size(batch_, max_kpad, max_rows);
    x16_ = DeviceBuffer<uint16_t>(scratch.x16_halves);  // the GEMV's activation scratch too
    if (batched) {
        if (any_slab) w16_ = DeviceBuffer<uint16_t>(scratch.w16_halves);
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
    mctx_.saturated = saturated_.get();
    mctx_.forced = o_.forced_path;
    mctx_.gemv_int8 = o_.int8_activations;
    mctx_.gemv_overlap = o_.overlap_launches && cc_major_ >= 9 && cuda::gemv_overlap_compiled();
    if (o_.gemv) {
        mctx_.gemv_tuning = *o_.gemv;
    } else if (const char* env = std::getenv("QFORGE_CUDA_GEMV"); env && *env) {
        if (!cuda::parse_gemv_tuning(env, mctx_.gemv_tuning))
            throw Error(std::string("QFORGE_CUDA_GEMV='") + env + "': expected steps=1 .. steps=4");
    }
}

void CudaEngine::ensure_rope(uint64_t positions) {
    if (positions <= rope_positions_) return;
    auto to_device = [](const std::vector<float>& v) {
        DeviceBuffer<float> b(v.size());
        b.upload(v);
        return b;
    };
    const RopeTable t(c_, positions);
    DeviceBuffer<float> cs = to_device(t.cos), sn = to_device(t.sin), cs_local, sn_local;
    if (c_.rope_local_theta > 0.0) {  // gemma3's sliding layers
        const RopeTable local(c_, positions, true);
        cs_local = to_device(local.cos);
        sn_local = to_device(local.sin);
    }
    QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    clear_graphs();  // they point at the old tables
    cos_ = std::move(cs);
    sin_ = std::move(sn);
    cos_local_ = std::move(cs_local);
    sin_local_ = std::move(sn_local);
    rope_positions_ = positions;
}

uint64_t CudaEngine::fp16_saturations() const {
    QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return saturated_.download().at(0);
}

std::unique_ptr<KvCache> CudaEngine::new_cache(uint64_t capacity) {
    if (capacity == 0 || capacity > c_.max_position_embeddings)
        throw Error(path_, {},
                    "a context of " + std::to_string(capacity) +
                        " positions is outside 1 .. max_position_embeddings (" +
                        std::to_string(c_.max_position_embeddings) + ")");
    return std::make_unique<CudaKvCache>(c_, capacity, next_cache_id_++);
}

std::unique_ptr<KvPool> CudaEngine::new_kv_pool(uint64_t blocks) const {
    return std::make_unique<CudaKvPool>(c_, blocks);
}

CudaKvCache::CudaKvCache(CudaKvPool& pool, std::vector<uint32_t> blocks, uint64_t capacity)
    : KvCache(capacity), kv_dim_(0), id_(0), pool_(&pool), blocks_(std::move(blocks)) {}

CudaKvCache::~CudaKvCache() {
    if (pool_) pool_->give_back(blocks_);
}

bool CudaKvCache::fits(const ModelConfig& c) const {
    return !pool_ ||
           (pool_->config().num_layers == c.num_layers && pool_->config().kv_dim() == c.kv_dim());
}

cuda::CacheRow CudaKvCache::row(uint64_t pos, const uint32_t* table) const {
    cuda::CacheRow r;
    r.pos = static_cast<int32_t>(pos);
    r.capacity = u32(capacity_);
    if (pool_) {
        r.k = pool_->data();
        r.blocks = table;
        r.block_halves = pool_->block_halves();
        r.block_shift = u32(CpuKvCache::kBlockShift);
    } else {
        r.k = keys(0);
        r.v = values(0);
        r.layer_stride = layer_stride();
    }
    return r;
}

CudaKvPool::CudaKvPool(const ModelConfig& c, uint64_t blocks)
    : c_(c),
      block_halves_(
          cuda::paged_block_halves(c.num_layers, u32(CpuKvCache::kBlockShift), c.kv_dim())),
      data_(kv_pool_bytes(2 * block_halves_, blocks) / 2),
      ids_(blocks) {}

std::unique_ptr<KvCache> CudaKvPool::take(uint64_t positions) {
    if (positions == 0 || positions > c_.max_position_embeddings)
        throw Error("KV block pool: a cache of " + std::to_string(positions) +
                    " positions is outside 1 .. max_position_embeddings (" +
                    std::to_string(c_.max_position_embeddings) + ")");
    // The cache first: were its allocation to throw, no block would be taken yet.
    auto cache = std::make_unique<CudaKvCache>(*this, std::vector<uint32_t>{}, positions);
    auto ids = ids_.allocate(CpuKvCache::blocks_for(positions));
    if (!ids) return nullptr;
    cache->blocks_ = std::move(*ids);
    return cache;
}

void CudaEngine::mm(const DeviceMatrix& w, const float* x, uint64_t ldx, uint64_t m, float* y,
                    uint64_t ldo, const float* bias, bool accumulate) {
    cuda::matmul(mctx_, w, x, ldx, m, {y, ldo, bias, accumulate});
}

uint64_t CudaEngine::decode_weight_bytes() const {
    uint64_t n = lm_head_.bytes();
    for (const Layer& l : layers_)
        n += l.q.bytes() + l.k.bytes() + l.v.bytes() + l.o.bytes() + l.gate.bytes() + l.up.bytes() +
             l.down.bytes();
    return n;
}

}  // namespace qforge

#endif  // QFORGE_HAVE_CUDA
