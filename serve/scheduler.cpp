#include "serve/scheduler.hpp"

#include <algorithm>
#include <limits>

#include "core/error.hpp"
#include "runtime/cpu_backend.hpp"
#include "runtime/logits_check.hpp"

namespace qforge::serve {

SequenceStream::Event SequenceStream::wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    ready_.wait_for(lock, timeout,
                    [&] { return finished_ || !pending_.empty() || !pending_prompt_.empty(); });
    Event e;
    e.tokens.swap(pending_);
    e.logprobs.swap(pending_logprobs_);
    e.prompt_logprobs.swap(pending_prompt_);
    e.finished = finished_;
    e.reason = reason_;
    e.error = error_;
    return e;
}

void SequenceStream::push(int32_t token, const TokenLogprobs* logprobs) {
    {
        std::lock_guard lock(mutex_);
        pending_.push_back(token);
        if (logprobs) pending_logprobs_.push_back(*logprobs);
    }
    ready_.notify_all();
}

std::shared_ptr<SequenceStream> SequenceStream::ended() {
    auto s = std::make_shared<SequenceStream>();
    s->finish(FinishReason::length);
    return s;
}

void SequenceStream::push_prompt(std::vector<TokenLogprobs> logprobs) {
    {
        std::lock_guard lock(mutex_);
        for (auto& lp : logprobs) pending_prompt_.push_back(std::move(lp));
    }
    ready_.notify_all();
}

void SequenceStream::finish(FinishReason reason, std::string error) {
    {
        std::lock_guard lock(mutex_);
        finished_ = true;
        reason_ = reason;
        error_ = std::move(error);
    }
    ready_.notify_all();
}

namespace {

// How many of the first `size` tokens of `a` then `b` (a sequence's prompt, then its chosen
// tokens) start all of `prompt` but its last token (whose logits a first step needs).
uint64_t common_start(const std::vector<int32_t>& prompt, const std::vector<int32_t>& a,
                      const std::vector<int32_t>& b, uint64_t size) {
    const uint64_t end = std::min<uint64_t>(size, prompt.size() - 1);
    uint64_t n = 0;
    for (; n < end; ++n)
        if ((n < a.size() ? a[n] : b[n - a.size()]) != prompt[n]) break;
    return n;
}

uint64_t whole_blocks(uint64_t positions) {
    return positions - positions % CpuKvCache::kBlockPositions;
}

}  // namespace

struct Scheduler::Sequence {
    SequenceRequest request;
    std::shared_ptr<SequenceStream> stream;
    uint64_t limit = 0;  // cache positions: min(prompt + max_tokens, ctx)
    std::unique_ptr<KvCache> cache;
    std::optional<Sampler> sampler;
    uint64_t fed = 0;  // prompt tokens run
    uint64_t generated = 0;
    std::vector<int32_t> chosen;  // the tokens delivered, in order (prefix reuse or sharing)
    int32_t last = 0;             // the token to decode next
    bool done = false;
};

Scheduler::Scheduler(Backend& backend, KvBlockPool& pool, SchedulerOptions options)
    : Scheduler(backend, nullptr, std::make_unique<PagedCacheSource>(pool), options) {}

Scheduler::Scheduler(Backend& backend, KvCacheSource& caches, SchedulerOptions options)
    : Scheduler(backend, &caches, nullptr, options) {}

Scheduler::Scheduler(Backend& backend, KvCacheSource* caches,
                     std::unique_ptr<KvCacheSource> own_caches, SchedulerOptions options)
    : backend_(backend),
      own_caches_(std::move(own_caches)),
      caches_(caches ? *caches : *own_caches_),
      options_(options),
      vocab_(backend.model().config().vocab_size) {
    if (options.max_seqs == 0 || options.max_seqs > CpuBackend::kMaxBatch)
        throw Error("scheduler: max_seqs " + std::to_string(options.max_seqs) +
                    " is outside 1 .. " + std::to_string(CpuBackend::kMaxBatch));
    if (options.ctx == 0 || options.ctx > backend.model().config().max_position_embeddings)
        throw Error(backend.model().path(), {},
                    "a context of " + std::to_string(options.ctx) +
                        " positions is outside 1 .. max_position_embeddings (" +
                        std::to_string(backend.model().config().max_position_embeddings) + ")");
    if (options.prefill_chunk == 0) throw Error("scheduler: prefill_chunk must be at least 1");
    if (options.whole_prompts) {  // rows depend on the cut (header)
        options_.kept_caches = 0;
        options_.share_prefixes = false;
    }
    free_blocks_ = caches_.free_blocks();
}

