// Continuous batching (in the manner of vLLM and Orca): one scheduler thread runs the model in
// steps; each step is one Backend::forward_batch over every running sequence: one decode token
// each, plus chunks of the prompts of sequences still being prefilled (at most
// SchedulerOptions::prefill_chunk prompt tokens per step in all, so a long prompt never stalls
// the decoding sequences for more than one chunk). A request submitted between steps joins at the
// next one; a finished or cancelled sequence leaves at once and returns its KV blocks.
//
// Admission: a sequence is admitted when a slot is free (max_seqs) and the block pool can give
// every block it may need (prompt + max_tokens positions, at most the context), reserved up
// front, so a running sequence never runs out of cache and nothing is ever preempted. Requests
// that cannot be admitted yet wait in a FIFO queue; past max_queue waiting requests, submit
// refuses (the HTTP layer answers 429 with Retry-After).
//
// Each sequence samples with its own Sampler seeded by its request, in the order generate()
// does, and its logits do not depend on the rest of the batch (runtime/batch_forward.cpp), so a
// request's tokens equal `qforge generate`'s for the same prompt and options whatever else runs.
//
// Prefix reuse (SchedulerOptions::kept_caches): a finished sequence's cache may be kept with the
// tokens whose keys and values it holds; a request whose prompt starts with some of them takes
// the cache over, truncated to the shared start, and runs only the rest of its prompt (a shared
// system prompt, a conversation's next turn, a client's repeated instructions). Exact where a
// row's keys and values depend only on the tokens up to it, not on how its prompt was cut or
// batched (the CPU backend: runtime/batch_forward.cpp), so a request's tokens still equal
// generate()'s; not with whole_prompts. A kept cache goes back to the pool as soon as an
// admission lacks blocks, oldest first, so keeping never makes a request wait.
//
// Prefix sharing (SchedulerOptions::share_prefixes): a request whose prompt starts like the
// positions a running sequence (or a kept cache) holds starts its cache with their whole blocks,
// shared, not copied (runtime/paged_kv_cache.hpp), copies the positions in common past them (at
// most a block's, into one of its own: serve/cache_source.hpp copy_positions), and runs only the
// rest of its prompt: many concurrent requests with one system prompt hold its blocks once and
// run it once. Exact for the same reason as prefix reuse; the one it counts more positions for wins
// (a kept cache is taken over only where none of its blocks from the shared start on is shared:
// writing there would change another sequence's positions). A request at the front of the queue
// whose prompt shares more whole blocks with a running sequence still prefilling them than any
// cache holds yet waits until that sequence has run them (its prefill advances every step), so
// requests that arrive together with one system prompt run it once, not once each.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/backend.hpp"
#include "runtime/paged_kv_cache.hpp"
#include "runtime/perplexity.hpp"
#include "runtime/sampling.hpp"
#include "runtime/thread_pool.hpp"
#include "serve/cache_source.hpp"

namespace qforge::serve {

struct SequenceRequest {
    std::vector<int32_t> prompt;  // non-empty
    SamplingParams sampling;
    uint64_t max_tokens = 16;       // >= 1
    std::vector<int32_t> stop_ids;  // generation ends when one is chosen (not emitted)
    uint64_t token_count = 0;       // ids from this one on are never chosen (0: all have a token)
    // Set: each delivered token comes with its TokenLogprobs (runtime/perplexity.hpp: the model's
    // own distribution, from the logits row before temperature, penalties and biases, as vLLM
    // reports by default) and this many most likely alternatives.
    std::optional<uint32_t> logprobs;
    // With logprobs: each prompt position after the first also gets the TokenLogprobs of its
    // token given the ones before (SequenceStream::Event::prompt_logprobs, all of them before the
    // first generated token; the API's echo). The prompt then runs whole, never on a kept or
    // shared cache, and max_tokens may be 0 (the prompt's alone).
    bool prompt_logprobs = false;
};

enum class FinishReason {
    length,     // max_tokens, or the context is full
    stop,       // a stop id
    cancelled,  // the reader cancelled (client gone, a stop string matched)
    error,      // the model failed (non-finite logits); SequenceStream::error() says why
};

// A request's results as the scheduler produces them; read by one other thread.
class SequenceStream {
  public:
    struct Event {
        std::vector<int32_t> tokens;          // chosen since the last wait
        std::vector<TokenLogprobs> logprobs;  // one per token when the request asked for them
        std::vector<TokenLogprobs> prompt_logprobs;  // prompt positions 1, 2, .. (in order)
        bool finished = false;
        FinishReason reason = FinishReason::length;
        std::string error;
    };
    // The tokens chosen since the last call, waiting up to `timeout` for one when there are none;
    // `finished` once the sequence has ended (after its last tokens).
    Event wait(std::chrono::milliseconds timeout);
    // The reader gives up: the sequence leaves at the next step and frees its blocks.
    void cancel() { cancelled_ = true; }
    // A stream that has ended with no tokens (FinishReason::length), for a request with nothing
    // to run (an echo of the prompt alone).
    static std::shared_ptr<SequenceStream> ended();
    bool cancelled() const { return cancelled_; }

