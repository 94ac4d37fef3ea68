// Chat templates against jinja2: tests/data/gguf/chat_templates.json holds real templates
// (SmolLM2, ChatML, Llama 2, Llama 3, Zephyr, Mistral, Qwen2.5 without tools, Gemma 3, Qwen3 with
// and without enable_thinking) rendered by jinja2
// as transformers configures it (scripts/make_gguf_fixtures.py); the Jinja subset must give the
// same text byte for byte, raise the same exceptions, and refuse the templates outside it.
#include "tokenizer/chat_template.hpp"

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "test_support.hpp"
#include "tokenizer/jinja_subset.hpp"

namespace chat_template_test {

using namespace qforge;
namespace fs = std::filesystem;

namespace {

nlohmann::json read_fixture() {
    const auto bytes = test::read_file(fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "gguf" /
                                       "chat_templates.json");
    return nlohmann::json::parse(bytes.begin(), bytes.end());
}

ChatTemplateInputs inputs(const nlohmann::json& conversation, bool add_generation_prompt) {
    ChatTemplateInputs in;
    for (const auto& m : conversation) in.messages.push_back({m.at("role"), m.at("content")});
    in.add_generation_prompt = add_generation_prompt;
    in.bos_token = "<s>";
    in.eos_token = "</s>";
    return in;
}

std::string render(const std::string& source, std::map<std::string, jinja::Value> vars = {}) {
    return jinja::render(source, vars);
}

}  // namespace

TEST_CASE("chat templates render as jinja2 does", "[chat]") {
    const auto fixture = read_fixture();
    int rendered = 0, raised = 0, rendered_new = 0;
    for (const auto& c : fixture.at("cases")) {
        const std::string name = c.at("template");
        INFO("template " << name << ", conversation " << c.at("conversation").get<std::string>()
                         << ", add_generation_prompt " << c.at("add_generation_prompt"));
        const std::string source = fixture.at("templates").at(name);
        auto in = inputs(fixture.at("conversations").at(c.at("conversation").get<std::string>()),
                         c.at("add_generation_prompt"));
        const nlohmann::json extra = c.value("variables", nlohmann::json::object());
        INFO("variables " << extra.dump());
        for (const auto& [k, v] : extra.items()) in.variables[k] = v.get<bool>();
        auto run = [&] { return render_chat_template(source, in); };
        if (c.contains("expected")) {
            CHECK(run() == c.at("expected").get<std::string>());
            ++rendered;
            if (name == "gemma3" || name == "qwen3") ++rendered_new;
        } else {
            CHECK_THROWS_WITH(run(), Catch::Contains(c.at("error").get<std::string>()));
            ++raised;
        }
    }
    CHECK(rendered >= 100);
    CHECK(rendered_new >= 38);  // Gemma 3: 4 conversations x 2 (one raises), Qwen3: 5 x 2 x 3
    CHECK(raised >= 2);
}

TEST_CASE("chat templates outside the subset are refused by name", "[chat]") {
    const auto fixture = read_fixture();
    ChatTemplateInputs in;
    in.messages = {{"user", "hi"}};
    const std::map<std::string, std::string> why = {
        {"tojson", "filter 'tojson' is not supported"},
        {"macro", "'{% macro %}' is not supported"},
        {"keyword-arguments", "keyword arguments are not supported"},
        {"string-format", "tuples are not supported"},
    };
    for (const auto& [name, source] : fixture.at("refused").items()) {
        INFO("template " << name);
        REQUIRE(why.count(name));
        CHECK_THROWS_WITH(render_chat_template(source, in),
                          Catch::StartsWith("chat template: ") && Catch::Contains(why.at(name)));
    }
}

TEST_CASE("Jinja subset: expressions, scoping and whitespace", "[chat]") {
    using jinja::Value;
    CHECK(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}") ==
          "3 -4 2 3.5 1024");
    CHECK(render("{{ none }} {{ true }} {{ 1.0 }} {{ [1, 'a'] }} {{ {'a': 1} }}") ==
          "None True 1.0 [1, 'a'] {'a': 1}");
    CHECK(render("{{ 'ab'[::-1] }}{{ [1,2,3][1:] }}{{ 'héllo'[1] }}{{ 'héllo' | length }}") ==
          "ba[2, 3]é5");
    CHECK(render("{{ 'a' if x is defined else 'b' }}{{ x | default('d') }}{{ y }}") == "bd");
    CHECK(render("{{ 'x' ~ 1 ~ none }}{{ 'a' + 'b' | upper }}{{ ('a' + 'b') | upper }}") ==
          "x1NoneaBAB");
    CHECK(render("{{ 'a' in 'cat' }}{{ 2 not in [1, 2] }}{{ 'k' in {'k': 1} }}") ==
          "TrueFalseTrue");
    CHECK(render("{{ '  a b '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'Hi'.startswith('H') }}") ==
          "a b|['a', 'b']|True");
    CHECK(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}") ==
          "a=1;b=2;");
    CHECK(render("{% for x in [] %}x{% else %}empty{% endfor %}") == "empty");
    CHECK(render("{% for x in 'ab' %}{{ loop.index }}{{ x }}{{ loop.revindex0 }}{% endfor %}") ==
          "1a12b0");
    // Each iteration starts from the enclosing scope; a loop's `set` does not leak out of it.
    CHECK(render("{% set x = 5 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ "
                 "x }}") == "51525");
    CHECK(render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}") == "3");
    // trim_blocks, lstrip_blocks, '-' and '+'.
    CHECK(render("a\n  {% if true %}\n  x\n  {% endif %}\nb {% if true %}y{% endif %}\n") ==
          "a\n  x\nb y");
    CHECK(render("a  {%- if true -%}  b  {%- endif %}") == "ab");
    CHECK(render("  {%+ if true %}x{% endif %}") == "  x");
    CHECK(render("{{ 1 }}  {# c #}\nz") == "1  z");
    CHECK(render("{{ '}}' }}{{ \"\\u00e9\\n\" }}") == "}}é\n");
    CHECK(render("{{ range(3) | join(',') }}") == "0,1,2");
    CHECK(render("{{ messages[0].content }}",
                 {{"messages", Value::List{Value::Dict{{"content", "hi"}}}}}) == "hi");
    CHECK_THROWS_WITH(render("{{ raise_exception('no') }}"),
                      Catch::Contains("raised an exception: no"));
    CHECK_THROWS_WITH(render("{% if x %}"), Catch::Contains("missing '{% endif %}'"));
    CHECK_THROWS_WITH(render("{{ x.y }}"), Catch::Contains("undefined value"));
    CHECK_THROWS_WITH(render("{{ 'a' "), Catch::Contains("unclosed"));
}