Scheduler::~Scheduler() {
    stop();
    for (auto& s : running_) finish(*s, FinishReason::cancelled);
    for (auto& s : queue_) s->stream->finish(FinishReason::cancelled);
    give_back_kept();
}

void Scheduler::give_back_kept() {
    for (Kept& k : kept_) caches_.give_back(std::move(k.cache));
    kept_.clear();
}

Scheduler::Submitted Scheduler::submit(SequenceRequest request) {
    std::vector<SequenceRequest> one;
    one.push_back(std::move(request));
    SubmittedAll all = submit_all(std::move(one));
    return {all.streams.empty() ? nullptr : all.streams[0], all.refusal, std::move(all.why)};
}

Scheduler::SubmittedAll Scheduler::submit_all(std::vector<SequenceRequest> requests) {
    SubmittedAll out;
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (size_t i = 0; i < requests.size(); ++i) {
        auto refuse = [&](Refusal r, std::string why) {
            out.refusal = r;
            out.refused = i;
            out.why = std::move(why);
            return out;
        };
        SequenceRequest& request = requests[i];
        if (request.prompt.empty())
            throw Error("scheduler: a request needs at least one prompt token");
        if (request.max_tokens == 0 && !request.prompt_logprobs)
            throw Error("scheduler: max_tokens must be at least 1 (0 only with prompt logprobs)");
        if (request.prompt_logprobs && !request.logprobs)
            throw Error("scheduler: prompt logprobs need logprobs");
        if (request.prompt_logprobs && options_.whole_prompts)
            // A whole prompt's rows of logits at once (its length times the vocabulary): not here.
            return refuse(Refusal::unsupported,
                          "prompt log-probabilities (echo with logprobs) are not served on this "
                          "backend");
        Sampler check(request.sampling);  // throws for a bad temperature or top-p, before queueing
        // A bad id would fail the whole batch it runs in: refused here, for this request alone.
        for (int32_t id : request.prompt)
            if (id < 0 || static_cast<uint64_t>(id) >= vocab_)
                throw Error("token id " + std::to_string(id) + " is outside the vocabulary (" +
                            std::to_string(vocab_) + ")");
        // Generation stops when the cache is full, as generate() does; the prompt itself must fit.
        if (request.prompt.size() > options_.ctx)
            return refuse(Refusal::too_large,
                          "the prompt has " + std::to_string(request.prompt.size()) +
                              " tokens; the context holds " + std::to_string(options_.ctx));
        auto s = std::make_unique<Sequence>();
        s->limit = std::min<uint64_t>(
            options_.ctx,
            request.prompt.size() + std::min<uint64_t>(request.max_tokens, options_.ctx));
        const uint64_t blocks = CpuKvCache::blocks_for(s->limit);
        if (blocks > caches_.total_blocks())
            return refuse(Refusal::too_large, "the request needs " + std::to_string(blocks) +
                                                  " KV blocks (" + std::to_string(s->limit) +
                                                  " positions); the pool has " +
                                                  std::to_string(caches_.total_blocks()));
        s->request = std::move(request);
        s->stream = std::make_shared<SequenceStream>();
        seqs.push_back(std::move(s));
    }
    if (seqs.size() > 1 && seqs.size() > options_.max_queue) {  // one: queue_full, as ever
        out.refusal = Refusal::too_many;
        out.why = std::to_string(seqs.size()) + " sequences at once; the queue holds " +
                  std::to_string(options_.max_queue);
        return out;
    }
    {
        // All or none, one after another in the queue: admitted in order, never a part of them
        // left waiting for room the others took. Taken whenever a single request would be (the
        // queue not full), so a stream of single requests never starves them: the queue may then
        // hold up to max_queue - 1 more than its bound (too_many bounds how many come at once).
        std::lock_guard lock(mutex_);
        if (queue_.size() >= options_.max_queue) {
            out.refusal = Refusal::queue_full;
            out.why = std::to_string(queue_.size()) + " sequences are waiting already";
            return out;
        }
        for (auto& s : seqs) {
            out.streams.push_back(s->stream);
            queue_.push_back(std::move(s));
        }
    }
    work_.notify_one();
    return out;
}