  private:
    friend class Scheduler;
    void push(int32_t token, const TokenLogprobs* logprobs);
    void push_prompt(std::vector<TokenLogprobs> logprobs);
    void finish(FinishReason reason, std::string error = {});

    std::mutex mutex_;
    std::condition_variable ready_;
    std::vector<int32_t> pending_;
    std::vector<TokenLogprobs> pending_logprobs_, pending_prompt_;
    bool finished_ = false;
    FinishReason reason_ = FinishReason::length;
    std::string error_;
    std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
    uint64_t max_seqs = 16;       // sequences running at once (at most CpuBackend::kMaxBatch)
    uint64_t ctx = 4096;          // positions per sequence at most
    uint64_t max_queue = 64;      // requests waiting for admission at most
    uint64_t prefill_chunk = 64;  // prompt tokens per step, over every prefilling sequence
    // Each prompt runs whole in its first step (prefill_chunk not applied). For a backend whose
    // logits depend on how a prompt is cut (CUDA rounds the activations of products over more
    // than 8 tokens to fp16): one forward() of the whole prompt, as generate() runs it, keeps a
    // request's tokens independent of the other prompts of its step. Only for a backend without
    // a batched step (the CPU's takes at most CpuBackend::kMaxBatch tokens a step).
    bool whole_prompts = false;
    // Finished sequences whose caches are kept for prefix reuse (header comment), the most recent
    // ones; 0: none, every cache goes back to the pool when its sequence ends.
    uint64_t kept_caches = 0;
    // Requests share the whole blocks of a running sequence's or kept cache's positions their
    // prompt starts with and copy the rest of those positions (header comment), from a source
    // that can (KvCacheSource::share, copy_positions).
    bool share_prefixes = false;
    // Threads to check and sample a step's logits rows on, a share of the sequences each (each
    // sequence's sampler is its own, so its tokens are a serial loop's); null: the scheduler's
    // thread alone. The backend's pool, which nothing else may use while step() runs.
    ThreadPool* threads = nullptr;
};

struct SchedulerStats {
    uint64_t running = 0, queued = 0, free_blocks = 0, total_blocks = 0, steps = 0;
    uint64_t kept = 0;              // caches kept for prefix reuse (their blocks are not free)
    uint64_t reused_positions = 0;  // prompt positions taken from kept caches, in all
    uint64_t shared_positions = 0;  // prompt positions started on shared blocks or copied, in all
    uint64_t step_rows = 0;         // rows run in all steps (decode tokens and prompt chunks)
    uint64_t step_tokens = 0;       // tokens sampled in all steps (a logits row each)
};

class Scheduler {
  public:
    // `backend` runs the steps; the caches come from `pool` (its model must be the backend's).
    Scheduler(Backend& backend, KvBlockPool& pool, SchedulerOptions options);
    // The caches come from `caches` (serve/cache_source.hpp), which must outlive the scheduler.
    Scheduler(Backend& backend, KvCacheSource& caches, SchedulerOptions options);
    ~Scheduler();  // stops the thread; unfinished sequences end as cancelled
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    enum class Refusal { none, queue_full, too_large, unsupported, too_many };
    struct Submitted {
        std::shared_ptr<SequenceStream> stream;  // null when refused
        Refusal refusal = Refusal::none;
        std::string why;
    };
    // Thread-safe. Refused: queue_full when max_queue requests wait (try again later);
    // too_large when the request's cache would not fit the whole pool or the context (never);
    // unsupported for prompt logprobs with whole_prompts. An empty prompt, max_tokens 0 without
    // prompt logprobs, or prompt logprobs without logprobs is an Error.
    Submitted submit(SequenceRequest request);
    // Several requests at once (an API request with several prompts), checked as submit's, then
    // queued together in order, all or none: refused as the first of them that submit would
    // refuse (`refused`: its index), queue_full when the queue is full (as for one request: then
    // all join even past the bound, by less than max_queue), too_many when there are several and
    // more than max_queue (never).
    struct SubmittedAll {
        std::vector<std::shared_ptr<SequenceStream>> streams;  // one per request; empty: refused
        Refusal refusal = Refusal::none;
        std::string why;
        size_t refused = 0;
    };
    SubmittedAll submit_all(std::vector<SequenceRequest> requests);

