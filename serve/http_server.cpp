#include "serve/http_server.hpp"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <random>

#include "core/error.hpp"
#include "runtime/token_constraint.hpp"
#include "serve/metrics.hpp"
#include "serve/openai_request.hpp"
#include "serve/text_stream.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/utf8.hpp"

namespace qforge::serve {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Chat requests without max_tokens: the API's default is "until the context is full", but the
// scheduler reserves a request's whole cache at admission, so an unbounded default would hold
// ctx positions per request. 256 is a full answer for the small models this serves.
constexpr uint64_t kChatDefaultMaxTokens = 256;
constexpr uint64_t kCompletionDefaultMaxTokens = 16;  // the API's

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status();
    res.set_content(dump(e.body()), "application/json");
}

const char* finish_name(FinishReason r) { return r == FinishReason::length ? "length" : "stop"; }

// Characters (code points) in UTF-8 text: the API's text offsets count them, as Python does.
uint64_t characters(std::string_view s) {
    return static_cast<uint64_t>(std::count_if(
        s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xc0) != 0x80; }));
}

// The UTF-8 bytes of a token's text, as chat's logprobs give them (a token may hold part of a
// character, which its text string cannot show).
json bytes_of(std::string_view s) {
    json b = json::array();
    for (char c : s) b.push_back(static_cast<unsigned char>(c));
    return b;
}

// The log-probabilities of generated tokens in the API's two shapes, one token at a time:
// /v1/completions' {tokens, token_logprobs, top_logprobs (text to logprob, the chosen token's
// among them), text_offset} and chat's {content: [{token, logprob, bytes, top_logprobs}]}. A
// token's text is what it adds to the text after the token before it (Tokenizer::decode_piece),
// for the alternatives too.
class LogprobsJson {
  public:
    explicit LogprobsJson(bool chat) : chat_(chat) { clear(); }
    // A token whose text is `piece` (after `previous`), at `offset` characters; `lp` null: an
    // echoed prompt's first token, which nothing before it scores (completions: nulls).
    void add(const Tokenizer& tok, int32_t previous, const std::string& piece,
             const TokenLogprobs* lp, uint64_t offset) {
        ++count_;
        if (chat_) {
            json top = json::array();
            for (const auto& [alt, v] : lp->top) {
                const std::string t = tok.decode_piece(previous, alt);
                top.push_back({{"token", t}, {"logprob", v}, {"bytes", bytes_of(t)}});
            }
            j_["content"].push_back({{"token", piece},
                                     {"logprob", lp->logprob},
                                     {"bytes", bytes_of(piece)},
                                     {"top_logprobs", std::move(top)}});
            return;
        }
        json top = nullptr;
        if (lp) {
            top = json::object();
            for (const auto& [alt, v] : lp->top) top.emplace(tok.decode_piece(previous, alt), v);
            top[piece] = lp->logprob;
        }
        j_["tokens"].push_back(piece);
        j_["token_logprobs"].push_back(lp ? json(lp->logprob) : json(nullptr));
        j_["top_logprobs"].push_back(std::move(top));
        j_["text_offset"].push_back(offset);
    }
    bool empty() const { return count_ == 0; }
    // The entries added since the last take (streaming: each chunk carries its tokens').
    json take() {
        json out = std::move(j_);
        clear();
        return out;
    }

  private:
    void clear() {
        count_ = 0;
        j_ = chat_ ? json{{"content", json::array()}, {"refusal", nullptr}}
                   : json{{"tokens", json::array()},
                          {"token_logprobs", json::array()},
                          {"top_logprobs", json::array()},
                          {"text_offset", json::array()}};
    }
    bool chat_;
    uint64_t count_ = 0;
    json j_;
};

// One request's generation as text: tokens from the scheduler's stream turned into final text
// (and, when the request asked, their log-probabilities into `logprobs`).
struct Generation {
    // `echo`: the prompt, whose text (and log-probabilities) come before the completion's.
    Generation(std::shared_ptr<SequenceStream> s, const Tokenizer& t, int32_t last,
               std::vector<std::string> stops, std::optional<LogprobsJson> lp,
               std::vector<int32_t> echo = {})
        : stream(std::move(s)),
          tok(t),
          previous(last),
          text(std::move(stops)),
          logprobs(std::move(lp)),
          echo_prompt(std::move(echo)) {}
    ~Generation() { stream->cancel(); }  // a no-op once it has finished