void Scheduler::admit() {
    std::lock_guard lock(mutex_);
    // Cancelled while waiting: leave the queue without ever running.
    for (auto it = queue_.begin(); it != queue_.end();) {
        if ((*it)->stream->cancelled()) {
            (*it)->stream->finish(FinishReason::cancelled);
            it = queue_.erase(it);
        } else {
            ++it;
        }
    }
    // First come, first served: a request that does not fit yet holds back those behind it, so
    // a large request is never starved by a stream of small ones.
    while (!queue_.empty() && running_.size() < options_.max_seqs) {
        Sequence& s = *queue_.front();
        if (wait_to_share(s)) break;
        std::unique_ptr<KvCache> cache;
        try {
            cache = take_cache(s);
        } catch (const std::exception& e) {
            // The source failed (device memory, say): this request fails; the queue goes on.
            s.stream->finish(FinishReason::error, e.what());
            queue_.pop_front();
            continue;
        }
        if (!cache) break;
        s.cache = std::move(cache);
        s.sampler.emplace(s.request.sampling, s.request.prompt);
        running_.push_back(std::move(queue_.front()));
        queue_.pop_front();
    }
}

bool Scheduler::wait_to_share(const Sequence& s) const {
    if (!options_.share_prefixes || s.request.prompt_logprobs) return false;
    const std::vector<int32_t>& prompt = s.request.prompt;
    const std::vector<int32_t> none;
    uint64_t now = 0, later = 0;
    for (const auto& r : running_) {
        if (!r->cache) continue;
        const std::vector<int32_t>& p = r->request.prompt;
        now = std::max(now, whole_blocks(common_start(prompt, p, r->chosen, r->cache->size())));
        if (r->fed < p.size())  // still prefilling: its prompt's positions to come
            later = std::max(later, whole_blocks(common_start(prompt, p, none, p.size())));
    }
    for (const Kept& k : kept_)
        now = std::max(now, common_start(prompt, k.tokens, none, k.tokens.size()));
    return later > now;
}

std::unique_ptr<KvCache> Scheduler::take_cache(Sequence& s) {
    const std::vector<int32_t>& prompt = s.request.prompt;
    if (s.request.prompt_logprobs) return fresh_cache(s);  // every prompt position runs
    // The kept cache sharing the longest start, the most recent among equals; extended for s if
    // too small. One holding more blocks than s needs is passed over: taken, it would pin them
    // for s's whole run (a long answer's cache for a short request); so is one with a shared
    // block from that start on (writing there would change the positions another cache holds).
    const uint64_t blocks = CpuKvCache::blocks_for(s.limit);
    const std::vector<int32_t> none;
    size_t best = 0;
    uint64_t shared = 0;
    for (size_t i = kept_.size(); i-- > 0;) {
        const Kept& k = kept_[i];
        if (CpuKvCache::blocks_for(k.cache->capacity()) > blocks) continue;
        const uint64_t n = common_start(prompt, k.tokens, none, k.tokens.size());
        if (n > shared && !caches_.shared_from(*k.cache, n)) {
            best = i;
            shared = n;
        }
    }
    // Sharing: the running sequence's or kept cache's positions with the most in common, if
    // that is more than the kept cache gives: their whole blocks shared, the rest (a partly
    // filled block's) copied into a block of s's own.
    const KvCache* source = nullptr;
    uint64_t common = 0;
    if (options_.share_prefixes) {
        auto consider = [&](const KvCache& cache, uint64_t n) {
            if (n > common) source = &cache, common = n;
        };
        for (const auto& r : running_)
            if (r->cache)
                consider(*r->cache,
                         common_start(prompt, r->request.prompt, r->chosen, r->cache->size()));
        for (const Kept& k : kept_)
            consider(*k.cache, common_start(prompt, k.tokens, none, k.tokens.size()));
    }
    if (common > shared) {
        const uint64_t whole = whole_blocks(common);
        if (std::unique_ptr<KvCache> cache =
                whole > 0 ? caches_.share(*source, whole, s.limit) : caches_.take(s.limit)) {
            // Its shared blocks are held now: any kept cache may go back for the rest (the
            // source too, and then nothing is copied).
            while (cache->capacity() < s.limit && !caches_.extend(*cache, s.limit)) {
                if (kept_.empty()) {
                    caches_.give_back(std::move(cache));
                    return nullptr;
                }
                if (kept_.front().cache.get() == source) source = nullptr;
                caches_.give_back(std::move(kept_.front().cache));
                kept_.pop_front();
            }
            try {
                s.fed = source && copy_positions(*cache, *source, common) ? common : whole;
            } catch (...) {  // caches of another shape: not reachable with one model
                caches_.give_back(std::move(cache));
                throw;
            }
            shared_ += s.fed;
            return cache;
        }
    }
    // Extending it may need blocks the other kept caches hold: they go back first, oldest first,
    // before the best one would (the loop below gives back the oldest, which may be it).
    bool fits = shared > 0 && kept_[best].cache->capacity() >= s.limit;
    while (shared > 0 && !fits && !(fits = caches_.extend(*kept_[best].cache, s.limit))) {
        const size_t oldest = best == 0 ? 1 : 0;
        if (oldest >= kept_.size()) break;
        caches_.give_back(std::move(kept_[oldest].cache));
        kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(oldest));
        if (oldest < best) --best;
    }
    if (fits) {
        std::unique_ptr<KvCache> cache = std::move(kept_[best].cache);
        kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(best));
        cache->truncate(shared);
        s.fed = shared;
        reused_ += shared;
        return cache;
    }
    return fresh_cache(s);
}

