// Chat prompts rendered with a model's own chat template (tokenizer_config.json's or a GGUF's
// tokenizer.chat_template), as transformers' apply_chat_template renders them: the template is
// run by the Jinja subset interpreter (tokenizer/jinja_subset.hpp) with `messages`,
// `add_generation_prompt`, `bos_token` and `eos_token`. A template outside the subset is an
// Error naming the construct; `qforge generate` then falls back to the raw prompt with a warning.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tokenizer/jinja_subset.hpp"
#include "tokenizer/tokenizer.hpp"

namespace qforge {

struct ChatMessage {
    std::string role;  // "system", "user", "assistant"
    std::string content;
};

struct ChatTemplateInputs {
    std::vector<ChatMessage> messages;
    bool add_generation_prompt = true;  // end with the header of the assistant's turn
    std::string bos_token, eos_token;   // the tokens' text ("" when the tokenizer has none)
    // More top-level variables a template may read (Qwen3's enable_thinking).
    std::map<std::string, jinja::Value> variables;
};

// Renders `chat_template`; throws Error ("chat template: ...") when it cannot.
std::string render_chat_template(const std::string& chat_template, const ChatTemplateInputs& in);

// The text of one user turn (after an optional system message), rendered with the tokenizer's
// template (or `chat_template` when not empty: a model whose files carry none, such as the
// pretrained Gemma 3 GGUFs) and its BOS/EOS text, ready for a reply: what `qforge generate`
// encodes (without adding special tokens: the template writes them). Throws Error when there
// is no template or it cannot be rendered.
std::string render_chat_prompt(const Tokenizer& tokenizer, const std::string& system,
                               const std::string& user, const std::string& chat_template = {});

// Where generation stops for a prompt rendered with `chat_template` (not the tokenizer's own):
// the tokenizer's stop ids and the end-of-turn markers (tokenizer/source.hpp, kChatTurnEnds)
// that template writes and the vocabulary holds as one token, as the sources add them for the
// template a model file carries.
std::vector<int32_t> chat_stop_ids(const Tokenizer& tokenizer, const std::string& chat_template);

}  // namespace qforge