    // Waits up to `timeout` for tokens; returns the text that became final. Every counted token
    // (usage's completion_tokens) has its log-probabilities, the one that completes a stop
    // string too.
    std::string poll(std::chrono::milliseconds timeout) {
        auto e = stream->wait(timeout);
        std::string out;
        if (!echo_prompt.empty()) {
            for (auto& lp : e.prompt_logprobs) prompt_scores.push_back(std::move(lp));
            // Once every prompt position is scored (before any token comes): its text first.
            if (!logprobs || prompt_scores.size() + 1 >= echo_prompt.size()) out = echoed();
        }
        for (size_t i = 0; i < e.tokens.size(); ++i) {
            const int32_t id = e.tokens[i];
            if (text.stopped()) break;
            if (tokens == 0) first_token = Clock::now();
            ++tokens;
            const std::string piece = tok.decode_piece(previous, id);
            if (logprobs && i < e.logprobs.size())
                logprobs->add(tok, previous, piece, &e.logprobs[i], offset);
            offset += characters(piece);
            out += text.add(piece);
            previous = id;
        }
        if (text.stopped()) {  // a stop string: the sequence is no longer needed
            stream->cancel();
            done = true;
            finish_reason = "stop";
        } else if (e.finished) {
            done = true;
            out += text.finish();
            finish_reason = finish_name(e.reason);
            if (e.reason == FinishReason::error) error = e.error;
        }
        return out;
    }

    // The echoed prompt's text, its tokens' log-probabilities added (special tokens' text is
    // empty, as decode skipping them gives); then echo_prompt is cleared.
    std::string echoed() {
        std::string out;
        int32_t before = -1;  // nothing before the first token
        for (size_t i = 0; i < echo_prompt.size(); ++i) {
            const int32_t id = echo_prompt[i];
            const std::string piece = tok.is_special(id) ? "" : tok.decode_piece(before, id);
            if (logprobs)
                logprobs->add(tok, before, piece, i == 0 ? nullptr : &prompt_scores[i - 1], offset);
            offset += characters(piece);
            out += piece;
            before = id;
        }
        echo_prompt.clear();
        prompt_scores.clear();
        return out;
    }

    std::shared_ptr<SequenceStream> stream;
    const Tokenizer& tok;
    int32_t previous;
    TextStream text;
    std::optional<LogprobsJson> logprobs;
    std::vector<int32_t> echo_prompt;  // until echoed
    std::vector<TokenLogprobs> prompt_scores;
    uint64_t offset = 0;  // characters of the tokens' text so far (completions' text_offset)
    uint64_t tokens = 0;
    bool done = false;
    std::string finish_reason, error;
    Clock::time_point start = Clock::now(), first_token = start;
};

// One request's generations, one per prompt (choice i is prompt i's), as its handler and its
// stream's provider share them.
struct Answer {
    std::vector<std::unique_ptr<Generation>> gens;
    std::vector<uint64_t> prompt_tokens;  // per choice
    bool counted = false;                 // in /metrics (once, however the request ends)

    bool done() const {
        return std::all_of(gens.begin(), gens.end(), [](const auto& g) { return g->done; });
    }
    uint64_t prompt_total() const {
        uint64_t n = 0;
        for (uint64_t p : prompt_tokens) n += p;
        return n;
    }
    uint64_t generated() const {
        uint64_t n = 0;
        for (const auto& g : gens) n += g->tokens;
        return n;
    }
    // The first choice's error, if any ended with one.
    std::string error() const {
        for (const auto& g : gens)
            if (!g->error.empty()) return g->error;
        return {};
    }
    void cancel() {
        for (auto& g : gens) g->stream->cancel();
    }
    // When the request came, and its first token (the earliest of its choices'; `start` while
    // none has one).
    Clock::time_point start() const { return gens[0]->start; }
    Clock::time_point first_token() const {
        std::optional<Clock::time_point> first;
        for (const auto& g : gens)
            if (g->tokens > 0 && (!first || g->first_token < *first)) first = g->first_token;
        return first.value_or(start());
    }
    // Each unfinished choice's text that became final (with its tokens' log-probabilities taken
    // from it, if asked for and `take_logprobs`: a stream's chunk carries its tokens') to
    // on_text(i, text, logprobs), and on_done(i) once it ends; false as soon as
    // one of them returns false. Waits up to `timeout` on the first unfinished choice only (a
    // step gives every running sequence its token at once), then takes what the others have.
    template <class Text, class Done>
    bool poll(std::chrono::milliseconds timeout, bool take_logprobs, Text&& on_text,
              Done&& on_done) {
        // Several choices running: a short wait, so one still prefilling a longer prompt does not
        // hold back the others' streamed text.
        if (std::count_if(gens.begin(), gens.end(), [](const auto& g) { return !g->done; }) > 1)
            timeout = std::min(timeout, std::chrono::milliseconds(20));
        bool waited = false;
        for (size_t i = 0; i < gens.size(); ++i) {
            Generation& g = *gens[i];
            if (g.done) continue;
            const std::string text = g.poll(waited ? std::chrono::milliseconds(0) : timeout);
            waited = true;
            const bool scored = take_logprobs && g.logprobs && !g.logprobs->empty();
            if ((!text.empty() || scored) &&
                !on_text(i, text, scored ? g.logprobs->take() : nlohmann::json(nullptr)))
                return false;
            if (g.done && !on_done(i)) return false;
        }
        return true;
    }
};