std::unique_ptr<KvCache> Scheduler::fresh_cache(const Sequence& s) {
    for (;;) {
        if (auto cache = caches_.take(s.limit)) return cache;
        if (kept_.empty()) return nullptr;
        caches_.give_back(std::move(kept_.front().cache));  // the oldest kept cache's blocks
        kept_.pop_front();
    }
}

void Scheduler::keep(Sequence& s) {
    // The cache holds the prompt's positions and then those of the delivered tokens fed since
    // (the last one delivered never is): its first size() tokens.
    const uint64_t n = s.cache->size();
    std::vector<int32_t> tokens = s.request.prompt;
    tokens.insert(tokens.end(), s.chosen.begin(), s.chosen.end());
    if (n == 0 || n > tokens.size()) return caches_.give_back(std::move(s.cache));
    tokens.resize(n);
    kept_.emplace_back();  // may throw: then s.cache is still s's
    kept_.back().tokens = std::move(tokens);
    kept_.back().cache = std::move(s.cache);
    while (kept_.size() > options_.kept_caches) {
        caches_.give_back(std::move(kept_.front().cache));
        kept_.pop_front();
    }
}

void Scheduler::finish(Sequence& s, FinishReason reason, std::string error) {
    s.done = true;
    // A failed step may have left its cache partly written: never kept. Keeping allocates; if
    // it fails the cache goes back instead, so finishing never throws.
    if (s.cache && options_.kept_caches > 0 && reason != FinishReason::error) {
        try {
            keep(s);
        } catch (...) {  // out of memory: given back below
        }
    }
    if (s.cache) caches_.give_back(std::move(s.cache));
    s.stream->finish(reason, std::move(error));
}

Scheduler::Choice Scheduler::choose(Sequence& s, std::span<float> logits) const noexcept {
    try {
        if (!all_finite(logits))
            throw_non_finite_logits(logits, backend_.model().path(),
                                    "position " + std::to_string(s.cache->size() - 1));
        // As generate(): an id without a token is never chosen.
        const uint64_t sampleable = token_ids(s);
        std::fill(logits.begin() + static_cast<std::ptrdiff_t>(sampleable), logits.end(),
                  -std::numeric_limits<float>::infinity());
        Choice c{s.sampler->sample(logits), nullptr, {}};
        if (s.request.logprobs)  // over the ids with a token (the rest are -inf: no mass)
            c.logprobs = token_logprobs(logits.first(sampleable), c.token, *s.request.logprobs);
        return c;
    } catch (...) {  // the message is made on the scheduler's thread (deliver)
        return {-1, std::current_exception(), {}};
    }
}

