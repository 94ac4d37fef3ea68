#include "tokenizer/chat_template.hpp"

#include <algorithm>
#include <map>

#include "core/error.hpp"
#include "tokenizer/jinja_subset.hpp"
#include "tokenizer/source.hpp"

namespace qforge {

std::string render_chat_template(const std::string& chat_template, const ChatTemplateInputs& in) {
    jinja::Value::List messages;
    for (const ChatMessage& m : in.messages)
        messages.emplace_back(jinja::Value::Dict{{"role", m.role}, {"content", m.content}});
    std::map<std::string, jinja::Value> variables = in.variables;
    variables["messages"] = std::move(messages);
    variables["add_generation_prompt"] = in.add_generation_prompt;
    variables["bos_token"] = in.bos_token;
    variables["eos_token"] = in.eos_token;
    return jinja::render(chat_template, variables);
}

std::string render_chat_prompt(const Tokenizer& tokenizer, const std::string& system,
                               const std::string& user, const std::string& chat_template) {
    const std::string& source = chat_template.empty() ? tokenizer.chat_template() : chat_template;
    if (source.empty()) throw Error("the tokenizer has no chat template");
    ChatTemplateInputs in;
    if (!system.empty()) in.messages.push_back({"system", system});
    in.messages.push_back({"user", user});
    if (tokenizer.bos_id()) in.bos_token = std::string(tokenizer.piece(*tokenizer.bos_id()));
    if (tokenizer.eos_id()) in.eos_token = std::string(tokenizer.piece(*tokenizer.eos_id()));
    // The tokenizer's template is part of its file: a broken one is that file's error.
    if (!chat_template.empty()) return render_chat_template(source, in);
    try {
        return render_chat_template(source, in);
    } catch (const Error& e) {
        if (!e.file().empty()) throw;
        throw e.with_file(tokenizer.source());
    }
}

std::vector<int32_t> chat_stop_ids(const Tokenizer& tokenizer, const std::string& chat_template) {
    std::vector<int32_t> stops = tokenizer.stop_ids();
    for (const char* turn_end : kChatTurnEnds) {
        if (chat_template.find(turn_end) == std::string::npos) continue;
        const std::vector<int32_t> ids = tokenizer.encode(turn_end, false);
        if (ids.size() == 1 && tokenizer.piece(ids[0]) == turn_end &&
            std::find(stops.begin(), stops.end(), ids[0]) == stops.end())
            stops.push_back(ids[0]);
    }
    return stops;
}

}  // namespace qforge
