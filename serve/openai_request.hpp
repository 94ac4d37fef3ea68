// The OpenAI API's completion requests (POST /v1/completions, /v1/chat/completions): the body
// parsed and every field we read checked for type and range before any work, each failure an
// ApiError the server returns as an OpenAI-style error object with a 4xx status:
//   {"error": {"message": ..., "type": "invalid_request_error", "param": "max_tokens",
//              "code": null}}
// Fields of the API that we do not read are ignored (clients send many, often null); the ones
// whose non-default values we cannot honour (n > 1, best_of, tools), and other
// servers' sampling extensions that we do not implement (vLLM's, llama.cpp's: typical_p,
// mirostat, guided_grammar, ...) set to anything but their neutral value, are refused rather than
// silently ignored.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/token_constraint.hpp"
#include "tokenizer/chat_template.hpp"

namespace qforge::serve {

class ApiError : public std::runtime_error {
  public:
    ApiError(int status, std::string message, std::string param = {},
             std::string type = "invalid_request_error", std::string code = {})
        : std::runtime_error(message),
          status_(status),
          param_(std::move(param)),
          type_(std::move(type)),
          code_(std::move(code)) {}
    int status() const { return status_; }
    // {"error": {message, type, param, code}}
    nlohmann::json body() const;

  private:
    int status_;
    std::string param_, type_, code_;
};

struct CompletionRequest {
    bool chat = false;
    // /v1/completions: the prompts, each as text or as token ids; the API takes several in one
    // request (an array of them), each its own sequence and choice, in order.
    struct Prompt {
        std::string text;
        std::optional<std::vector<int32_t>> ids;
    };
    std::vector<Prompt> prompts;
    // /v1/chat/completions
    std::vector<ChatMessage> messages;

    std::optional<uint64_t> max_tokens;  // unset: the endpoint's default
    float temperature = 1.0f;            // the API's defaults
    float top_p = 1.0f;
    uint32_t top_k = 0;             // an extension (llama.cpp's): 0, all tokens
    float min_p = 0.0f;             // an extension (vLLM's, llama.cpp's): 0, none
    float presence_penalty = 0.0f;  // runtime/sampling.hpp: on the completion's own tokens
    float frequency_penalty = 0.0f;
    // vLLM's repetition_penalty (repetition_last_n 0: the whole context) or llama.cpp's server's
    // repeat_penalty with repeat_last_n; 1: none.
    float repetition_penalty = 1.0f;
    uint64_t repetition_last_n = 0;
    std::vector<std::pair<int32_t, float>> logit_bias;  // ids not yet checked against the vocab
    std::optional<uint64_t> seed;
    std::vector<std::string> stop;  // at most kMaxStops, none empty or past kMaxStopBytes
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
    // Set: each token's log-probability and this many most likely alternatives (at most
    // kMaxLogprobs); completions' logprobs, chat's logprobs with top_logprobs.
    std::optional<uint32_t> logprobs;
    // /v1/completions: the prompt's text before the completion's (and, with logprobs, its tokens'
    // log-probabilities, the first one's null); max_tokens may then be 0.
    bool echo = false;
    // ignore_eos (vLLM's and llama.cpp's server's extension): generation goes on past the end-of-
    // sequence tokens until max_tokens or a full context (`qforge generate --ignore-eos`).
    bool ignore_eos = false;
    // stop_token_ids (vLLM's extension): more token ids that end generation (not emitted), with
    // or without ignore_eos; ids not yet checked against the vocabulary.
    std::vector<int32_t> stop_token_ids;
    // Constrained generation (runtime/token_constraint.hpp): a JSON schema (response_format
    // json_object or json_schema, vLLM's guided_json, llama.cpp's server's json_schema), a
    // regular expression (guided_regex) or a choice of texts (guided_choice), or vLLM's
    // structured_outputs with one of them; null: none.
    std::shared_ptr<const TextGrammar> grammar;
};

inline constexpr int64_t kMaxPrompts = 256;  // in one /v1/completions request
// Stop strings: the API's reference takes 4; vLLM takes any number, and evaluation harnesses
// send more (lm-eval's HumanEval five). Each is matched against the held text every token.
inline constexpr int64_t kMaxStops = 16;
inline constexpr int64_t kMaxStopBytes = 256;
inline constexpr int64_t kMaxLogprobs = 20;  // vLLM's default bound (the API's: 5 and 20)

// POST /tokenize, in vLLM's shape ({"prompt", "add_special_tokens": true} or {"messages",
// "add_generation_prompt": true, "add_special_tokens": false}; its chat_template, tools,
// documents and continue_final_message refused) or llama.cpp's server's ({"content",
// "add_special": false, "with_pieces"}).
struct TokenizeRequest {
    std::string text;
    bool add_special = false;
    bool chat = false;  // messages, through the chat template
    std::vector<ChatMessage> messages;
    bool add_generation_prompt = true;
    bool with_pieces = false;  // each token as {"id", "piece"} (llama.cpp's server's)
};
TokenizeRequest parse_tokenize_request(std::string_view body);
// POST /detokenize: {"tokens": [ids]} (ids not yet checked against the vocabulary).
std::vector<int32_t> parse_detokenize_request(std::string_view body);

// Parses and checks a request body. `max_tokens_limit` bounds max_tokens (the context). Throws
// ApiError (400) naming the field.
CompletionRequest parse_completion_request(std::string_view body, bool chat,
                                           uint64_t max_tokens_limit);

}  // namespace qforge::serve
