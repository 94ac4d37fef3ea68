// The scheduler on the CUDA backend's batched step (CudaBackend::forward_batch: a step's decode
// tokens as one batch, each row the bits of its decode alone; prompts whole, on their own), as
// `qforge serve --backend cuda` runs it: requests at random arrival on stories260K, greedy and
// sampled, give generate()'s tokens on the same backend, and the budget of device caches is
// whole at the end, with paged caches from the device pool and with a cache per sequence. In the
// GPU check's build (no tokenizer or converter: stories260K.qf from $QFORGE_GPU_CHECK_DATA, which
// scripts/fetch_gpu_check_deps.sh makes) and the full one; skipped with a printed reason without a
// GPU or that file.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "kernels/device_info.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/model.hpp"
#include "runtime/paged_kv_cache.hpp"
#include "serve/cache_source.hpp"
#include "serve/scheduler.hpp"
#include "serve_check.hpp"
#include "test_support.hpp"

namespace cuda_serve_test {

using namespace qforge;

TEST_CASE("scheduler on the CUDA backend's batched step gives generate's tokens",
          "[cuda][scheduler]") {
#ifndef QFORGE_HAVE_CUDA
    QF_SKIP("no CUDA device: qforge was built without CUDA");
#else
    std::string why;
    if (list_gpus(&why).empty()) QF_SKIP("no CUDA device: " + why);
    const char* env = std::getenv("QFORGE_GPU_CHECK_DATA");
    const std::filesystem::path path =
        env ? std::filesystem::path(env) / "stories260K.qf" : std::filesystem::path();
    if (!env || !std::filesystem::exists(path))
        QF_SKIP(
            "QFORGE_GPU_CHECK_DATA/stories260K.qf is absent (scripts/fetch_gpu_check_deps.sh makes "
            "it)");
    Model model(path.string());
    auto backend = make_cuda_backend(model);
    // Caches for about four requests at once, eight slots, whole prompts (cmd_serve's settings
    // for CUDA): steps of up to eight decode rows beside the prompts that arrive. Prompts of up
    // to 100 tokens, so many sequences span two blocks of their table.
    // Paged caches in the device pool (Backend::new_kv_pool, as cmd_serve makes), or a cache
    // of its own per sequence (BackendCacheSource).
    const bool pooled = GENERATE(true, false);
    INFO((pooled ? "the device pool" : "a cache per sequence"));
    const uint64_t blocks = 4 * CpuKvCache::blocks_for(110);
    std::unique_ptr<serve::KvCacheSource> caches;
    if (pooled)
        caches = std::make_unique<serve::PoolCacheSource>(backend->new_kv_pool(blocks));
    else
        caches = std::make_unique<serve::BackendCacheSource>(*backend, blocks);
    serve::SchedulerOptions so{8, 128, 64, 3};
    so.whole_prompts = true;
    serve::Scheduler sched(*backend, *caches, so);
    std::mt19937_64 rng(23);
    CHECK(test::check_random_arrivals(*backend, sched, 24, rng, 100) < 24 * 11);  // shared steps
    CHECK(caches->free_blocks() == caches->total_blocks());
#endif
}

}  // namespace cuda_serve_test