Scheduler::Choice Scheduler::score(const Sequence& s, std::span<const float> logits,
                                   int32_t next) const noexcept {
    try {
        if (!all_finite(logits))
            throw_non_finite_logits(
                logits, backend_.model().path(),
                "a prompt position of " + std::to_string(s.request.prompt.size()));
        // Over the ids with a token, as choose() samples; a prompt id past them (one the
        // tokenizer has no token for) over the whole row.
        uint64_t ids = token_ids(s);
        if (static_cast<uint64_t>(next) >= ids) ids = vocab_;
        return {next, nullptr,
                token_logprobs(logits.first(ids), next, s.request.logprobs.value_or(0))};
    } catch (...) {
        return {-1, std::current_exception(), {}};
    }
}

void Scheduler::deliver(Sequence& s, const Choice& choice) {
    if (choice.error) {
        std::string why = "sampling failed";
        try {
            std::rethrow_exception(choice.error);
        } catch (const std::exception& e) {
            why = e.what();
        } catch (...) {
        }
        return finish(s, FinishReason::error, why);
    }
    const int32_t next = choice.token;
    const auto& stops = s.request.stop_ids;
    if (std::find(stops.begin(), stops.end(), next) != stops.end())
        return finish(s, FinishReason::stop);
    s.stream->push(next, s.request.logprobs ? &choice.logprobs : nullptr);
    if (options_.kept_caches > 0 || options_.share_prefixes) s.chosen.push_back(next);
    s.last = next;
    if (s.sampler->finished())  // a whole document nothing may continue: as a stop token
        return finish(s, FinishReason::stop);
    if (++s.generated == s.request.max_tokens || s.cache->size() == s.limit)
        finish(s, FinishReason::length);
}

uint64_t Scheduler::token_ids(const Sequence& s) const {
    const uint64_t n = s.request.token_count;
    return n == 0 ? vocab_ : std::min<uint64_t>(n, vocab_);
}

bool Scheduler::samples(const Sequence& s) {
    return s.fed == s.request.prompt.size() && s.request.max_tokens > 0;
}

void Scheduler::run_batch(std::vector<Sequence*>& seqs, std::vector<BatchSequence>& batch) {
    // The logits rows, in order: each a sequence's sampling row (its last, when it samples this
    // step) or a prompt position's (prompt logprobs: the row of position p scores prompt token
    // p + 1).
    struct Row {
        Sequence* s;
        uint64_t position;  // the row's position in s's cache
        bool sample;
    };
    std::vector<Row> rows;
    for (size_t i = 0; i < batch.size(); ++i) {
        const uint64_t n = batch[i].tokens.size(), first = batch[i].cache->size();
        for (uint64_t r = n - batch[i].logit_rows(); r < n; ++r)
            rows.push_back({seqs[i], first + r, r == n - 1 && samples(*seqs[i])});
    }
    // Kept between steps: a fresh vector was 3 MiB zeroed a step at 16 sequences of SmolLM2's
    // 49152 logits, on the scheduler's thread while the pool's others waited.
    if (logits_.size() < rows.size() * vocab_) logits_.resize(rows.size() * vocab_);
    const std::span<float> logits(logits_.data(), rows.size() * vocab_);
    try {
        backend_.forward_batch(batch, logits);
    } catch (const std::exception& e) {  // nothing in a checked batch should fail; if it does,
        // the batch's requests say so and leave (an exception past here would end the thread)
        for (Sequence* s : seqs) finish(*s, FinishReason::error, e.what());
        return;
    }
    // A step with a prompt's rows of logits grew the buffer past a decode step's: it goes back
    // after this step rather than stay for the server's life.
    const bool shrink = rows.size() > options_.max_seqs;
    std::vector<Choice> choices(rows.size());
    auto choose_rows = [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
            const std::span<float> row = logits.subspan(i * vocab_, vocab_);
            if (rows[i].sample) {
                choices[i] = choose(*rows[i].s, row);
                continue;
            }
            const SequenceRequest& r = rows[i].s->request;
            if (rows[i].position + 1 < r.prompt.size())
                choices[i] = score(*rows[i].s, row, r.prompt[rows[i].position + 1]);
        }
    };
    if (options_.threads && rows.size() > 1)
        options_.threads->parallel_for(rows.size(), choose_rows);
    else
        choose_rows(0, rows.size());
    // Per sequence in row order: its prompt positions' log-probabilities, then its token.
    // A row that failed ends its sequence (deliver: an error), whose later rows are skipped.
    std::vector<TokenLogprobs> prompt;
    for (size_t i = 0; i < rows.size(); ++i) {
        Sequence& s = *rows[i].s;
        if (s.done) continue;
        if (rows[i].sample || choices[i].error) {
            deliver(s, choices[i]);
            prompt.clear();
            continue;
        }
        if (rows[i].position + 1 < s.request.prompt.size())
            prompt.push_back(std::move(choices[i].logprobs));
        if (i + 1 == rows.size() || rows[i + 1].s != &s || rows[i + 1].sample) {
            if (!prompt.empty()) s.stream->push_prompt(std::move(prompt));
            prompt.clear();
            // The prompt's alone (max_tokens 0): done once it has all run.
            if (s.fed == s.request.prompt.size() && s.request.max_tokens == 0)
                finish(s, FinishReason::length);
        }
    }
    if (shrink) std::vector<float>().swap(logits_);
}