    // One step on the calling thread: admits what fits, drops cancelled sequences, runs one
    // batch and delivers its tokens. False when there was nothing to run. Call it from one thread
    // only, and not while start()'s thread runs.
    bool step();
    // Runs step() on a thread of its own until stop() or destruction.
    void start();
    void stop();

    SchedulerStats stats() const;

  private:
    struct Sequence;
    // `caches`, or `own_caches` when it is null.
    Scheduler(Backend& backend, KvCacheSource* caches, std::unique_ptr<KvCacheSource> own_caches,
              SchedulerOptions options);
    void admit();
    void run_batch(std::vector<Sequence*>& batch_seqs, std::vector<BatchSequence>& batch);
    void finish(Sequence& s, FinishReason reason, std::string error = {});
    // Every running sequence ends with `why` as its error (start()'s thread, after step() threw).
    void fail_running(const std::string& why);
    // A logits row's token for s (s's sampler and the row only: safe on any thread, never
    // throws); then, on the scheduler's thread, its delivery.
    struct Choice {
        int32_t token = -1;
        std::exception_ptr error;  // set when there is no token
        TokenLogprobs logprobs;    // when the request asked for them
    };
    Choice choose(Sequence& s, std::span<float> logits) const noexcept;
    // A prompt position's row: the log-probabilities of `next`, the prompt token after it (its
    // logprobs field; never throws).
    Choice score(const Sequence& s, std::span<const float> logits, int32_t next) const noexcept;
    // Whether s samples a token from its last row in the step being run (step() has fed its
    // chunk): its prompt has all run and it wants tokens.
    static bool samples(const Sequence& s);
    // The ids with a token among s's logits (SequenceRequest::token_count, at most the vocab).
    uint64_t token_ids(const Sequence& s) const;
    void deliver(Sequence& s, const Choice& choice);
    // Admission's cache for s: a kept one that shares the most of s's prompt, or a new one on the
    // whole blocks (and a copy of the rest) of the running sequence's or kept cache's positions
    // that share more (s.fed
    // set to the positions s need not run), else one from the source, giving kept caches back
    // while it is short; null when nothing fits yet.
    std::unique_ptr<KvCache> take_cache(Sequence& s);
    // A cache of s's positions from the source, giving kept caches back while it is short.
    std::unique_ptr<KvCache> fresh_cache(const Sequence& s);
    // Whether s had better wait to share a running sequence's positions still to come (header).
    bool wait_to_share(const Sequence& s) const;
    // s's cache into kept_ with its tokens (the oldest kept one back to the source past
    // kept_caches).
    void keep(Sequence& s);
    void give_back_kept();

    Backend& backend_;
    std::unique_ptr<KvCacheSource> own_caches_;  // the pool's, for the KvBlockPool constructor
    KvCacheSource& caches_;
    SchedulerOptions options_;
    uint64_t vocab_;
    std::vector<float> logits_;  // a step's logits rows (the scheduler's thread's)

    mutable std::mutex mutex_;  // guards queue_, stop_ and the stats
    std::condition_variable work_;
    std::deque<std::unique_ptr<Sequence>> queue_;
    std::vector<std::unique_ptr<Sequence>> running_;  // the scheduler thread's alone
    struct Kept {
        std::vector<int32_t> tokens;  // the positions the cache holds, in order
        std::unique_ptr<KvCache> cache;
    };
    std::deque<Kept> kept_;  // the scheduler thread's alone; oldest first
    uint64_t running_count_ = 0, free_blocks_ = 0, steps_ = 0, kept_count_ = 0, reused_ = 0;
    uint64_t shared_ = 0;
    uint64_t step_rows_ = 0, step_tokens_ = 0;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace qforge::serve
