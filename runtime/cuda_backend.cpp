// The CUDA backend (cuda_backend.hpp) over the engine of runtime/cuda_engine.hpp.
#include "runtime/cuda_backend.hpp"

#include <chrono>
#include <vector>

#include "core/error.hpp"
#include "runtime/cuda_engine.hpp"

namespace qforge {

#ifdef QFORGE_HAVE_CUDA

CudaBackend::CudaBackend(const Model& model, CudaBackendOptions options)
    : model_(model), engine_(std::make_unique<CudaEngine>(model.config(), model.path(), options)) {
    engine_->upload(model);
}

CudaBackend::~CudaBackend() = default;

std::unique_ptr<KvCache> CudaBackend::new_cache(uint64_t capacity) const {
    return engine_->new_cache(capacity);
}

std::unique_ptr<KvPool> CudaBackend::new_kv_pool(uint64_t blocks) const {
    return engine_->new_kv_pool(blocks);
}

void CudaBackend::forward(std::span<const int32_t> tokens, KvCache& cache, uint64_t logits_from,
                          std::span<float> logits) {
    engine_->forward(tokens, cuda_cache(cache), logits_from, logits);
}

void CudaBackend::forward_batch(std::span<const BatchSequence> batch, std::span<float> logits) {
    engine_->forward_batch(batch, logits);
}

void CudaBackend::run_ops(std::span<const int32_t> tokens, KvCache& cache,
                          const std::function<void(OpsStep&)>& fn) {
    engine_->run_ops(tokens, cuda_cache(cache), fn);
}

std::vector<int32_t> CudaBackend::greedy_decode(KvCache& cache, int32_t first, uint64_t steps) {
    return engine_->greedy(cuda_cache(cache), first, steps);
}

uint64_t CudaBackend::fp16_saturations() const { return engine_->fp16_saturations(); }

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
                                                                        uint64_t steps,
                                                                        uint64_t from) {
    auto cache = engine_->new_cache(from + warmup + steps + 1);
    if (from > 0) {
        std::vector<int32_t> ids(from);
        for (uint64_t i = 0; i < from; ++i) ids[i] = static_cast<int32_t>((7 * i + 1) % 1000);
        engine_->forward(ids, cuda_cache(*cache), from, {});
    }
    DecodeTiming t;
    t.steps = steps;
    engine_->greedy(cuda_cache(*cache), 1, warmup + steps, warmup, &t.seconds);
    t.tokens_per_s = t.seconds > 0 ? static_cast<double>(steps) / t.seconds : 0.0;
    return t;
}

CudaSyntheticModel::DecodeTiming CudaSyntheticModel::time_batched_decode(uint64_t batch,
                                                                         uint64_t warmup,
                                                                         uint64_t steps,
                                                                         uint64_t from) {
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<int32_t> ids(std::max<uint64_t>(from, 1));
    for (uint64_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((7 * i + 1) % 1000);
    for (uint64_t b = 0; b < batch; ++b) {
        caches.push_back(engine_->new_cache(from + warmup + steps + 1));
        if (from > 0) engine_->forward(ids, cuda_cache(*caches.back()), from, {});
    }
    std::vector<int32_t> next(batch, 1);
    std::vector<BatchSequence> seqs;
    for (uint64_t b = 0; b < batch; ++b) seqs.push_back({{&next[b], 1}, caches[b].get(), true});
    std::vector<float> logits(batch * engine_->vocab_size());
    DecodeTiming t;
    t.steps = steps;
    std::chrono::steady_clock::time_point t0;
    for (uint64_t i = 0; i < warmup + steps; ++i) {
        if (i == warmup) t0 = std::chrono::steady_clock::now();
        engine_->forward_batch(seqs, logits);
        for (uint64_t b = 0; b < batch; ++b)  // a token of the vocabulary, varying per step
            next[b] = static_cast<int32_t>((13 * i + 5 * b + 1) % 1000);
    }
    t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.tokens_per_s = t.seconds > 0 ? static_cast<double>(batch * steps) / t.seconds : 0.0;
    return t;
}

double CudaSyntheticModel::time_prefill(uint64_t tokens, int reps) {
    std::vector<int32_t> ids(tokens);
    for (uint64_t i = 0; i < tokens; ++i) ids[i] = static_cast<int32_t>((7 * i + 1) % 1000);
    std::vector<float> logits(engine_->vocab_size());
    double best = 0.0;
    for (int r = 0; r <= reps; ++r) {
        auto cache = engine_->new_cache(tokens);
        const auto t0 = std::chrono::steady_clock::now();
        engine_->forward(ids, cuda_cache(*cache), tokens - 1, logits);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0 && (best == 0.0 || s < best)) best = s;  // run 0 warms up
    }
    return best > 0.0 ? static_cast<double>(tokens) / best : 0.0;
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
std::unique_ptr<KvPool> CudaBackend::new_kv_pool(uint64_t) const { no_cuda(); }
void CudaBackend::forward(std::span<const int32_t>, KvCache&, uint64_t, std::span<float>) {
    no_cuda();
}
void CudaBackend::forward_batch(std::span<const BatchSequence>, std::span<float>) { no_cuda(); }
void CudaBackend::run_ops(std::span<const int32_t>, KvCache&,
                          const std::function<void(OpsStep&)>&) {
    no_cuda();
}
std::vector<int32_t> CudaBackend::greedy_decode(KvCache&, int32_t, uint64_t) { no_cuda(); }
uint64_t CudaBackend::fp16_saturations() const { no_cuda(); }
std::string CudaBackend::device_description() const { no_cuda(); }
CudaSyntheticModel::CudaSyntheticModel(const ModelConfig&, QType, uint64_t, CudaBackendOptions) {
    no_cuda();
}
CudaSyntheticModel::~CudaSyntheticModel() = default;
uint64_t CudaSyntheticModel::decode_weight_bytes() const { no_cuda(); }
uint64_t CudaSyntheticModel::weight_bytes() const { no_cuda(); }
CudaSyntheticModel::DecodeTiming CudaSyntheticModel::time_greedy_decode(uint64_t, uint64_t,
                                                                        uint64_t) {
    no_cuda();
}
CudaSyntheticModel::DecodeTiming CudaSyntheticModel::time_batched_decode(uint64_t, uint64_t,
                                                                         uint64_t, uint64_t) {
    no_cuda();
}
double CudaSyntheticModel::time_prefill(uint64_t, int) { no_cuda(); }

#endif

std::unique_ptr<Backend> make_cuda_backend(const Model& model, CudaBackendOptions options) {
    return std::make_unique<CudaBackend>(model, options);
}

}  // namespace qforge