// The address and port of a socket's local (`peer` false) or remote end, as httplib writes
// Request::local_addr / remote_addr (getnameinfo, numeric host).
bool socket_end(int fd, bool peer, std::string& ip, int& port) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    auto* sa = reinterpret_cast<sockaddr*>(&addr);
    if ((peer ? ::getpeername(fd, sa, &len) : ::getsockname(fd, sa, &len)) != 0) return false;
    if (addr.ss_family == AF_INET)
        port = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    else if (addr.ss_family == AF_INET6)
        port = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    else
        return false;
    char host[NI_MAXHOST];
    if (::getnameinfo(sa, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return false;
    ip = host;
    return true;
}

// fn(fd) for each of the process's descriptors (/proc/self/fd) until it returns true; whether
// one did (false without /proc).
template <class F>
bool find_descriptor(F&& fn) {
    DIR* dir = ::opendir("/proc/self/fd");
    if (!dir) return false;
    bool found = false;
    while (const dirent* e = ::readdir(dir)) {
        char* end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
        if ((found = fn(static_cast<int>(fd)))) break;
    }
    ::closedir(dir);
    return found;
}

// The connection a request came on, watched for the client leaving. httplib 0.11 gives a handler
// neither its socket nor a disconnect signal, and a non-streaming handler writes nothing until
// the answer is complete, so it could not notice a client gone (a streaming one notices when a
// write fails). The handler runs while httplib holds the connection open, so the process has
// exactly one socket whose two ends are the request's local and remote address and port: found
// among the process's descriptors (/proc/self/fd), then polled without reading. A client gone is
// a FIN or a reset (POLLRDHUP, POLLHUP, POLLERR); a client that only half-closes its side while
// still wanting the answer counts as gone too (as nginx's 499). Not found (not Linux): never
// gone, the request runs to its end as before.
class ClientSocket {
  public:
    explicit ClientSocket(const httplib::Request& req) {
        find_descriptor([&](int fd) {
            std::string ip;
            int port = -1;
            if (!socket_end(fd, true, ip, port) || port != req.remote_port || ip != req.remote_addr)
                return false;
            if (!socket_end(fd, false, ip, port) || port != req.local_port || ip != req.local_addr)
                return false;
            fd_ = fd;
            return true;
        });
    }
    bool found() const { return fd_ >= 0; }
    bool gone() const {
        if (fd_ < 0) return false;
        pollfd p{fd_, POLLRDHUP, 0};
        return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
    }

  private:
    int fd_ = -1;
};

}  // namespace

bool widen_listen_backlog(int port) {
    return find_descriptor([&](int fd) {
        int listening = 0;
        socklen_t len = sizeof listening;
        std::string ip;
        int bound = -1;
        return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening &&
               socket_end(fd, false, ip, bound) && bound == port && ::listen(fd, SOMAXCONN) == 0;
    });
}

bool token_matches(std::string_view given, std::string_view key) {
    // Every byte of the key is compared, against the given token's byte or 0 past its end, and
    // the length difference is folded into the result: no early exit.
    unsigned diff = given.size() == key.size() ? 0u : 1u;
    for (size_t i = 0; i < key.size(); ++i) {
        const auto g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0u;
        diff |= g ^ static_cast<unsigned char>(key[i]);
    }
    return diff == 0 && !key.empty();
}

struct HttpServer::Impl {
    Impl(Scheduler& s, const Tokenizer& t, ServerOptions o)
        : sched(s),
          tok(t),
          token_texts(std::make_shared<const TokenTexts>(t)),
          opts(std::move(o)) {}