bool Scheduler::step() {
    // Cancelled sequences leave first, so their blocks can go to the requests admitted now.
    for (auto& s : running_)
        if (s->stream->cancelled()) finish(*s, FinishReason::cancelled);
    std::erase_if(running_, [](const auto& s) { return s->done; });
    admit();

    // Decode tokens first (one each), then prompt chunks in admission order within the budget.
    std::vector<Sequence*> seqs;
    std::vector<BatchSequence> batch;
    for (auto& s : running_)
        if (s->fed == s->request.prompt.size()) {
            seqs.push_back(s.get());
            batch.push_back({{&s->last, 1}, s->cache.get(), true});
        }
    uint64_t budget = std::min(options_.prefill_chunk, CpuBackend::kMaxBatch - batch.size());
    for (auto& s : running_) {
        const uint64_t left = s->request.prompt.size() - s->fed;
        if (left == 0 || (budget == 0 && !options_.whole_prompts)) continue;
        const uint64_t chunk = options_.whole_prompts ? left : std::min(left, budget);
        // The last chunk's last row samples the first token; with prompt logprobs every row's
        // logits are wanted (max_tokens 0: no token is sampled).
        const bool all = s->request.prompt_logprobs;
        seqs.push_back(s.get());
        batch.push_back({std::span(s->request.prompt).subspan(s->fed, chunk), s->cache.get(),
                         chunk == left || all, all});
        s->fed += chunk;
        budget -= std::min(chunk, budget);
    }
    uint64_t rows = 0, sampled = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        rows += batch[i].tokens.size();
        sampled += samples(*seqs[i]) ? 1 : 0;
    }
    if (!batch.empty()) run_batch(seqs, batch);
    std::erase_if(running_, [](const auto& s) { return s->done; });
    {
        std::lock_guard lock(mutex_);
        running_count_ = running_.size();
        free_blocks_ = caches_.free_blocks();
        kept_count_ = kept_.size();
        steps_ += batch.empty() ? 0 : 1;
        step_rows_ += rows;
        step_tokens_ += sampled;
    }
    return !batch.empty();
}

void Scheduler::fail_running(const std::string& why) {
    for (auto& s : running_)
        if (!s->done) finish(*s, FinishReason::error, why);
    running_.clear();
    std::lock_guard lock(mutex_);
    running_count_ = 0;
    free_blocks_ = caches_.free_blocks();
    kept_count_ = kept_.size();
}

void Scheduler::start() {
    if (thread_.joinable()) return;
    thread_ = std::thread([this] {
        for (;;) {
            {
                std::unique_lock lock(mutex_);
                if (stop_) return;
            }
            try {
                if (step()) continue;
            } catch (const std::exception& e) {
                // Outside the model (admission, sampling: out of memory, say): the running
                // requests fail and leave with their blocks rather than the thread, and with it
                // the server, ending.
                fail_running(e.what());
                continue;
            }
            // Idle: wait for a submission (a cancelled queued request is noticed within 50 ms).
            std::unique_lock lock(mutex_);
            work_.wait_for(lock, std::chrono::milliseconds(50),
                           [&] { return stop_ || !queue_.empty(); });
        }
    });
}

void Scheduler::stop() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    work_.notify_all();
    if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
    std::lock_guard lock(mutex_);
    return {running_count_, queue_.size(), free_blocks_, caches_.total_blocks(),
            steps_,         kept_count_,   reused_,      shared_,
            step_rows_,     step_tokens_};
}

}  // namespace qforge::serve
