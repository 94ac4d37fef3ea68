// qforge serve: the OpenAI-compatible HTTP server (serve/). Parses the options, loads the model,
// sizes the KV block pool, starts the scheduler thread and the HTTP server, prints the log lines
// the library hands back, and stops cleanly on SIGINT / SIGTERM.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/progress.hpp"
#include "runtime/backend.hpp"
#include "runtime/model.hpp"
#include "runtime/paged_kv_cache.hpp"
#include "runtime/thread_pool.hpp"
#include "serve/cache_source.hpp"
#include "serve/http_server.hpp"
#include "serve/scheduler.hpp"
#include "tokenizer/tokenizer.hpp"

namespace qforge::cli {

namespace {

volatile std::sig_atomic_t g_stop_requested = 0;
extern "C" void on_stop_signal(int) { g_stop_requested = 1; }

bool is_loopback(const std::string& host) {
    return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

Runner register_serve(CLI::App& app, CommonOptions& common) {
    struct Args {
        std::string model, host = "127.0.0.1", api_key, chat_template, served_name;
        std::vector<std::string> allowed_origins;
        int port = 8080;
        uint64_t max_seqs = 16, ctx = 4096, kv_blocks = 0, max_queue = 64, prefill_chunk = 64;
        uint64_t prefix_caches = 16;
        int read_timeout = 10;
        uint64_t max_body = 1 << 20;
    };
    auto a = std::make_shared<Args>();
    add_model_input(app, "model", a->model)->required();
    app.add_option("--host", a->host, "address to listen on (loopback unless told otherwise)")
        ->capture_default_str();
    add_int_option(app, "--port", a->port, 0, 65535, "TCP port (0: any free port, printed)");
    add_int_option(app, "--max-seqs", a->max_seqs, 1, 256, "sequences decoded together at most");
    add_int_option(app, "--ctx", a->ctx, 1, uint64_t{1} << 24,
                   "positions per request (prompt + generated); at most the model's context");
    add_int_option(app, "--kv-blocks", a->kv_blocks, 0, uint64_t{1} << 32,
                   "KV cache blocks of " + std::to_string(CpuKvCache::kBlockPositions) +
                       " positions in the shared pool (0: max-seqs x ctx / 4 positions, at least "
                       "one full context)");
    add_int_option(app, "--max-queue", a->max_queue, 0, uint64_t{1} << 20,
                   "requests waiting for a slot at most; past it, 429 with Retry-After");
    add_int_option(app, "--prefill-chunk", a->prefill_chunk, 1, 256,
                   "prompt tokens per step, so running sequences keep decoding during a prefill");
    add_int_option(app, "--prefix-caches", a->prefix_caches, 0, 256,
                   "finished requests' KV caches kept so that a request starting with the same "
                   "tokens runs only the rest of its prompt, and running ones' whole blocks "
                   "shared the same way (0: neither; the CPU backend only)");
    add_int_option(app, "--read-timeout", a->read_timeout, 1, 3600,
                   "seconds a client may stall while sending its request");
    add_int_option(app, "--max-body", a->max_body, 1024, uint64_t{1} << 30,
                   "request body bytes at most (larger: 413)");
    app.add_option("--served-model-name,--alias", a->served_name,
                   "the model's id in /v1/models and in responses (vLLM's --served-model-name, "
                   "llama.cpp's --alias; default: the model file's name without its extension)");
    app.add_option("--allowed-origins", a->allowed_origins,
                   "origins (scheme://host[:port], or * for any) whose web pages may call the API "
                   "from a browser (CORS; default none)")
        ->delimiter(',');
    app.add_option("--api-key", a->api_key,
                   "require 'Authorization: Bearer KEY' on every /v1 request and on /tokenize "
                   "and /detokenize (/health and /metrics stay open)");
    add_input_option(app, "--chat-template", a->chat_template,
                     "a Jinja chat template file for /v1/chat/completions instead of the model's "
                     "(for a model whose files carry none; as generate's)");
    add_threads_option(app, common);
    add_cpu_backend_options(app, common);
    add_backend_option(app, common);

    return [a, &common]() {
        // --backend cuda: each sequence's cache in blocks of one pool in device memory
        // (Backend::new_kv_pool, paged: each row's block table); a step's decode tokens run as one
        // batched step (CudaBackend::forward_batch: every weight read once per pass of 8 rows,
        // attention through each row's own cache, each row's logits the bits of its decode
        // alone), prompts whole and on their own (SchedulerOptions::whole_prompts), so a
        // request's tokens equal generate's on CUDA.
        // What it lacks against the CPU path (runtime/cuda_*.cpp, kernels/cuda/):
        // - A sequence takes the blocks of all its positions (prompt + max_tokens) at admission,
        //   as on the CPU; a sequence decoding alone runs without its graph (a paged cache's
        //   rows are uploaded every step).
        // - A batched step launches its kernels one by one (no graph: its rows change every
        //   step), and so does a sequence decoding alone on its pool cache.
        // - A long prompt runs whole in one step, stalling the decoding sequences for it.
        // - Not run on a GPU yet: tests/cuda_serve_test.cpp (the scheduler on the batched step,
        //   in scripts/gpu_check.sh's build, which has the scheduler but no HTTP or tokenizer)
        //   and tests/serve_scheduler_test.cpp's [cuda] case skip without one. `auto` serves on
        //   the CPU.
        const bool cuda = common.backend == "cuda";
        const auto model_file = open_qf_input(a->model);
        Model model(model_file->path());
        const Tokenizer tok = Tokenizer::from_schema(model.file().tokenizer(), a->model);
        const uint64_t max_pos = model.config().max_position_embeddings;
        if (a->ctx > max_pos) {
            std::fprintf(
                stderr, "qforge: note: --ctx %llu is past the model's context; using %llu\n",
                static_cast<unsigned long long>(a->ctx), static_cast<unsigned long long>(max_pos));
            a->ctx = max_pos;
        }
        const uint64_t per_seq = CpuKvCache::blocks_for(a->ctx);
        const uint64_t blocks =
            a->kv_blocks ? a->kv_blocks : std::max(per_seq, a->max_seqs * per_seq / 4);

        ThreadPool threads(resolved_threads(common));
        CommonOptions chosen = common;
        chosen.backend = cuda ? "cuda" : "cpu";
        auto backend = make_selected_backend(chosen, model, threads);
        // The backend's own pool of blocks: host memory (CPU, its KV type) or device memory.
        serve::PoolCacheSource caches(backend->new_kv_pool(blocks));
        // The CUDA backend's cache is fp16 (kernels/cuda/kv_layout.hpp), its blocks the CPU's size.
        const KvType kv_type = cuda ? KvType::f16 : cpu_backend_options(common).kv_type;
        const std::string kv_desc =
            std::string(kv_type_name(kv_type)) + ", " +
            human_bytes(blocks * CpuKvCache::block_bytes(model.config(), kv_type)) +
            (cuda ? " on the device" : "");
        serve::SchedulerOptions sched_options{a->max_seqs, a->ctx, a->max_queue, a->prefill_chunk};
        sched_options.whole_prompts = cuda;
        sched_options.kept_caches = a->prefix_caches;
        sched_options.share_prefixes = a->prefix_caches > 0;  // prefix reuse, both forms
        sched_options.threads = &threads;
        serve::Scheduler scheduler(*backend, caches, sched_options);

        serve::ServerOptions so;
        so.host = a->host;
        so.port = a->port;
        so.api_key = a->api_key;
        if (!a->chat_template.empty()) so.chat_template = read_text_file(a->chat_template);
        so.model_name = a->served_name.empty() ? std::filesystem::path(a->model).stem().string()
                                               : a->served_name;
        so.ctx = a->ctx;
        so.read_timeout_s = a->read_timeout;
        so.allowed_origins = a->allowed_origins;
        so.max_body = a->max_body;
        so.threads = static_cast<int>(a->max_seqs + a->max_queue + 8);
        so.log = [](std::string_view line) {
            std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
            std::fflush(stderr);
        };
        serve::HttpServer server(scheduler, tok, so);
        server.bind();
        if (!is_loopback(a->host) && a->api_key.empty())
            std::fprintf(stderr,
                         "qforge: warning: listening on %s without --api-key: anyone who can "
                         "reach this address can use the model\n",
                         a->host.c_str());
        std::fprintf(stderr,
                     "qforge serve: %s on http://%s:%d (%s, %d threads, %llu sequences, context "
                     "%llu, %llu KV blocks of %llu positions, %s)\n",
                     so.model_name.c_str(), a->host.c_str(), server.port(),
                     std::string(backend->name()).c_str(), threads.size(),
                     static_cast<unsigned long long>(a->max_seqs),
                     static_cast<unsigned long long>(a->ctx),
                     static_cast<unsigned long long>(blocks),
                     static_cast<unsigned long long>(CpuKvCache::kBlockPositions), kv_desc.c_str());
        std::fflush(stderr);
        scheduler.start();
        // SIGINT and SIGTERM set a flag (all a signal handler may safely do); a watcher thread
        // sees it and stops the server, which ends listen().
        g_stop_requested = 0;
        std::signal(SIGINT, on_stop_signal);
        std::signal(SIGTERM, on_stop_signal);
        std::atomic<bool> listening{true};
        std::thread watcher([&] {
            while (listening && !g_stop_requested)
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
            server.stop();
        });
        server.listen();
        listening = false;
        watcher.join();
        scheduler.stop();
        std::fprintf(stderr, "qforge serve: stopped\n");
        return 0;
    };
}

}  // namespace qforge::cli