TEST_CASE("Jinja subset: namespace objects are shared by every scope", "[chat]") {
    // jinja2: a namespace is one object; a loop's scope sees and changes the enclosing one.
    CHECK(
        render("{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i "
               "%}{% set ns.c = i %}{% endfor %}{{ ns.a }} {{ ns.b }} {{ ns.c }} {{ ns }}") ==
        "4 x 2 <Namespace {'a': 4, 'b': 'x', 'c': 2}>");
    CHECK(render("{% set ns = namespace({'k': 2}, k=3) %}{% set m = ns %}{% set m.k = 5 %}{{ ns.k "
                 "}} {{ ns == m }} {{ ns is mapping }}") == "5 True False");
    CHECK_THROWS_WITH(render("{% set d = {} %}{% set d.x = 1 %}"),
                      Catch::Contains("cannot assign attribute on non-namespace object"));
    CHECK_THROWS_WITH(render("{% set ns = namespace() %}{% set ns.self = [ns] %}"),
                      Catch::Contains("a namespace inside a namespace is not supported"));
    CHECK_THROWS_WITH(render("{{ range(stop=3) }}"),
                      Catch::Contains("keyword arguments are not supported"));
    CHECK_THROWS_WITH(render("{{ namespace(a=1, 2) }}"),
                      Catch::Contains("positional argument follows keyword argument"));
}

}  // namespace chat_template_test
