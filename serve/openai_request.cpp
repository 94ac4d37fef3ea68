#include "serve/openai_request.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "formats/json_io.hpp"
#include "runtime/sampling.hpp"

namespace qforge::serve {

nlohmann::json ApiError::body() const {
    nlohmann::json e = {{"message", what()}, {"type", type_}};
    e["param"] = param_.empty() ? nlohmann::json(nullptr) : nlohmann::json(param_);
    e["code"] = code_.empty() ? nlohmann::json(nullptr) : nlohmann::json(code_);
    return {{"error", e}};
}

namespace {

using nlohmann::json;

// A request body nests a few levels (messages[i].content[j].text); 16 is plenty.
constexpr int kMaxRequestDepth = 16;

[[noreturn]] void bad(const std::string& param, const std::string& what) {
    throw ApiError(400, "'" + param + "' " + what, param);
}

// The field, or nullptr when absent or null (the API treats null as "not given").
const json* field(const json& body, const char* name) {
    auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& v, const std::string& param) {
    if (!v.is_number()) bad(param, "must be a number, found " + describe_json(v));
    return v.get<double>();
}

// An integer (a JSON number with no fraction) in [lo, hi].
int64_t integer(const json& v, const std::string& param, int64_t lo, int64_t hi) {
    const auto out_of_range = [&](const std::string& found) {
        bad(param,
            "must be in " + std::to_string(lo) + " .. " + std::to_string(hi) + ", found " + found);
    };
    if (v.is_number_unsigned()) {  // nlohmann reads every non-negative integer as unsigned
        const auto u = v.get<uint64_t>();
        if (u > static_cast<uint64_t>(hi) || static_cast<int64_t>(u) < lo)
            out_of_range(std::to_string(u));
        return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) {
        const auto i = v.get<int64_t>();
        if (i < lo || i > hi) out_of_range(std::to_string(i));
        return i;
    }
    bad(param, "must be an integer, found " + describe_json(v));
}

bool boolean(const json& v, const std::string& param) {
    if (!v.is_boolean()) bad(param, "must be a boolean, found " + describe_json(v));
    return v.get<bool>();
}

const std::string& string(const json& v, const std::string& param) {
    if (!v.is_string()) bad(param, "must be a string, found " + describe_json(v));
    return v.get_ref<const std::string&>();
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string message_content(const json& v, const std::string& param) {
    if (v.is_string()) return v.get<std::string>();
    if (!v.is_array()) bad(param, "must be a string or an array of text parts");
    std::string text;
    for (size_t i = 0; i < v.size(); ++i) {
        const std::string p = param + "[" + std::to_string(i) + "]";
        if (!v[i].is_object()) bad(p, "must be an object");
        const json* type = field(v[i], "type");
        if (!type || string(*type, p + ".type") != "text")
            bad(p + ".type", "must be \"text\" (only text parts are supported)");
        const json* t = field(v[i], "text");
        if (!t) bad(p + ".text", "is required");
        text += string(*t, p + ".text");
    }
    return text;
}

// Token ids: an array of integers in int32 range (`param` names it in errors), non-empty and at
// most `max` long when told.
std::vector<int32_t> token_ids(const json& v, const std::string& param, bool non_empty,
                               size_t max = std::numeric_limits<size_t>::max()) {
    if (!v.is_array() || (non_empty && v.empty()) || v.size() > max)
        bad(param,
            std::string("must be a ") + (non_empty ? "non-empty " : "") + "array of " +
                (max < std::numeric_limits<size_t>::max() ? "at most " + std::to_string(max) + " "
                                                          : "") +
                "token ids, found " + describe_json(v));
    std::vector<int32_t> ids;
    for (size_t i = 0; i < v.size(); ++i)
        ids.push_back(static_cast<int32_t>(integer(v[i], param + "[" + std::to_string(i) + "]", 0,
                                                   std::numeric_limits<int32_t>::max())));
    return ids;
}

// The API's four shapes: a string, an array of strings, an array of token ids, an array of
// arrays of token ids; the arrays of several are several prompts (one choice each).
void parse_prompt(const json& body, CompletionRequest& r) {
    const json* p = field(body, "prompt");
    if (!p) bad("prompt", "is required");
    if (p->is_string()) {
        r.prompts.push_back({p->get<std::string>(), std::nullopt});
        return;
    }
    constexpr const char* kShapes =
        "must be a string, an array of strings, an array of token ids or an array of arrays of "
        "token ids";
    if (!p->is_array() || p->empty()) bad("prompt", kShapes);
    if ((*p)[0].is_number()) {  // one prompt's ids
        r.prompts.push_back({{}, token_ids(*p, "prompt", true)});
        return;
    }
    if (p->size() > static_cast<size_t>(kMaxPrompts))
        bad("prompt", "holds " + std::to_string(p->size()) + " prompts; at most " +
                          std::to_string(kMaxPrompts) + " in one request");
    const bool text = (*p)[0].is_string();
    if (!text && !(*p)[0].is_array()) bad("prompt", kShapes);
    for (size_t i = 0; i < p->size(); ++i) {
        const std::string param = "prompt[" + std::to_string(i) + "]";
        if (text) {
            if (!(*p)[i].is_string())
                bad(param,
                    "must be a string (as the prompts before it), found " + describe_json((*p)[i]));
            r.prompts.push_back({(*p)[i].get<std::string>(), std::nullopt});
        } else {
            r.prompts.push_back({{}, token_ids((*p)[i], param, true)});
        }
    }
}

void parse_messages(const json& body, CompletionRequest& r) {
    const json* m = field(body, "messages");
    if (!m) bad("messages", "is required");
    if (!m->is_array() || m->empty()) bad("messages", "must be a non-empty array");
    for (size_t i = 0; i < m->size(); ++i) {
        const std::string p = "messages[" + std::to_string(i) + "]";
        const json& msg = (*m)[i];
        if (!msg.is_object()) bad(p, "must be an object");
        const json* role = field(msg, "role");
        if (!role) bad(p + ".role", "is required");
        std::string name = string(*role, p + ".role");
        if (name == "developer") name = "system";  // the API's newer name for it
        if (name != "system" && name != "user" && name != "assistant")
            bad(p + ".role", "must be system, developer, user or assistant, found \"" +
                                 quoted_excerpt(name) + "\"");
        const json* content = field(msg, "content");
        r.messages.push_back({name, content ? message_content(*content, p + ".content") : ""});
    }
}

// Other servers' sampling and decoding extensions (vLLM's, llama.cpp's server's) that clients of
// those servers send: their neutral values are accepted, any other is refused rather than
// silently ignored (the text would not be what the client asked for).
void refuse_extensions(const json& body) {
    struct Neutral {
        const char* name;
        double value;
    };
    static constexpr Neutral kNumbers[] = {{"typical_p", 1.0},
                                           {"tfs_z", 1.0},
                                           {"mirostat", 0.0},
                                           {"mirostat_mode", 0.0},
                                           {"length_penalty", 1.0}};
    for (const Neutral& n : kNumbers)
        if (const json* v = field(body, n.name); v && number(*v, n.name) != n.value)
            bad(n.name, std::string("is not supported (only ") + (n.value == 0.0 ? "0" : "1") +
                            "); presence_penalty, frequency_penalty, repetition_penalty, top_k, "
                            "top_p and min_p are");
    if (const json* b = field(body, "use_beam_search"); b && boolean(*b, "use_beam_search"))
        bad("use_beam_search", "is not supported");
    for (const char* name : {"guided_grammar", "grammar"})
        if (field(body, name))
            bad(name,
                "is not supported: constrained generation takes JSON schemas (response_format, "
                "guided_json, json_schema), regular expressions (guided_regex) and choices "
                "(guided_choice)");
}

// Fields of the API whose non-default values this server cannot honour: refused, not ignored.
void refuse_unsupported(const json& body) {
    if (const json* n = field(body, "n"); n && integer(*n, "n", 1, 1 << 20) != 1)
        bad("n", "must be 1: one choice per request is supported");
    if (const json* b = field(body, "best_of"); b && integer(*b, "best_of", 1, 1 << 20) != 1)
        bad("best_of", "must be 1");
    if (const json* t = field(body, "tools"); t && !(t->is_array() && t->empty()))
        bad("tools", "are not supported");
    if (const json* f = field(body, "functions"); f && !(f->is_array() && f->empty()))
        bad("functions", "are not supported");
    for (const char* name : {"tool_choice", "function_call"})
        if (const json* c = field(body, name);
            c && !(c->is_string() && (*c == "none" || *c == "auto")))
            bad(name, "must be \"none\" or \"auto\": no tools are supported");
    if (const json* x = field(body, "suffix"); x && string(*x, "suffix") != "")
        bad("suffix", "is not supported");
    refuse_extensions(body);
}

// The tokens' log-probabilities: /v1/completions' logprobs (how many alternatives, 0 to
// kMaxLogprobs: the chosen token's alone), /v1/chat/completions' logprobs (true or false) with
// top_logprobs (the alternatives, only with logprobs true, as the API's reference requires).
void parse_logprobs(const json& body, CompletionRequest& r) {
    const json* l = field(body, "logprobs");
    const json* t = field(body, "top_logprobs");
    if (!r.chat) {
        if (t && integer(*t, "top_logprobs", 0, kMaxLogprobs) != 0)
            bad("top_logprobs", "is chat's field; completions take logprobs: N");
        if (l) r.logprobs = static_cast<uint32_t>(integer(*l, "logprobs", 0, kMaxLogprobs));
        return;
    }
    const bool on = l && boolean(*l, "logprobs");
    const auto top = t ? static_cast<uint32_t>(integer(*t, "top_logprobs", 0, kMaxLogprobs)) : 0u;
    if (top > 0 && !on) bad("top_logprobs", "needs logprobs set to true");
    if (on) r.logprobs = top;
}

// The repetition penalty (runtime/sampling.hpp) by either server's names: vLLM's
// repetition_penalty over the whole context (prompt and output), or llama.cpp's server's
// repeat_penalty over the last repeat_last_n tokens (its default 64; -1: all, 0: none).
void parse_repetition_penalty(const json& body, CompletionRequest& r) {
    const auto penalty = [&](const char* name) -> std::optional<float> {
        const json* v = field(body, name);
        if (!v) return std::nullopt;
        const double x = number(*v, name);
        if (!(x >= kMinRepetitionPenalty && x <= kMaxRepetitionPenalty))
            bad(name, "must be in [0.01, 100]");
        return static_cast<float>(x);
    };
    const std::optional<float> vllm = penalty("repetition_penalty");
    const std::optional<float> llama = penalty("repeat_penalty");
    int64_t last_n = 64;
    if (const json* n = field(body, "repeat_last_n"))
        last_n = integer(*n, "repeat_last_n", -1, std::numeric_limits<int32_t>::max());
    if (vllm && llama && *vllm != 1.0f && *llama != 1.0f)
        bad("repeat_penalty", "give repetition_penalty or repeat_penalty, not both");
    if (vllm && *vllm != 1.0f) {
        r.repetition_penalty = *vllm;
        r.repetition_last_n = 0;
    } else if (llama && *llama != 1.0f && last_n != 0) {
        r.repetition_penalty = *llama;
        r.repetition_last_n = last_n < 0 ? 0 : static_cast<uint64_t>(last_n);
    }
}

// The document a response must be (runtime/json_grammar.hpp), by any of three names: the API's
// Constrained generation, one way per request: a JSON schema (response_format's json_object or
// json_schema, vLLM's guided_json, llama.cpp's server's json_schema), a regular expression
// (vLLM's guided_regex) or a choice of texts (guided_choice), or the same three in vLLM's newer
// structured_outputs object (json, regex, choice; json_object true). A schema is read again from
// the body's text with its keys in order (the properties' order is the output's).
void parse_grammar(const json& body, std::string_view text, CompletionRequest& r) {
    std::string given;  // the parameter that set r.grammar
    const auto set = [&](const std::string& param, const auto& make) {
        if (!given.empty())
            bad(param, "cannot be given with '" + given + "': give one of the constraints");
        given = param;
        try {
            r.grammar = std::make_shared<const TextGrammar>(make());
        } catch (const Error& e) {
            throw ApiError(400, e.what(), param);
        }
    };
    // A schema at body[a][b] (b empty: body[a]), or its text there (vLLM takes either).
    const auto schema = [&](const json& v, const std::string& param, const char* a,
                            const char* b = nullptr) {
        set(param, [&] {
            const nlohmann::ordered_json s = v.is_string()
                                                 ? parse_ordered_json(v.get<std::string>(), param)
                                             : b ? parse_ordered_json(text, "request body")[a][b]
                                                 : parse_ordered_json(text, "request body")[a];
            return JsonGrammar::from_schema(s, param);
        });
    };
    const auto regex = [&](const json& v, const std::string& param) {
        if (!v.is_string()) bad(param, "must be a string (a regular expression)");
        set(param, [&] { return RegexDfa::compile(v.get<std::string>(), param); });
    };
    const auto choice = [&](const json& v, const std::string& param) {
        if (!v.is_array()) bad(param, "must be an array of strings");
        std::vector<std::string> texts;
        for (size_t i = 0; i < v.size(); ++i) {
            if (!v[i].is_string())
                bad(param + "[" + std::to_string(i) + "]",
                    "must be a string, found " + describe_json(v[i]));
            texts.push_back(v[i].get<std::string>());
        }
        set(param, [&] { return RegexDfa::choice(texts, param); });
    };
    const auto any_object = [] { return JsonGrammar::any_object(); };

    if (const json* format = field(body, "response_format")) {
        const json* type = format->is_object() ? field(*format, "type") : nullptr;
        if (!type || !type->is_string()) bad("response_format", "must be an object with a type");
        if (*type == "json_object") {
            set("response_format", any_object);
        } else if (*type == "json_schema") {
            const json* js = field(*format, "json_schema");
            if (!js || !js->is_object() || !field(*js, "schema"))
                bad("response_format", "json_schema needs json_schema.schema");
            set("response_format.json_schema.schema", [&] {
                return JsonGrammar::from_schema(
                    parse_ordered_json(text,
                                       "request body")["response_format"]["json_schema"]["schema"],
                    "response_format.json_schema.schema");
            });
        } else if (*type != "text") {
            bad("response_format",
                "type " + type->dump() + " is not supported (text, json_object, json_schema)");
        }
    }
    if (const json* v = field(body, "guided_json")) schema(*v, "guided_json", "guided_json");
    if (const json* v = field(body, "json_schema")) schema(*v, "json_schema", "json_schema");
    if (const json* v = field(body, "guided_regex")) regex(*v, "guided_regex");
    if (const json* v = field(body, "guided_choice")) choice(*v, "guided_choice");
    if (const json* so = field(body, "structured_outputs")) {
        if (!so->is_object()) bad("structured_outputs", "must be an object");
        for (const auto& [key, v] : so->items()) {
            const std::string param = "structured_outputs." + key;
            if (v.is_null()) continue;
            if (key == "json")
                schema(v, param, "structured_outputs", "json");
            else if (key == "regex")
                regex(v, param);
            else if (key == "choice")
                choice(v, param);
            else if (key == "json_object") {
                if (!v.is_boolean()) bad(param, "must be true or false");
                if (v.get<bool>()) set(param, any_object);
            } else
                bad(param,
                    "is not supported (json, regex, choice and json_object are; grammars and "
                    "structural tags are not)");
        }
    }
    if (r.grammar && r.ignore_eos)
        bad("ignore_eos",
            "cannot be true with constrained generation: its text ends with a stop token");
}

// logit_bias: {"token id": bias in [-100, 100], ...}, ids as decimal strings (the API's form);
// whether an id is in the vocabulary is the caller's check.
std::vector<std::pair<int32_t, float>> logit_bias(const json& v) {
    if (!v.is_object()) bad("logit_bias", "must be an object of token ids to numbers");
    if (v.size() > 1024) bad("logit_bias", "holds at most 1024 tokens");
    std::vector<std::pair<int32_t, float>> out;
    for (const auto& [key, value] : v.items()) {
        const std::string param = "logit_bias[" + quoted_excerpt(key) + "]";
        const bool digits = !key.empty() && key.size() <= 10 &&
                            key.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || std::stoull(key) > static_cast<uint64_t>(INT32_MAX))
            bad(param, "must name a token id (a non-negative integer)");
        const double b = number(value, param);
        if (!(b >= -100.0 && b <= 100.0)) bad(param, "must be in [-100, 100]");
        out.emplace_back(static_cast<int32_t>(std::stoull(key)), static_cast<float>(b));
    }
    return out;
}

}  // namespace

namespace {

// A request body: a JSON object, nested at most kMaxRequestDepth levels.
json parse_body(std::string_view text) {
    json body;
    try {
        body = parse_json(text, "request body",
                          {.what = "request body", .max_depth = kMaxRequestDepth});
    } catch (const Error& e) {
        throw ApiError(400, std::string("malformed JSON: ") + e.what());
    }
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    if (const json* m = field(body, "model")) string(*m, "model");  // any name: one model is served
    return body;
}

}  // namespace

TokenizeRequest parse_tokenize_request(std::string_view text) {
    const json body = parse_body(text);
    TokenizeRequest r;
    const json* prompt = field(body, "prompt");
    const json* content = field(body, "content");
    const json* messages = field(body, "messages");
    if ((prompt != nullptr) + (content != nullptr) + (messages != nullptr) != 1)
        throw ApiError(400, "give one of 'prompt', 'content' or 'messages'", "prompt");
    if (messages) {
        CompletionRequest chat;
        parse_messages(body, chat);
        r.messages = std::move(chat.messages);
        r.chat = true;
        if (const json* g = field(body, "add_generation_prompt"))
            r.add_generation_prompt = boolean(*g, "add_generation_prompt");
        // vLLM's chat tokenization adds no special tokens unless told (the template writes them).
        if (const json* a = field(body, "add_special_tokens"))
            r.add_special = boolean(*a, "add_special_tokens");
        // Its other chat fields change the rendering: refused, not ignored.
        if (const json* c = field(body, "continue_final_message");
            c && boolean(*c, "continue_final_message"))
            bad("continue_final_message", "is not supported");
        for (const char* name : {"chat_template", "tools", "documents"})
            if (field(body, name)) bad(name, "is not supported");
    } else {
        r.text = prompt ? string(*prompt, "prompt") : string(*content, "content");
        // vLLM's add_special_tokens (true unless told), llama.cpp's server's add_special (false
        // unless told).
        r.add_special = prompt != nullptr;
        for (const char* name : {"add_special_tokens", "add_special"})
            if (const json* a = field(body, name)) r.add_special = boolean(*a, name);
    }
    if (const json* w = field(body, "with_pieces")) r.with_pieces = boolean(*w, "with_pieces");
    return r;
}

std::vector<int32_t> parse_detokenize_request(std::string_view text) {
    const json body = parse_body(text);
    const json* t = field(body, "tokens");
    if (!t) bad("tokens", "is required");
    return token_ids(*t, "tokens", false);
}

CompletionRequest parse_completion_request(std::string_view text, bool chat,
                                           uint64_t max_tokens_limit) {
    const json body = parse_body(text);
    CompletionRequest r;
    r.chat = chat;
    if (chat)
        parse_messages(body, r);
    else
        parse_prompt(body, r);
    refuse_unsupported(body);
    if (const json* e = field(body, "echo"); e && boolean(*e, "echo")) {
        if (chat) bad("echo", "is a completions field");
        r.echo = true;
    }

    const char* max_name = "max_tokens";
    const json* max = field(body, "max_tokens");
    if (chat && !max && (max = field(body, "max_completion_tokens")))
        max_name = "max_completion_tokens";
    if (max)  // 0 with echo: the prompt alone (with logprobs, its positions' log-probabilities)
        r.max_tokens = static_cast<uint64_t>(
            integer(*max, max_name, r.echo ? 0 : 1, static_cast<int64_t>(max_tokens_limit)));
    if (const json* t = field(body, "temperature")) {
        const double v = number(*t, "temperature");
        if (!(v >= 0.0 && v <= 2.0)) bad("temperature", "must be in [0, 2]");
        r.temperature = static_cast<float>(v);
    }
    if (const json* p = field(body, "top_p")) {
        const double v = number(*p, "top_p");
        if (!(v > 0.0 && v <= 1.0)) bad("top_p", "must be in (0, 1]");
        r.top_p = static_cast<float>(v);
        if (!(r.top_p > 0.0f)) r.top_p = std::numeric_limits<float>::min();  // float underflow
    }
    for (auto [name, to] : {std::pair{"presence_penalty", &r.presence_penalty},
                            std::pair{"frequency_penalty", &r.frequency_penalty}})
        if (const json* v = field(body, name)) {
            const double x = number(*v, name);
            if (!(x >= -2.0 && x <= 2.0)) bad(name, "must be in [-2, 2]");
            *to = static_cast<float>(x);
        }
    if (const json* b = field(body, "logit_bias")) r.logit_bias = logit_bias(*b);
    parse_repetition_penalty(body, r);
    if (const json* m = field(body, "min_p")) {  // vLLM's and llama.cpp's extension
        const double v = number(*m, "min_p");
        if (!(v >= 0.0 && v <= 1.0)) bad("min_p", "must be in [0, 1]");
        r.min_p = static_cast<float>(v);
    }
    if (const json* k = field(body, "top_k"))
        r.top_k =
            static_cast<uint32_t>(integer(*k, "top_k", 0, std::numeric_limits<int32_t>::max()));
    if (const json* s = field(body, "seed"))
        r.seed = static_cast<uint64_t>(integer(*s, "seed", std::numeric_limits<int64_t>::min(),
                                               std::numeric_limits<int64_t>::max()));
    if (const json* s = field(body, "stop")) {
        if (s->is_string()) {
            r.stop.push_back(s->get<std::string>());
        } else if (s->is_array()) {
            if (s->size() > static_cast<size_t>(kMaxStops))
                bad("stop", "holds at most " + std::to_string(kMaxStops) + " strings");
            for (size_t i = 0; i < s->size(); ++i)
                r.stop.push_back(string((*s)[i], "stop[" + std::to_string(i) + "]"));
        } else {
            bad("stop", "must be a string or an array of strings");
        }
        for (const auto& x : r.stop) {
            if (x.empty()) bad("stop", "must not hold an empty string");
            if (x.size() > static_cast<size_t>(kMaxStopBytes))
                bad("stop", "holds a string of " + std::to_string(x.size()) + " bytes; at most " +
                                std::to_string(kMaxStopBytes));
        }
    }
    parse_logprobs(body, r);
    if (const json* e = field(body, "ignore_eos")) r.ignore_eos = boolean(*e, "ignore_eos");
    if (const json* t = field(body, "stop_token_ids"))
        r.stop_token_ids = token_ids(*t, "stop_token_ids", false, 64);
    parse_grammar(body, text, r);
    if (const json* s = field(body, "stream")) r.stream = boolean(*s, "stream");
    if (const json* o = field(body, "stream_options")) {
        if (!o->is_object()) bad("stream_options", "must be an object");
        if (const json* u = field(*o, "include_usage"))
            r.include_usage = boolean(*u, "stream_options.include_usage");
    }
    return r;
}

}  // namespace qforge::serve