    void log(const std::string& line) const {
        if (opts.log) opts.log(line);
    }
    void routes();
    // Answers `e` (its status and error object) and logs it after `where`; `counted`: a /v1
    // route's, in /metrics.
    void refuse(httplib::Response& res, const std::string& where, const ApiError& e, bool counted) {
        send_error(res, e);
        if (counted) metrics.response(e.status());
        log(where + " " + std::to_string(e.status()) + ": " + e.what());
    }
    // The request's Origin when ServerOptions::allowed_origins allows it, else "".
    std::string allowed_origin(const httplib::Request& req) const;
    // A seed for a request that gives none.
    uint64_t fresh_seed() {
        std::lock_guard lock(entropy_mutex);
        return (uint64_t{entropy()} << 32) ^ entropy();
    }
    // The field naming prompt i in errors: "prompt", or "prompt[i]" among several.
    static std::string prompt_param(const CompletionRequest& r, size_t i) {
        return r.prompts.size() > 1 ? "prompt[" + std::to_string(i) + "]" : "prompt";
    }
    // A 400 naming `param` when the prompt's ids do not fit the context.
    void check_fits(const std::vector<int32_t>& ids, const std::string& param) const {
        if (ids.size() > opts.ctx)
            throw ApiError(400,
                           "the prompt has " + std::to_string(ids.size()) +
                               " tokens; the context holds " + std::to_string(opts.ctx),
                           param, "invalid_request_error", "context_length_exceeded");
    }
    // The request's options as each of its sequences takes them (all but the prompt and seed).
    SequenceRequest sequence_request(const CompletionRequest& r) const;
    // Each prompt's token ids (chat: the one conversation's), each checked to fit the context.
    std::vector<std::vector<int32_t>> tokenize(const CompletionRequest& r) const;
    // The messages through the chat template (the server's option, else the tokenizer's),
    // encoded (as generate encodes a rendered chat: without added special tokens, the template
    // writes its own; /tokenize's add_special_tokens may add them).
    std::vector<int32_t> chat_tokens(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt, bool add_special) const;
    // POST /tokenize and /detokenize (vLLM's and llama.cpp's server's, outside /v1 as theirs;
    // with the API key when one is set, as llama.cpp's asks).
    void tokenize_route(const httplib::Request& req, httplib::Response& res);
    void detokenize_route(const httplib::Request& req, httplib::Response& res);
    void completion(const httplib::Request& req, httplib::Response& res, bool chat);
    // A streamed chunk: `text`, the role on the first chat chunk, the finish reason on the last,
    // and the log-probabilities of its tokens (null: not asked for).
    // Choice `index`'s.
    json chunk(const std::string& id, bool chat, const std::string& text, const char* finish_reason,
               bool first, json logprobs = nullptr, size_t index = 0) const;
    // The request's end in /metrics (its first report only), answered with `status`: its
    // prompts' and choices' tokens together, its first token the earliest choice's.
    void count(Answer& a, int status) {
        if (a.counted) return;
        a.counted = true;
        const auto secs = [&](Clock::time_point t) {
            return std::chrono::duration<double>(t - a.start()).count();
        };
        metrics.response(status);
        metrics.generation(a.prompt_total(), a.generated(), secs(a.first_token()),
                           secs(Clock::now()));
    }
    json usage(uint64_t prompt, uint64_t generated) const {
        return {{"prompt_tokens", prompt},
                {"completion_tokens", generated},
                {"total_tokens", prompt + generated}};
    }

    Scheduler& sched;
    const Tokenizer& tok;
    std::shared_ptr<const TokenTexts> token_texts;  // every constrained request's
    // A request's token id (of `param`) the tokenizer has, or a 400 naming param.
    void check_token(int32_t id, const std::string& param) const {
        if (id < 0 || static_cast<uint64_t>(id) >= tok.vocab_size())
            throw ApiError(400,
                           "token id " + std::to_string(id) + " is outside the vocabulary (" +
                               std::to_string(tok.vocab_size()) + ")",
                           param);
    }
    // Chat's template: the server's option, else the tokenizer's.
    const std::string& chat_template() const {
        return opts.chat_template.empty() ? tok.chat_template() : opts.chat_template;
    }

    ServerOptions opts;
    httplib::Server svr;
    std::atomic<uint64_t> next_id{1};
    std::random_device entropy;  // seeds of requests that give none
    ServeMetrics metrics;
    std::mutex entropy_mutex;
};

std::vector<std::vector<int32_t>> HttpServer::Impl::tokenize(const CompletionRequest& r) const {
    std::vector<std::vector<int32_t>> out;
    if (r.chat) {
        out.push_back(chat_tokens(r.messages, true, false));
        if (out.back().empty()) throw ApiError(400, "the messages encode to no tokens", "messages");
        check_fits(out.back(), "messages");
        return out;
    }
    for (size_t i = 0; i < r.prompts.size(); ++i) {
        const CompletionRequest::Prompt& p = r.prompts[i];
        const std::string param = prompt_param(r, i);
        std::vector<int32_t> ids;
        if (p.ids) {
            ids = *p.ids;
            for (int32_t id : ids) check_token(id, param);
        } else if (p.text.empty()) {
            if (tok.bos_id()) ids = {*tok.bos_id()};  // as generate: an empty prompt starts at BOS
        } else {
            ids = tok.encode(p.text, true);
        }
        if (ids.empty()) throw ApiError(400, "the prompt encodes to no tokens", param);
        check_fits(ids, param);
        out.push_back(std::move(ids));
    }
    return out;
}

std::vector<int32_t> HttpServer::Impl::chat_tokens(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt,
                                                   bool add_special) const {
    const std::string& chat_template = this->chat_template();
    if (chat_template.empty())
        throw ApiError(400,
                       "this model has no chat template; use /v1/completions or serve "
                       "--chat-template FILE",
                       "messages");
    ChatTemplateInputs in;
    in.messages = messages;
    in.add_generation_prompt = add_generation_prompt;
    if (tok.bos_id()) in.bos_token = std::string(tok.piece(*tok.bos_id()));
    if (tok.eos_id()) in.eos_token = std::string(tok.piece(*tok.eos_id()));
    try {
        return tok.encode(render_chat_template(chat_template, in), add_special);
    } catch (const Error& e) {
        throw ApiError(400,
                       std::string("the chat template cannot render these messages: ") + e.what(),
                       "messages");
    }
}

