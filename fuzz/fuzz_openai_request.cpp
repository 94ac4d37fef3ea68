// The OpenAI API's request bodies as `qforge serve` reads them (serve/openai_request.hpp): the
// first byte picks the route (its low two bits: /v1/completions, /v1/chat/completions,
// /tokenize, /detokenize), the rest is the body. The contract differs from the file readers':
// a body is either parsed or refused with an ApiError (the server's 4xx), never anything else;
// and a parsed request keeps the bounds the server relies on (prompts, stop strings,
// log-probabilities, messages).
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "fuzz/fuzz_support.hpp"
#include "runtime/sampling.hpp"
#include "serve/openai_request.hpp"

using namespace qforge;
using namespace qforge::serve;

namespace {

void require(bool ok, const char* what) {
    if (ok) return;
    std::fprintf(stderr, "\n==qforge-fuzz== a parsed request breaks a bound: %s\n", what);
    std::abort();
}

void check_completion(const CompletionRequest& r, bool chat) {
    if (chat) {
        require(!r.messages.empty() && r.prompts.empty(), "chat: messages, no prompts");
    } else {
        require(!r.prompts.empty() && r.prompts.size() <= kMaxPrompts, "prompts: 1 .. kMaxPrompts");
        for (const auto& p : r.prompts) require(!p.ids || !p.ids->empty(), "no empty id prompt");
    }
    require(r.stop.size() <= kMaxStops, "stop: at most kMaxStops");
    for (const auto& s : r.stop)
        require(!s.empty() && s.size() <= kMaxStopBytes, "stop strings: 1 .. kMaxStopBytes");
    require(!r.logprobs || *r.logprobs <= kMaxLogprobs, "logprobs: at most kMaxLogprobs");
    require(r.temperature >= 0.0f && r.temperature <= 2.0f, "temperature in [0, 2]");
    require(r.top_p > 0.0f && r.top_p <= 1.0f, "top_p in (0, 1]");
    require(r.min_p >= 0.0f && r.min_p <= 1.0f, "min_p in [0, 1]");
    require(r.repetition_penalty >= kMinRepetitionPenalty &&
                r.repetition_penalty <= kMaxRepetitionPenalty,
            "repetition_penalty in [kMinRepetitionPenalty, kMaxRepetitionPenalty]");
    require(!r.echo || !chat, "echo: completions only");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const int route = data[0] & 3;
    const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
    fuzz::run_reader([&] {
        try {
            switch (route) {
                case 0:
                case 1:
                    check_completion(parse_completion_request(body, route == 1, 4096), route == 1);
                    break;
                case 2: {
                    const TokenizeRequest t = parse_tokenize_request(body);
                    require(t.chat == !t.messages.empty(), "tokenize: messages when chat");
                    break;
                }
                default:
                    (void)parse_detokenize_request(body);
            }
        } catch (const ApiError& e) {  // the refusal the server answers with a 4xx
            require(e.status() >= 400 && e.status() < 500, "an ApiError's status is a 4xx");
            volatile size_t sink =
                e.body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size();
            (void)sink;
            if (fuzz::verbose()) std::fprintf(stderr, "qforge-fuzz: refused: %s\n", e.what());
        }
    });
    return 0;
}
