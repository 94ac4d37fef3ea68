// The OpenAI-compatible HTTP API of `qforge serve`, on cpp-httplib:
//   POST /v1/completions, /v1/chat/completions   (JSON, or server-sent events with "stream")
//   GET  /v1/models, /v1/models/{id}, /health, /metrics
//   POST /tokenize, /detokenize
//   OPTIONS (CORS preflight) for the origins ServerOptions::allowed_origins names
// Requests are checked (serve/openai_request.hpp), tokenized (chat: the model's chat template),
// and submitted to the scheduler; each HTTP worker thread then waits on its request's stream.
// Every failure is an OpenAI-style error object with its status: 400 bad request, 401 missing or
// wrong API key, 404, 413 body over the limit, 429 queue full (with Retry-After), 500 the model
// failed. A client that sends too slowly is cut off by the read timeout; a client that
// disconnects cancels its sequence (its blocks are free at the next step): a streaming one when a
// write fails, a non-streaming one when its connection is seen closed (checked between tokens).
//
// The library never prints: log lines (one per request, with its id) go to ServerOptions::log.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "serve/scheduler.hpp"
#include "tokenizer/tokenizer.hpp"

namespace qforge::serve {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;  // 0: any free port (HttpServer::port() says which)
    std::string
        api_key;  // non-empty: /v1 and the tokenizer's routes need "Authorization: Bearer KEY"
    std::string model_name;  // /v1/models' id and the responses' "model"
    // Chat requests' template instead of the tokenizer's (`serve --chat-template`); their stop
    // ids then add the turn ends it writes (chat_stop_ids, as `generate --chat-template`).
    std::string chat_template;
    uint64_t ctx = 4096;          // the scheduler's context (prompt + generated, per request)
    uint64_t max_body = 1 << 20;  // bytes; a larger body is refused with 413
    int read_timeout_s = 10;      // a client silent this long while sending is cut off
    int write_timeout_s = 30;
    int threads = 32;  // HTTP worker threads (each waiting request holds one)
    // Web pages from these origins may call the API from a browser (CORS: their requests get
    // Access-Control-Allow-Origin, their preflights an answer); "*" any origin. Empty: none
    // (a browser then refuses other origins' pages the answers, the default: a page a user
    // visits cannot drive a model on their loopback).
    std::vector<std::string> allowed_origins;
    std::function<void(std::string_view)> log;
};

// A bearer token check in constant time: the work done depends only on the key's length, not on
// where a wrong token first differs.
bool token_matches(std::string_view given, std::string_view key);

// Raises the backlog of the process's socket listening on `port` to the system's maximum
// (SOMAXCONN): httplib 0.11, which Debian builds as a shared library, listens with a backlog of 5
// connections (CPPHTTPLIB_LISTEN_BACKLOG, compiled in). A burst of more connects than that while
// its accept thread waits for a core (a step's threads hold both of a 2-core machine) overflowed
// the queue: the kernel dropped the SYNs and the clients retried 1 s later, then 3 s (load test,
// 16 streams: TTFT p99 2057 ms where the server's own first-token times stayed under 0.16 s;
// /proc/net/netstat's ListenOverflows counted them). Linux takes a second listen() on a listening
// socket as its new backlog. Whether the socket was found (no /proc/self/fd: not Linux).
bool widen_listen_backlog(int port);

class HttpServer {
  public:
    HttpServer(Scheduler& scheduler, const Tokenizer& tokenizer, ServerOptions options);
    ~HttpServer();
    // Binds the socket (throws Error when it cannot; its backlog widened, widen_listen_backlog);
    // then port() is the bound port.
    void bind();
    int port() const { return port_; }
    // Serves until stop() (from another thread or a signal's watcher).
    void listen();
    void stop();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int port_ = 0;
};

}  // namespace qforge::serve