void HttpServer::Impl::tokenize_route(const httplib::Request& req, httplib::Response& res) {
    try {
        const TokenizeRequest r = parse_tokenize_request(req.body);
        const std::vector<int32_t> ids =
            r.chat ? chat_tokens(r.messages, r.add_generation_prompt, r.add_special)
                   : tok.encode(r.text, r.add_special);
        json tokens = json::array();
        int32_t previous = -1;
        for (int32_t id : ids) {
            if (r.with_pieces) {
                // Part of a character (a byte token): its bytes, as llama.cpp's server gives them.
                const std::string piece = tok.decode_piece(previous, id);
                tokens.push_back(
                    {{"id", id},
                     {"piece", sanitize_utf8(piece) == piece ? json(piece) : bytes_of(piece)}});
            } else
                tokens.push_back(id);
            previous = id;
        }
        res.set_content(dump({{"tokens", std::move(tokens)},
                              {"count", ids.size()},
                              {"max_model_len", opts.ctx}}),
                        "application/json");
    } catch (const ApiError& e) {
        refuse(res, "POST " + req.path, e, false);
    } catch (const Error& e) {  // the tokenizer on hostile text
        refuse(res, "POST " + req.path, ApiError(400, e.what()), false);
    }
}

void HttpServer::Impl::detokenize_route(const httplib::Request& req, httplib::Response& res) {
    try {
        const std::vector<int32_t> ids = parse_detokenize_request(req.body);
        for (size_t i = 0; i < ids.size(); ++i)
            check_token(ids[i], "tokens[" + std::to_string(i) + "]");
        const std::string text = tok.decode(ids);
        res.set_content(dump({{"prompt", text}, {"content", text}}), "application/json");
    } catch (const ApiError& e) {
        refuse(res, "POST " + req.path, e, false);
    }
}

SequenceRequest HttpServer::Impl::sequence_request(const CompletionRequest& r) const {
    SequenceRequest sr;
    for (const auto& [token, bias] : r.logit_bias) check_token(token, "logit_bias");
    sr.sampling = {.temperature = r.temperature,
                   .top_k = r.top_k,
                   .top_p = r.top_p,
                   .seed = 0,
                   .presence_penalty = r.presence_penalty,
                   .frequency_penalty = r.frequency_penalty,
                   .logit_bias = r.logit_bias,
                   .min_p = r.min_p,
                   .repetition_penalty = r.repetition_penalty,
                   .repetition_last_n = r.repetition_last_n};
    sr.max_tokens = std::min(opts.ctx, r.max_tokens.value_or(r.chat ? kChatDefaultMaxTokens
                                                                    : kCompletionDefaultMaxTokens));
    if (!r.ignore_eos)
        sr.stop_ids = r.chat && !opts.chat_template.empty() ? chat_stop_ids(tok, opts.chat_template)
                                                            : tok.stop_ids();
    for (int32_t stop : r.stop_token_ids) {
        check_token(stop, "stop_token_ids");
        sr.stop_ids.push_back(stop);
    }
    if (r.grammar)  // stop tokens end the document once it is whole
        sr.sampling.grammar = std::make_shared<const TokenGrammar>(
            TokenGrammar{*r.grammar, token_texts, sr.stop_ids});
    sr.token_count = tok.vocab_size();
    sr.logprobs = r.logprobs;
    sr.prompt_logprobs = r.echo && r.logprobs;
    return sr;
}

json HttpServer::Impl::chunk(const std::string& id, bool chat, const std::string& text,
                             const char* finish_reason, bool first, json logprobs,
                             size_t index) const {
    json choice = {{"index", index}};
    choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
    if (chat) {
        json delta = json::object();
        if (first) delta["role"] = "assistant";
        if (!text.empty() || first || !logprobs.is_null()) delta["content"] = text;
        choice["delta"] = delta;
    } else {
        choice["text"] = text;
    }
    choice["logprobs"] = std::move(logprobs);
    return {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", static_cast<int64_t>(std::time(nullptr))},
            {"model", opts.model_name},
            {"choices", json::array({choice})}};
}

