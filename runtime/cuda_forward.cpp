// The CUDA engine's forward pass: runtime/transformer.hpp's operations as launches, the decode
// graphs, forward and greedy decoding (cuda_engine.hpp). Positions and token ids are read by the
// kernels from a small device buffer (step_: [0] the first position, [1..] the token ids), so
// one captured graph serves every decode step of a cache.
#include "runtime/cuda_engine.hpp"

#ifdef QFORGE_HAVE_CUDA

namespace qforge {

const DeviceMatrix& CudaEngine::weight(uint64_t layer, Weight w) const {
    if (w == Weight::lm_head) return lm_head_;
    const Layer& l = layers_.at(layer);
    const DeviceMatrix* m[kBlockLinears] = {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down};
    return *m[static_cast<int>(w)];
}

void CudaEngine::embed(const int32_t* tokens, uint64_t n, Rows out) {
    mctx_.prepared = {};
    cuda::embed_rows_launch(cuda::to_rows_params(embed_), tokens, u32(n), u32(c_.hidden_size),
                            out.data, out.ld, stream_);
}

const float* CudaEngine::norm_weight(uint64_t layer, Norm which) const {
    const float* w = nullptr;
    if (which == Norm::final) {
        w = final_norm_;
    } else {
        const Layer& l = layers_.at(layer);
        const float* by_role[kNorms] = {l.attn_norm, l.mlp_norm,       nullptr,        l.q_norm,
                                        l.k_norm,    l.attn_post_norm, l.mlp_post_norm};
        w = by_role[static_cast<int>(which)];
    }
    if (!w)
        throw Error("cuda backend: norm " + std::to_string(static_cast<int>(which)) + " of layer " +
                    std::to_string(layer) + " is not uploaded");
    return w;
}

const DeviceMatrix* CudaEngine::norm_consumer(uint64_t layer, Norm which) const {
    if (which == Norm::final) return &lm_head_;
    if (which != Norm::attn && which != Norm::mlp) return nullptr;
    const Layer& l = layers_.at(layer);
    if (which == Norm::attn) return l.qkv.data ? &l.qkv : &l.q;
    return l.gate_up.data ? &l.gate_up : &l.gate;
}

const cuda::Int8Rows* CudaEngine::fused_int8(const DeviceMatrix* consumer, uint64_t n,
                                             cuda::Int8Rows& q) const {
    if (!consumer || !o_.fuse_products || !o_.int8_activations || !consumer->fmt.quantized() ||
        n > cuda::kGemvMaxTokens || (o_.forced_path && *o_.forced_path != cuda::MatmulPath::gemv))
        return nullptr;
    q = cuda::gemv_int8_scratch(reinterpret_cast<float*>(x16_.get()), consumer->fmt.chunks);
    return &q;
}

void CudaEngine::norm(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) {
    mctx_.prepared = {};
    const float* w = norm_weight(layer, which);
    // One launch: a block per token and group (QK-norm: per head). Before a GEMV of quantized
    // weights it also writes the GEMV's int8 blocks of its output (matmul.hpp: PreparedRows).
    const NormShape shape = norm_shape(c_, which);
    cuda::Int8Rows q;
    const DeviceMatrix* consumer = shape.groups == 1 ? norm_consumer(layer, which) : nullptr;
    const cuda::Int8Rows* fused = fused_int8(consumer, n, q);
    cuda::rms_norm_launch(in.data, in.ld, w, c_.rms_norm_eps, u32(n), u32(shape.width), out.data,
                          out.ld, stream_, u32(shape.groups), fused);
    if (fused) mctx_.prepared = {out.data, out.ld, n, consumer->fmt.chunks, true};
}

void CudaEngine::norm_add(uint64_t layer, Norm which, Rows in, Rows out, uint64_t n) {
    mctx_.prepared = {};
    const float* w = norm_weight(layer, which);
    if (in.data == out.data) throw Error("cuda backend: norm_add's output is its input");
    const NormShape shape = norm_shape(c_, which);
    cuda::rms_norm_add_launch(in.data, in.ld, w, c_.rms_norm_eps, u32(n), u32(shape.width),
                              out.data, out.ld, stream_, u32(shape.groups));
}

void CudaEngine::scale(Rows rows, uint64_t n, uint64_t width, float s) {
    mctx_.prepared = {};
    cuda::scale_rows_launch(rows.data, rows.ld, u32(n), u32(width), s, stream_);
}

void CudaEngine::softcap(Rows rows, uint64_t n, uint64_t width, float cap) {
    mctx_.prepared = {};
    cuda::softcap_rows_launch(rows.data, rows.ld, u32(n), u32(width), cap, stream_);
}

void CudaEngine::products(uint64_t layer, Rows in, std::span<const Product> parts, uint64_t n) {
    // q, k and v into one [q | k | v] row: one launch of their fused matrix when they have one.
    if (parts.size() == 3 && parts[0].weight == Weight::q && parts[1].weight == Weight::k &&
        parts[2].weight == Weight::v) {
        const Layer& l = layers_.at(layer);
        const bool same = parts[1].out.data == parts[0].out.data + l.q.rows &&
                          parts[2].out.data == parts[1].out.data + l.k.rows &&
                          parts[0].out.ld == parts[1].out.ld && parts[0].out.ld == parts[2].out.ld;
        bool alike = true;
        for (const Product& p : parts)
            alike = alike && p.accumulate == parts[0].accumulate && p.bias == parts[0].bias;
        if (l.qkv.data && same && alike) {
            mm(l.qkv, in.data, in.ld, n, parts[0].out.data, parts[0].out.ld,
               parts[0].bias ? l.qkv_bias : nullptr, parts[0].accumulate);
            return;
        }
    }
    for (const Product& p : parts) {
        const float* bias = nullptr;
        if (p.bias && p.weight <= Weight::v) {
            const Layer& l = layers_.at(layer);
            bias = p.weight == Weight::q   ? l.qkv_bias
                   : p.weight == Weight::k ? l.qkv_bias + l.q.rows
                                           : l.qkv_bias + l.q.rows + l.k.rows;
        }
        mm(weight(layer, p.weight), in.data, in.ld, n, p.out.data, p.out.ld, bias, p.accumulate);
    }
}

void CudaEngine::attention(uint64_t layer, Rows q, Rows k, Rows v, Rows out, uint64_t n) {
    mctx_.prepared = {};
    // The kernels read q, k and v from one buffer: [q | k | v] rows of ld_qkv_ floats.
    const uint64_t qd = c_.q_dim(), kvd = c_.kv_dim();
    if (k.data != q.data + qd || v.data != q.data + qd + kvd || q.ld != ld_qkv_ || k.ld != q.ld ||
        v.ld != q.ld)
        throw Error("cuda backend: attention needs q, k and v in one [q | k | v] buffer");
    cuda::RopeParams rp;
    rp.ld = q.ld;
    rp.heads = u32(c_.num_heads);
    rp.kv_heads = u32(c_.num_kv_heads);
    rp.head_dim = u32(c_.head_dim);
    // gemma3's sliding layers rotate with their own base (ensure_rope made their table).
    const bool local = c_.local_rope(layer);
    rp.cos = local ? cos_local_.get() : cos_.get();
    rp.sin = local ? sin_local_.get() : sin_.get();
    if (batch_rows_) {  // a batched step: each row's own cache and position
        rp.layer = u32(layer);
        rp.capacity = u32(batch_capacity_);
    } else {
        rp.pos0 = step_.get();
        rp.k_cache = cache_->keys(layer);
        rp.v_cache = cache_->values(layer);
        rp.capacity = u32(cache_->capacity());
    }
    rp.fault = fault_.get();
    rp.saturated = saturated_.get();
    cuda::AttentionParams ap;
    ap.ld = q.ld;
    ap.heads = rp.heads;
    ap.kv_heads = rp.kv_heads;
    ap.head_dim = rp.head_dim;
    ap.k_cache = rp.k_cache;
    ap.v_cache = rp.v_cache;
    ap.pos0 = rp.pos0;
    ap.layer = rp.layer;
    ap.ldo = out.ld;
    ap.window = u32(c_.attention_window(layer));
    ap.scale = desc_.query_scale;
    ap.softcap = desc_.attn_softcap;
    ap.capacity = rp.capacity;
    ap.fault = rp.fault;
    const Layer& l = layers_.at(layer);
    // Launches of at most kGemvMaxTokens rows when batched (the split form's workspace holds
    // that many), so every row takes the form and slices its decode alone takes.
    const uint64_t per = decode_rows_ ? cuda::kGemvMaxTokens : n;
    for (uint64_t t0 = 0; t0 < n; t0 += per) {
        const uint64_t m = std::min(per, n - t0);
        rp.qkv = q.data + t0 * q.ld;
        rp.n = u32(m);
        if (batch_rows_) rp.rows = batch_rows_ + t0;
        cuda::rope_store_kv_launch(rp, stream_);
        ap.qkv = rp.qkv;
        ap.n = rp.n;
        ap.rows = rp.rows;
        ap.out = out.data + t0 * out.ld;
        // Before the o product's GEMV it also writes that GEMV's int8 blocks of its output (one
        // launch for all the rows only).
        cuda::Int8Rows q8;
        const cuda::Int8Rows* fused =
            m == n && dims_per_lane_ == 4 && c_.head_dim % 32 == 0 && out.data == att_.get()
                ? fused_int8(&l.o, n, q8)
                : nullptr;
        ap.q8 = fused ? *fused : cuda::Int8Rows{};
        ap.split_len = 0;
        if (rp.capacity >= o_.split_attention_from && m <= cuda::kGemvMaxTokens) {
            ap.split_len = cuda::attention_split_len(rp.capacity);
            ap.workspace = attention_ws_.get();
            ap.counters = attention_counters_.get();
        }
        cuda::attention_launch(ap, dims_per_lane_, stream_);
        if (fused) mctx_.prepared = {out.data, out.ld, n, l.o.fmt.chunks, true};
    }
}

void CudaEngine::gated_products(uint64_t layer, Rows in, Activation act, Rows out, uint64_t n) {
    if (act != Activation::silu && act != Activation::gelu_tanh)
        throw Error("cuda backend: unknown activation " + std::to_string(static_cast<int>(act)));
    // gate and up of a token side by side in gate_up_ ([gate | up], rows ld_gu_ apart): one
    // launch of their fused matrix when they have one.
    const Layer& l = layers_.at(layer);
    float* gu = gate_up_.get();
    const uint64_t inter = c_.intermediate_size;
    if (l.gate_up.data) {
        mm(l.gate_up, in.data, in.ld, n, gu, ld_gu_, nullptr, false);
    } else {
        mm(l.gate, in.data, in.ld, n, gu, ld_gu_, nullptr, false);
        mm(l.up, in.data, in.ld, n, gu + inter, ld_gu_, nullptr, false);
    }
    // The memo holds `in`'s preparation: not once `out` has been written over `in`.
    if (out.data < in.data + n * in.ld && in.data < out.data + n * out.ld) mctx_.prepared = {};
    if (act == Activation::silu) {
        // Before the down product's GEMV it also writes that GEMV's int8 blocks of its output.
        cuda::Int8Rows q;
        const cuda::Int8Rows* fused = fused_int8(&l.down, n, q);
        cuda::swiglu_launch(gu, gu + inter, ld_gu_, out.data, out.ld, u32(n), u32(inter), stream_,
                            fused);
        if (fused) mctx_.prepared = {out.data, out.ld, n, l.down.fmt.chunks, true};
    } else
        cuda::geglu_tanh_launch(gu, gu + inter, ld_gu_, out.data, out.ld, u32(n), u32(inter),
                                stream_);
}

BlockActivations CudaEngine::step_rows() const {
    const uint64_t qd = c_.q_dim(), kvd = c_.kv_dim();
    float* qkv = qkv_.get();
    return {{x_.get(), ld_d_},   {h_.get(), ld_d_},         {qkv, ld_qkv_},
            {qkv + qd, ld_qkv_}, {qkv + qd + kvd, ld_qkv_}, {att_.get(), ld_q_},
            {gate_.get(), ld_i_}};
}

void CudaEngine::upload_step(const int32_t* tokens, uint64_t m, uint64_t pos0) {
    staging_[0] = static_cast<int32_t>(pos0);
    std::memcpy(staging_ + 1, tokens, m * sizeof(int32_t));
    QF_CUDA_CHECK(cudaMemcpyAsync(step_.get(), staging_, (1 + m) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
}

void CudaEngine::upload_rows(std::span<const CudaKvCache* const> caches,
                             std::span<const uint64_t> pos) {
    const uint64_t m = caches.size();
    if (m > batch_) throw Error("cuda backend: a step of " + std::to_string(m) + " rows");
    // Each paged cache's table once (a prompt's rows share their cache's), sized first: the
    // rows point into tables_.
    std::vector<const CudaKvCache*> paged;
    std::vector<size_t> table_of(m);  // row i's cache's index in `paged`
    uint64_t entries = 0;
    for (uint64_t i = 0; i < m; ++i) {
        const CudaKvCache* c = caches[i];
        if (!c->paged()) continue;
        if (!c->fits(c_))
            throw Error(
                "cuda backend: a paged KV cache from the pool of a model with other "
                "layers or KV width");
        const auto it = std::find(paged.begin(), paged.end(), c);
        table_of[i] = static_cast<size_t>(it - paged.begin());
        if (it == paged.end()) {
            paged.push_back(c);
            entries += c->blocks().size();
        }
    }
    if (entries > tables_size_) {  // no copy is in flight: every step ends synchronized, a
                                   // failed one too (its catch waits for the stream)
        const uint64_t size = std::max(entries, 2 * tables_size_);
        if (tables_host_) QF_CUDA_CHECK(cudaFreeHost(tables_host_));
        tables_host_ = nullptr;
        tables_size_ = 0;
        tables_ = DeviceBuffer<uint32_t>(size);
        QF_CUDA_CHECK(
            cudaMallocHost(reinterpret_cast<void**>(&tables_host_), size * sizeof(uint32_t)));
        tables_size_ = size;
    }
    std::vector<uint64_t> at(paged.size());
    for (uint64_t i = 0, used = 0; i < paged.size(); ++i) {
        at[i] = used;
        std::copy(paged[i]->blocks().begin(), paged[i]->blocks().end(), tables_host_ + used);
        used += paged[i]->blocks().size();
    }
    batch_capacity_ = 0;
    for (uint64_t i = 0; i < m; ++i) {
        const uint32_t* table = caches[i]->paged() ? tables_.get() + at[table_of[i]] : nullptr;
        cache_rows_host_[i] = caches[i]->row(pos[i], table);
        batch_capacity_ = std::max(batch_capacity_, caches[i]->capacity());
    }
    if (entries)
        QF_CUDA_CHECK(cudaMemcpyAsync(tables_.get(), tables_host_, entries * sizeof(uint32_t),
                                      cudaMemcpyHostToDevice, stream_));
    QF_CUDA_CHECK(cudaMemcpyAsync(cache_rows_.get(), cache_rows_host_, m * sizeof(cuda::CacheRow),
                                  cudaMemcpyHostToDevice, stream_));
    batch_rows_ = cache_rows_.get();
}

void CudaEngine::enqueue(uint64_t m, const CudaKvCache& cache, uint64_t lf) {
    const BlockActivations a = step_rows();
    cache_ = &cache;
    // Token ids are on the device, after the first position (step_).
    run_model(*this, desc_, c_.num_layers, step_.get() + 1, m, a, lf,
              {logits_.get(), c_.vocab_size});
    cache_ = nullptr;
}

void CudaEngine::enqueue_greedy_step(const CudaKvCache& cache) {
    enqueue(1, cache, 0);
    int32_t* next = step_.get() + 1;
    cuda::argmax_rows_launch(logits_.get(), c_.vocab_size, 1, u32(c_.vocab_size), next,
                             argmax_scratch_.get(), stream_);
    cuda::record_token_launch(next, step_.get(), history_.get(), u32(history_.size()), fault_.get(),
                              stream_);
}

void CudaEngine::launch_graph(const CudaKvCache& cache, Graph kind) {
    if (cache.paged()) throw Error("cuda backend: no graph for a paged cache");
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

void CudaEngine::enqueue_fault_copy() {
    QF_CUDA_CHECK(cudaMemcpyAsync(fault_host_, fault_.get(), sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream_));
}

void CudaEngine::check_fault(const CudaKvCache& cache) {
    check_fault("the KV cache's " + std::to_string(cache.capacity()) + " positions");
}

void CudaEngine::check_fault(const std::string& bound) {
    if (*fault_host_ == 0) return;
    *fault_host_ = 0;
    fault_.fill_bytes(0);  // the engine stays usable for a correct step
    throw Error(path_, {},
                "cuda backend: a kernel was given a position outside " + bound +
                    " (the device-side bound); the step's results are invalid");
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
    check_tokens(tokens);
    ensure_rope(cache.capacity());

    for (uint64_t start = 0; start < n; start += batch_) {
        const uint64_t m = std::min(batch_, n - start);
        const uint64_t first = std::max(start, logits_from);  // logits rows [first, start + m)
        const uint64_t lf = first < start + m ? first - start : m;
        const uint64_t pos0 = cache.size();
        upload_step(tokens.data() + start, m, pos0);
        if (cache.paged()) {  // every row through the cache's block table (no graph)
            std::vector<const CudaKvCache*> rows(m, &cache);
            std::vector<uint64_t> pos(m);
            for (uint64_t t = 0; t < m; ++t) pos[t] = pos0 + t;
            upload_rows(rows, pos);
            try {
                enqueue(m, cache, lf);
            } catch (...) {
                // The step's copies may be queued still: wait for them before the host buffers
                // (and the cache's blocks, which the caller may give back) are reused.
                (void)cudaStreamSynchronize(stream_);
                batch_rows_ = nullptr;
                batch_capacity_ = 0;
                throw;
            }
            batch_rows_ = nullptr;
            batch_capacity_ = 0;
        } else if (m == 1 && o_.use_graphs && !cuda::sync_launches()) {
            launch_graph(cache, lf == 0 ? Graph::decode_logits : Graph::decode_no_logits);
        } else {
            enqueue(m, cache, lf);
        }
        if (lf < m)
            QF_CUDA_CHECK(cudaMemcpyAsync(logits.data() + (first - logits_from) * v, logits_.get(),
                                          (m - lf) * v * sizeof(float), cudaMemcpyDeviceToHost,
                                          stream_));
        enqueue_fault_copy();
        // Also keeps staging_ untouched until its copy has run.
        QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
        check_fault(cache);
        cache.set_size(pos0 + m);
    }
}

void CudaEngine::forward_batch(std::span<const BatchSequence> batch, std::span<float> logits) {
    // Everything is checked before any cache changes.
    const uint64_t v = c_.vocab_size;
    std::vector<int64_t> slot(batch.size(), -1);
    std::vector<const CudaKvCache*> caches;
    uint64_t wanted = 0, capacity = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const BatchSequence& s = batch[i];
        if (!s.cache || s.tokens.empty())
            throw Error("forward_batch: a sequence without a cache or tokens");
        const CudaKvCache& cache = cuda_cache(*s.cache);
        if (std::find(caches.begin(), caches.end(), &cache) != caches.end())
            throw Error("forward_batch: a KV cache appears twice");
        caches.push_back(&cache);
        if (cache.size() + s.tokens.size() > cache.capacity())
            throw Error(path_, {},
                        "context is full: " + std::to_string(cache.size()) + " + " +
                            std::to_string(s.tokens.size()) + " tokens exceed the context of " +
                            std::to_string(cache.capacity()));
        check_tokens(s.tokens);
        if (s.logit_rows() > 0) slot[i] = static_cast<int64_t>(wanted);
        wanted += s.logit_rows();
        capacity = std::max(capacity, cache.capacity());
    }
    if (logits.size() != wanted * v)
        throw Error("forward_batch: logits hold " + std::to_string(logits.size()) +
                    " floats, expected " + std::to_string(wanted * v));
    ensure_rope(capacity);
    // Single tokens grouped by the attention form their caches take alone (one block per head,
    // or the split form's slice length: the same slices, so the same bits; a smaller cache in
    // the group only has more empty slices, which the merge skips), in passes of at most batch_
    // rows; prompts one by one.
    // Sequence i through forward() on its own, its logits rows (if wanted) from its slot on.
    auto alone = [&](size_t i) {
        const BatchSequence& s = batch[i];
        const uint64_t n = s.tokens.size(), rows = s.logit_rows();
        forward(s.tokens, cuda_cache(*s.cache), n - rows,
                rows ? logits.subspan(static_cast<uint64_t>(slot[i]) * v, rows * v)
                     : std::span<float>{});
    };
    // Alone too: every row when a test forces another path than the GEMV for every product (its
    // bits depend on the rows), and a group of one (the captured decode graph, the same bits).
    const bool forced = mctx_.forced && *mctx_.forced != cuda::MatmulPath::gemv;
    std::map<uint64_t, std::vector<size_t>> groups;
    for (size_t i = 0; i < batch.size(); ++i) {
        const uint64_t cap = batch[i].cache->capacity();
        if (batch[i].tokens.size() == 1 && !forced)
            groups[cap >= o_.split_attention_from ? cuda::attention_split_len(u32(cap)) : 0]
                .push_back(i);
        else
            alone(i);
    }
    for (const auto& [form, members] : groups)
        for (size_t p0 = 0; p0 < members.size(); p0 += batch_) {
            const size_t p1 = std::min(members.size(), p0 + batch_);
            if (p1 - p0 == 1) {
                alone(members[p0]);
                continue;
            }
            std::vector<const BatchSequence*> seqs;
            std::vector<int64_t> slots;
            for (size_t j = p0; j < p1; ++j) {
                seqs.push_back(&batch[members[j]]);
                slots.push_back(slot[members[j]]);
            }
            batched_step(seqs, slots, logits);
        }
}

void CudaEngine::batched_step(std::span<const BatchSequence* const> seqs,
                              std::span<const int64_t> slots, std::span<float> out) {
    const uint64_t m = seqs.size(), v = c_.vocab_size;
    std::vector<int32_t> tokens(m);
    std::vector<const CudaKvCache*> caches(m);
    std::vector<uint64_t> pos(m);
    for (uint64_t i = 0; i < m; ++i) {
        caches[i] = &cuda_cache(*seqs[i]->cache);
        tokens[i] = seqs[i]->tokens[0];
        pos[i] = caches[i]->size();
    }
    upload_step(tokens.data(), m, 0);  // the ids; positions are the rows'
    // The products on the GEMV with a lone token's threads (plans.hpp: GemvTuning).
    const auto saved_forced = mctx_.forced;
    const cuda::GemvTuning saved_tuning = mctx_.gemv_tuning;
    mctx_.forced = cuda::MatmulPath::gemv;
    mctx_.gemv_tuning.one_token_threads = true;
    decode_rows_ = true;
    auto restore = [&] {
        mctx_.forced = saved_forced;
        mctx_.gemv_tuning = saved_tuning;
        mctx_.prepared = {};
        batch_rows_ = nullptr;
        batch_capacity_ = 0;
        decode_rows_ = false;
    };
    try {
        // The largest capacity: the split form's slices cover it (forward_batch).
        upload_rows(caches, pos);
        run_model(*this, desc_, c_.num_layers, step_.get() + 1, m, step_rows(), 0,
                  {logits_.get(), v});
        // Each wanted row's logits to its slot, runs of consecutive slots in one copy.
        for (uint64_t i = 0; i < m;) {
            if (slots[i] < 0) {
                ++i;
                continue;
            }
            uint64_t e = i + 1;
            while (e < m && slots[e] == slots[e - 1] + 1) ++e;
            QF_CUDA_CHECK(cudaMemcpyAsync(out.data() + static_cast<uint64_t>(slots[i]) * v,
                                          logits_.get() + i * v, (e - i) * v * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_));
            i = e;
        }
        enqueue_fault_copy();
        // Also keeps staging_ and cache_rows_host_ untouched until their copies have run.
        QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    } catch (...) {
        (void)cudaStreamSynchronize(stream_);  // as forward()'s paged branch: nothing queued
        restore();                             // reads a buffer after this
        throw;
    }
    restore();
    if (*fault_host_ != 0) {  // which row is not known on the host: name the step's bounds
        uint64_t lo = UINT64_MAX, hi = 0;
        for (const BatchSequence* s : seqs) {
            lo = std::min(lo, s->cache->capacity());
            hi = std::max(hi, s->cache->capacity());
        }
        check_fault("its row's KV cache (a batched step of " + std::to_string(m) +
                    " sequences, caches of " + std::to_string(lo) +
                    (hi == lo ? "" : " to " + std::to_string(hi)) + " positions)");
    }
    for (const BatchSequence* s : seqs) {
        auto& cache = cuda_cache(*s->cache);
        cache.set_size(cache.size() + 1);
    }
}

namespace {
// Device rows: the CUDA engine's op-level step (backend.hpp). Copies synchronize the stream, so
// a read sees every operation enqueued before it.
class CudaOpsStep final : public OpsStep {
  public:
    CudaOpsStep(ForwardOps& ops, const BlockActivations& rows, Rows logits, const int32_t* tokens,
                cudaStream_t stream, cuda::PreparedRows& prepared)
        : ops_(ops),
          rows_(rows),
          logits_(logits),
          tokens_(tokens),
          stream_(stream),
          prepared_(prepared) {}
    ForwardOps& ops() override { return ops_; }
    const BlockActivations& rows() const override { return rows_; }
    Rows logits() const override { return logits_; }
    const int32_t* tokens() const override { return tokens_; }
    void write(Rows dst, const float* src, uint64_t n, uint64_t width) override {
        prepared_ = {};  // the rows a GEMV preparation was made from may be these
        QF_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst.ld * sizeof(float), src,
                                        width * sizeof(float), width * sizeof(float), n,
                                        cudaMemcpyHostToDevice, stream_));
        QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void read(Rows src, float* dst, uint64_t n, uint64_t width) override {
        QF_CUDA_CHECK(cudaMemcpy2DAsync(dst, width * sizeof(float), src.data,
                                        src.ld * sizeof(float), width * sizeof(float), n,
                                        cudaMemcpyDeviceToHost, stream_));
        QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

  private:
    ForwardOps& ops_;
    BlockActivations rows_;
    Rows logits_;
    const int32_t* tokens_;
    cudaStream_t stream_;
    cuda::PreparedRows& prepared_;
};
}  // namespace

void CudaEngine::run_ops(std::span<const int32_t> tokens, CudaKvCache& cache,
                         const std::function<void(OpsStep&)>& fn) {
    const uint64_t n = tokens.size(), pos0 = cache.size();
    if (cache.paged()) throw Error("cuda backend: run_ops takes a contiguous cache (new_cache)");
    if (n > batch_ || pos0 + n > cache.capacity())
        throw Error("cuda backend: run_ops takes one step of at most " + std::to_string(batch_) +
                    " tokens that fits the cache");
    check_tokens(tokens);
    ensure_rope(cache.capacity());
    upload_step(tokens.data(), n, pos0);
    QF_CUDA_CHECK(cudaStreamSynchronize(stream_));  // staging_ is reused by the next step
    mctx_.prepared = {};
    CudaOpsStep step(*this, step_rows(), {logits_.get(), c_.vocab_size}, step_.get() + 1, stream_,
                     mctx_.prepared);
    cache_ = &cache;
    try {
        fn(step);
        enqueue_fault_copy();
        QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
        check_fault(cache);
    } catch (...) {
        cache_ = nullptr;
        throw;
    }
    cache_ = nullptr;
    cache.set_size(pos0 + n);
}

std::vector<int32_t> CudaEngine::greedy(CudaKvCache& cache, int32_t first, uint64_t steps,
                                        uint64_t warmup, double* seconds) {
    const int32_t one[] = {first};
    check_tokens(one);
    if (cache.paged())
        throw Error("cuda backend: greedy decoding takes a contiguous cache (new_cache)");
    if (cache.size() + steps > cache.capacity())
        throw Error(path_, {},
                    "context is full: " + std::to_string(cache.size()) + " + " +
                        std::to_string(steps) + " tokens exceed the context of " +
                        std::to_string(cache.capacity()));
    ensure_rope(cache.capacity());
    const uint64_t pos0 = cache.size();
    staging_[0] = static_cast<int32_t>(pos0);
    staging_[1] = first;
    QF_CUDA_CHECK(cudaMemcpyAsync(step_.get(), staging_, 2 * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
    cuda::Event start, stop;
    for (uint64_t i = 0; i < steps; ++i) {
        if (i == warmup) start.record(stream_);
        if (o_.use_graphs && !cuda::sync_launches())
            launch_graph(cache, Graph::greedy);
        else
            enqueue_greedy_step(cache);
    }
    stop.record(stream_);
    enqueue_fault_copy();
    QF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    check_fault(cache);
    if (seconds) *seconds = warmup < steps ? stop.ms_since(start) / 1000.0 : 0.0;
    cache.set_size(pos0 + steps);
    return history_.download(steps, pos0);
}

}  // namespace qforge

#endif  // QFORGE_HAVE_CUDA