void HttpServer::Impl::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(next_id++));
    const std::string id = std::string(chat ? "chatcmpl-" : "cmpl-") + hex;
    res.set_header("X-Request-Id", id);
    const std::string where = id + " POST " + req.path;
    auto answer = std::make_shared<Answer>();
    bool stream = false, include_usage = false;
    try {
        const CompletionRequest r = parse_completion_request(req.body, chat, opts.ctx);
        const std::vector<std::vector<int32_t>> prompts = tokenize(r);
        const SequenceRequest sr = sequence_request(r);
        Scheduler::SubmittedAll sub;
        // Echo of the prompts alone: nothing to run.
        if (sr.max_tokens == 0 && !sr.prompt_logprobs) {
            for (size_t i = 0; i < prompts.size(); ++i)
                sub.streams.push_back(SequenceStream::ended());
        } else {
            // With a seed, every prompt samples as its request alone would (the same seed each,
            // as vLLM does), so choice i is `generate`'s for prompt i; without one, each draws
            // its own (the same prompt twice: two samples, not one twice).
            std::vector<SequenceRequest> requests(prompts.size(), sr);
            for (size_t i = 0; i < prompts.size(); ++i) {
                requests[i].prompt = prompts[i];
                requests[i].sampling.seed = r.seed ? *r.seed : fresh_seed();
            }
            sub = sched.submit_all(std::move(requests));
        }
        if (sub.refusal == Scheduler::Refusal::queue_full) {
            res.set_header("Retry-After", "1");
            throw ApiError(429, "the server is busy (" + sub.why + "); retry later", "",
                           "rate_limit_error", "rate_limit_exceeded");
        }
        if (sub.refusal == Scheduler::Refusal::unsupported) throw ApiError(400, sub.why, "echo");
        if (sub.refusal == Scheduler::Refusal::too_many) throw ApiError(400, sub.why, "prompt");
        if (sub.refusal == Scheduler::Refusal::too_large)
            throw ApiError(400,
                           sub.why + (prompts.size() > 1 ? " (" + prompt_param(r, sub.refused) + ")"
                                                         : std::string()),
                           "max_tokens", "invalid_request_error", "context_length_exceeded");
        try {
            for (size_t i = 0; i < prompts.size(); ++i) {
                answer->gens.push_back(std::make_unique<Generation>(
                    sub.streams[i], tok, prompts[i].back(), r.stop,
                    r.logprobs ? std::optional<LogprobsJson>(std::in_place, chat) : std::nullopt,
                    r.echo ? prompts[i] : std::vector<int32_t>{}));
                answer->prompt_tokens.push_back(prompts[i].size());
            }
        } catch (...) {  // the submitted sequences must not run on unread
            for (auto& st : sub.streams) st->cancel();
            throw;
        }
        stream = r.stream;
        include_usage = r.include_usage;
    } catch (const ApiError& e) {
        return refuse(res, where, e, true);
    } catch (const Error& e) {  // the tokenizer on hostile text; nothing else is expected here
        return refuse(res, where, ApiError(400, e.what()), true);
    }

    auto done_line = [this, where](Answer& a) {
        const std::string error = a.error();
        count(a, error.empty() ? 200 : 500);
        // The choices' finish reasons, each with its count when there are several.
        std::map<std::string, uint64_t> ends;
        for (const auto& g : a.gens) ++ends[g->finish_reason.empty() ? "error" : g->finish_reason];
        std::string reasons;
        for (const auto& [reason, n] : ends)
            reasons += (reasons.empty() ? "" : ", ") +
                       (a.gens.size() > 1 ? std::to_string(n) + " " : "") + reason;
        const auto secs = [&](Clock::time_point t) {
            return std::chrono::duration<double>(t - a.start()).count();
        };
        const std::string prompts =
            a.gens.size() == 1 ? "" : std::to_string(a.gens.size()) + " prompts, ";
        char buf[160];
        std::snprintf(buf, sizeof buf, "%llu tokens, %llu generated (",
                      static_cast<unsigned long long>(a.prompt_total()),
                      static_cast<unsigned long long>(a.generated()));
        char times[80];
        std::snprintf(times, sizeof times, "), first token %.3f s, %.3f s", secs(a.first_token()),
                      secs(Clock::now()));
        log(where + (error.empty() ? " 200" : " 500") + ": " + prompts + "prompt " + buf + reasons +
            times + (error.empty() ? "" : ": " + error));
    };

    // Between tokens (and at least every 200 ms) the connection is checked: a client gone cancels
    // its sequences at once, before their first token too (a streaming client's failed write
    // would notice only once there is text to send).
    auto client = std::make_shared<const ClientSocket>(req);
    if (!stream) {
        std::vector<std::string> texts(answer->gens.size());
        while (!answer->done()) {
            answer->poll(
                std::chrono::milliseconds(200), false,
                [&](size_t i, const std::string& text, const json&) {
                    texts[i] += text;
                    return true;
                },
                [&](size_t i) {
                    // A choice that failed fails the request: the others need not run on.
                    if (!answer->gens[i]->error.empty()) answer->cancel();
                    return true;
                });
            if (!answer->done() && client->gone()) {
                answer->cancel();
                count(*answer, 499);
                log(where + " client gone after " + std::to_string(answer->generated()) +
                    " tokens: cancelled");
                // Never read (nobody is there); 499 as nginx logs a client gone.
                return send_error(res, ApiError(499, "the client closed the connection"));
            }
        }
        done_line(*answer);
        if (const std::string error = answer->error(); !error.empty())
            return send_error(res, ApiError(500, error, "", "server_error"));
        json choices = json::array();
        for (size_t i = 0; i < answer->gens.size(); ++i) {
            Generation& g = *answer->gens[i];
            json choice = {{"index", i}, {"finish_reason", g.finish_reason}};
            if (chat)
                choice["message"] = {{"role", "assistant"}, {"content", texts[i]}};
            else
                choice["text"] = texts[i];
            choice["logprobs"] = g.logprobs ? g.logprobs->take() : json(nullptr);
            choices.push_back(std::move(choice));
        }
        const json body = {{"id", id},
                           {"object", chat ? "chat.completion" : "text_completion"},
                           {"created", static_cast<int64_t>(std::time(nullptr))},
                           {"model", opts.model_name},
                           {"choices", std::move(choices)},
                           {"usage", usage(answer->prompt_total(), answer->generated())}};
        res.set_content(dump(body), "application/json");
        return;
    }

    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, answer, client, id, chat, include_usage, done_line](size_t,
                                                                   httplib::DataSink& sink) {
            auto send = [&](const json& j) {
                const std::string event = "data: " + dump(j) + "\n\n";
                return sink.write(event.data(), event.size());
            };
            bool first = true;
            // The first chunk at once (the client sees the request accepted), then each choice's
            // text as it becomes final and its finish reason when it ends; a failed write is a
            // client gone: the sequences are cancelled. A choice that fails ends the stream with
            // an error event (the others are cancelled).
            if (chat && !send(chunk(id, chat, "", nullptr, true))) return false;
            first = !chat;
            bool failed = false;
            while (!answer->done() && !failed) {
                const bool ok = answer->poll(
                    std::chrono::milliseconds(200), true,
                    [&](size_t i, const std::string& text, json logprobs) {
                        if (failed) return true;  // nothing after the error event
                        const bool sent =
                            send(chunk(id, chat, text, nullptr, first, std::move(logprobs), i));
                        first = false;
                        return sent;
                    },
                    [&](size_t i) {
                        if (failed) return true;
                        const Generation& g = *answer->gens[i];
                        if (!g.error.empty()) {
                            failed = true;
                            return send(ApiError(500, g.error, "", "server_error").body());
                        }
                        return send(
                            chunk(id, chat, "", g.finish_reason.c_str(), false, nullptr, i));
                    });
                if (!ok) return false;
                if (!answer->done() && !failed && client->gone()) return false;
            }
            if (failed) answer->cancel();
            while (failed && !answer->done())  // the cancelled ones end at the next step
                answer->poll(
                    std::chrono::milliseconds(200), false,
                    [](size_t, const std::string&, json) { return true; },
                    [](size_t) { return true; });
            done_line(*answer);
            if (!failed && include_usage) {
                json u = chunk(id, chat, "", nullptr, false);
                u["choices"] = json::array();
                u["usage"] = usage(answer->prompt_total(), answer->generated());
                if (!send(u)) return false;
            }
            const std::string done = "data: [DONE]\n\n";
            if (!sink.write(done.data(), done.size())) return false;
            sink.done();
            return true;
        },
        [this, answer](bool success) {
            if (success) return;
            answer->cancel();  // the client went away mid-stream
            count(*answer, 499);
        });
}

std::string HttpServer::Impl::allowed_origin(const httplib::Request& req) const {
    const std::string origin = req.get_header_value("Origin");
    if (origin.empty()) return {};
    for (const std::string& o : opts.allowed_origins)
        if (o == "*" || o == origin) return origin;
    return {};
}

void HttpServer::Impl::routes() {
    // CORS: an allowed origin's answers say so (every response, errors included: a browser hides
    // a response without it from the page); its preflights are answered before the API key is
    // asked (a browser sends none with them).
    svr.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (const std::string origin = allowed_origin(req); !origin.empty()) {
            res.set_header("Access-Control-Allow-Origin", origin);
            res.set_header("Vary", "Origin");
        }
    });
    svr.Options(R"(/.*)", [this](const httplib::Request& req, httplib::Response& res) {
        if (allowed_origin(req).empty()) {
            res.status = 403;
            send_error(res, ApiError(403,
                                     "this origin may not call the API (serve "
                                     "--allowed-origins)",
                                     "", "permission_error"));
            return;
        }
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        res.set_header("Access-Control-Max-Age", "600");
    });
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        // Every /v1 route and the tokenizer's (as llama.cpp's server asks; vLLM's leaves those
        // open): only /health and /metrics answer without the key.
        const bool keyed =
            req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
        if (opts.api_key.empty() || !keyed || req.method == "OPTIONS")
            return httplib::Server::HandlerResponse::Unhandled;
        const std::string h = req.get_header_value("Authorization");
        if (h.rfind("Bearer ", 0) == 0 &&
            token_matches(std::string_view(h).substr(7), opts.api_key))
            return httplib::Server::HandlerResponse::Unhandled;
        send_error(res, ApiError(401, "a valid API key is required (Authorization: Bearer <key>)",
                                 "", "authentication_error", "invalid_api_key"));
        if (req.path.rfind("/v1/", 0) == 0) metrics.response(401);  // /metrics counts /v1's
        log(req.method + " " + req.path + " 401: no valid API key");
        return httplib::Server::HandlerResponse::Handled;
    });
    // Anything a handler throws past its own catches (nothing expected: out of memory, say) is a
    // 500 with an error object, logged, its text kept out of the response's headers.
    svr.set_exception_handler(
        [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
            std::string what = "an unknown exception";
            try {
                std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                what = e.what();
            } catch (...) {
            }
            send_error(res, ApiError(500, "internal server error", "", "server_error"));
            if (req.path.rfind("/v1/", 0) == 0) metrics.response(500);
            log(req.method + " " + req.path + " 500: " + what);
        });
    // Statuses httplib sets itself (no route, body too large, unreadable request) get an
    // error object too.
    svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        std::string message = "request failed";
        if (res.status == 404) message = "no route " + req.method + " " + req.path;
        if (res.status == 413)
            message = "the request body is larger than " + std::to_string(opts.max_body) + " bytes";
        if (res.status == 400) message = "the request could not be read";
        if (res.status == 408) message = "the request was not received in time";
        const std::string type = res.status == 404 ? "not_found_error" : "invalid_request_error";
        res.set_content(dump(ApiError(res.status, message, "", type).body()), "application/json");
        if (req.path.rfind("/v1/", 0) == 0) metrics.response(res.status);
        log(req.method + " " + req.path + " " + std::to_string(res.status) + ": " + message);
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        const SchedulerStats s = sched.stats();
        res.set_content(dump({{"status", "ok"},
                              {"running", s.running},
                              {"queued", s.queued},
                              {"free_kv_blocks", s.free_blocks},
                              {"total_kv_blocks", s.total_blocks},
                              {"kept_caches", s.kept},
                              {"reused_prompt_tokens", s.reused_positions},
                              {"shared_prompt_tokens", s.shared_positions},
                              {"steps", s.steps},
                              {"step_rows", s.step_rows},
                              {"step_tokens", s.step_tokens}}),
                        "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics.render(sched.stats()), "text/plain; version=0.0.4; charset=utf-8");
    });
    const json model = {
        {"id", opts.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "qforge"}};
    svr.Get("/v1/models", [this, model](const httplib::Request&, httplib::Response& res) {
        res.set_content(dump({{"object", "list"}, {"data", json::array({model})}}),
                        "application/json");
        metrics.response(200);
    });
    // The API's retrieve (client.models.retrieve(id)): the served model, or a 404 naming the id.
    svr.Get(R"(/v1/models/(.+))", [this, model](const httplib::Request& req,
                                                httplib::Response& res) {
        if (req.matches[1] != opts.model_name) {
            const ApiError e(404,
                             "the model '" + std::string(req.matches[1]) +
                                 "' does not exist; this server serves '" + opts.model_name + "'",
                             "model", "invalid_request_error", "model_not_found");
            send_error(res, e);
            metrics.response(404);
            return;
        }
        res.set_content(dump(model), "application/json");
        metrics.response(200);
    });
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
        completion(req, res, false);
    });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
        completion(req, res, true);
    });
    svr.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
        tokenize_route(req, res);
    });
    svr.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
        detokenize_route(req, res);
    });
}

HttpServer::HttpServer(Scheduler& scheduler, const Tokenizer& tokenizer, ServerOptions options)
    : impl_(std::make_unique<Impl>(scheduler, tokenizer, std::move(options))) {
    auto& svr = impl_->svr;
    const int threads = std::max(4, impl_->opts.threads);
    svr.new_task_queue = [threads] {
        return new httplib::ThreadPool(static_cast<size_t>(threads));
    };
    svr.set_payload_max_length(impl_->opts.max_body);
    svr.set_read_timeout(impl_->opts.read_timeout_s, 0);
    svr.set_write_timeout(impl_->opts.write_timeout_s, 0);
    svr.set_keep_alive_timeout(5);
    impl_->routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::bind() {
    auto& svr = impl_->svr;
    const auto& o = impl_->opts;
    if (o.port == 0) {
        port_ = svr.bind_to_any_port(o.host);
        if (port_ < 0) port_ = 0;
    } else {
        port_ = svr.bind_to_port(o.host, o.port) ? o.port : 0;
    }
    if (port_ == 0)
        throw Error("serve: cannot listen on " + o.host + ":" + std::to_string(o.port) +
                    " (in use, or not an address of this machine)");
    widen_listen_backlog(port_);
}

void HttpServer::listen() { impl_->svr.listen_after_bind(); }

void HttpServer::stop() { impl_->svr.stop(); }

}  // namespace qforge::serve
