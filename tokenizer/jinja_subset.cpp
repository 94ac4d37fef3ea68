// The Jinja2 subset of jinja_subset.hpp: segments and tokens (jinja_lexer.hpp) -> a tree of
// statements and expressions -> rendered text, with Python's value semantics (jinja_values.hpp).
#include "tokenizer/jinja_subset.hpp"

#include <algorithm>
#include <memory>
#include <optional>

#include "core/error.hpp"
#include "tokenizer/jinja_lexer.hpp"
#include "tokenizer/jinja_values.hpp"

namespace qforge::jinja {

namespace {

using namespace detail;

// ---------------------------------------------------------------------------------------------
// Evaluation context

struct Context {
    std::vector<std::map<std::string, Value>> scopes;

    Value lookup(const std::string& name) const {
        for (auto it = scopes.rbegin(); it != scopes.rend(); ++it)
            if (auto f = it->find(name); f != it->end()) return f->second;
        return {};
    }
    void set(const std::string& name, Value v) { scopes.back()[name] = std::move(v); }
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
    virtual ~Expr() = default;
    virtual Value eval(Context& ctx) const = 0;
    // The tallest child's height; evaluation and destruction recurse once per level, so the
    // parser bounds height (see ExprParser::seal).
    virtual int child_height() const { return 0; }
    int height = 1;
};

int height_of(const ExprPtr& e) { return e ? e->height : 0; }
int height_of(const std::vector<ExprPtr>& v) {
    int h = 0;
    for (const auto& e : v) h = std::max(h, height_of(e));
    return h;
}
template <class... T>
int height_of(const T&... parts) {
    return std::max({height_of(parts)...});
}

struct Literal : Expr {
    Value v;
    explicit Literal(Value x) : v(std::move(x)) {}
    Value eval(Context&) const override { return v; }
};

struct ListExpr : Expr {
    std::vector<ExprPtr> items;
    int child_height() const override { return height_of(items); }
    Value eval(Context& ctx) const override {
        Value::List l;
        for (const auto& e : items) l.push_back(e->eval(ctx));
        return l;
    }
};

struct DictExpr : Expr {
    std::vector<std::pair<ExprPtr, ExprPtr>> items;
    int child_height() const override {
        int h = 0;
        for (const auto& [k, v] : items) h = std::max(h, height_of(k, v));
        return h;
    }
    Value eval(Context& ctx) const override {
        Value::Dict d;
        for (const auto& [k, v] : items) {
            const Value key = k->eval(ctx);
            if (key.kind() != Value::Kind::string) fail("dict keys must be strings");
            d.emplace_back(key.string(), v->eval(ctx));
        }
        return d;
    }
};

struct NameExpr : Expr {
    std::string name;
    explicit NameExpr(std::string n) : name(std::move(n)) {}
    Value eval(Context& ctx) const override { return ctx.lookup(name); }
};

struct AttrExpr : Expr {
    ExprPtr obj;
    std::string name;
    int child_height() const override { return height_of(obj); }
    Value eval(Context& ctx) const override { return get_item(obj->eval(ctx), Value(name)); }
};

struct ItemExpr : Expr {
    ExprPtr obj, key;
    int child_height() const override { return height_of(obj, key); }
    Value eval(Context& ctx) const override { return get_item(obj->eval(ctx), key->eval(ctx)); }
};

struct SliceExpr : Expr {
    ExprPtr obj, start, stop, step;  // each may be null
    int child_height() const override { return height_of(obj, start, stop, step); }
    Value eval(Context& ctx) const override {
        const Value o = obj->eval(ctx);
        if (o.kind() != Value::Kind::list && o.kind() != Value::Kind::string)
            fail(std::string("cannot slice a ") + kind_name(o));
        const Value::List items = items_of(o);
        const auto n = static_cast<int64_t>(items.size());
        // A bound: nullopt when omitted or none.
        auto bound = [&](const ExprPtr& e) -> std::optional<int64_t> {
            if (!e) return std::nullopt;
            const Value v = e->eval(ctx);
            if (v.kind() == Value::Kind::none) return std::nullopt;
            if (!is_int_like(v)) fail("slice bounds must be integers");
            return as_int(v);
        };
        const int64_t st = bound(step).value_or(1);
        if (st == 0) fail("slice step cannot be zero");
        // Python's slice.indices().
        const int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? n : n - 1;
        auto resolve = [&](std::optional<int64_t> v, int64_t fallback) {
            if (!v) return fallback;
            return *v < 0 ? std::max(*v + n, lower) : std::min(*v, upper);
        };
        const int64_t a = resolve(bound(start), st > 0 ? lower : upper);
        const int64_t b = resolve(bound(stop), st > 0 ? upper : lower);
        Value::List out;
        for (int64_t i = a; st > 0 ? i < b : i > b; i += st)
            out.push_back(items[static_cast<size_t>(i)]);
        if (o.kind() == Value::Kind::list) return out;
        std::string text;
        for (const Value& c : out) text += c.string();
        return text;
    }
};

using KeywordArgs = std::vector<std::pair<std::string, ExprPtr>>;

struct CallExpr : Expr {
    ExprPtr callee;  // a NameExpr (function) or an AttrExpr (method)
    std::vector<ExprPtr> args;
    KeywordArgs kwargs;  // namespace() only
    int child_height() const override {
        int h = std::max(height_of(callee), height_of(args));
        for (const auto& [k, e] : kwargs) h = std::max(h, height_of(e));
        return h;
    }
    Value eval(Context& ctx) const override {
        Args values;
        for (const auto& a : args) values.push_back(a->eval(ctx));
        const auto* n = dynamic_cast<const NameExpr*>(callee.get());
        if (n && n->name == "namespace") {
            // jinja2: namespace(mapping?, **attributes), the keywords after the mapping's keys.
            if (values.size() > 1 || (values.size() == 1 && values[0].kind() != Value::Kind::dict))
                fail("namespace() takes at most one dict and keyword arguments");
            Value::Dict attributes = values.empty() ? Value::Dict{} : values[0].dict();
            for (const auto& kw : kwargs) {
                // Named, not a structured binding: clang 14 cannot capture those in a lambda.
                const auto& k = kw.first;
                Value v = kw.second->eval(ctx);
                auto same = [&](const auto& kv) { return kv.first == k; };
                if (auto it = std::find_if(attributes.begin(), attributes.end(), same);
                    it != attributes.end())
                    it->second = std::move(v);
                else
                    attributes.emplace_back(k, std::move(v));
            }
            return Value::make_namespace(std::move(attributes));
        }
        if (!kwargs.empty()) fail("keyword arguments are not supported");
        if (n) return call_function(n->name, values);
        if (const auto* m = dynamic_cast<const AttrExpr*>(callee.get()))
            return call_method(m->obj->eval(ctx), m->name, values);
        fail("only functions and methods can be called");
    }
};

struct FilterExpr : Expr {
    ExprPtr obj;
    std::string name;
    std::vector<ExprPtr> args;
    int child_height() const override { return std::max(height_of(obj), height_of(args)); }
    Value eval(Context& ctx) const override {
        Args values;
        for (const auto& a : args) values.push_back(a->eval(ctx));
        return apply_filter(name, obj->eval(ctx), values);
    }
};

struct TestExpr : Expr {
    ExprPtr obj;
    std::string name;
    std::vector<ExprPtr> args;
    bool negate = false;
    int child_height() const override { return std::max(height_of(obj), height_of(args)); }
    Value eval(Context& ctx) const override {
        Args values;
        for (const auto& a : args) values.push_back(a->eval(ctx));
        return apply_test(name, obj->eval(ctx), values) != negate;
    }
};

struct NotExpr : Expr {
    ExprPtr e;
    int child_height() const override { return height_of(e); }
    Value eval(Context& ctx) const override { return !truthy(e->eval(ctx)); }
};

struct NegExpr : Expr {
    ExprPtr e;
    int child_height() const override { return height_of(e); }
    Value eval(Context& ctx) const override {
        const Value v = e->eval(ctx);
        if (is_int_like(v)) return -as_int(v);
        if (v.kind() == Value::Kind::floating) return -v.floating();
        fail(std::string("cannot negate a ") + kind_name(v));
    }
};

struct AndOrExpr : Expr {
    ExprPtr l, r;
    bool is_and;
    int child_height() const override { return height_of(l, r); }
    Value eval(Context& ctx) const override {
        Value a = l->eval(ctx);
        if (truthy(a) != is_and) return a;  // Python: `and`/`or` return an operand
        return r->eval(ctx);
    }
};

struct CondExpr : Expr {
    ExprPtr value, cond, otherwise;  // otherwise may be null: undefined
    int child_height() const override { return height_of(value, cond, otherwise); }
    Value eval(Context& ctx) const override {
        if (truthy(cond->eval(ctx))) return value->eval(ctx);
        return otherwise ? otherwise->eval(ctx) : Value();
    }
};

struct BinaryExpr : Expr {
    std::string op;
    ExprPtr l, r;
    bool comparison;
    int child_height() const override { return height_of(l, r); }
    Value eval(Context& ctx) const override {
        const Value a = l->eval(ctx), b = r->eval(ctx);
        return comparison ? Value(compare(op, a, b)) : arithmetic(op, a, b);
    }
};

// ---------------------------------------------------------------------------------------------
// Expression parser (jinja2's precedence: conditional < or < and < not < comparison < + - <
// ~ < * / // % < ** < unary minus < postfix, filters and tests)

class ExprParser {
  public:
    explicit ExprParser(std::string_view text) : tokens_(tokenize(text)) {}

    ExprPtr expression() { return conditional(); }
    // Finishes a node: its height is bounded here, so no tree is built that evaluating or
    // destroying could not walk.
    ExprPtr seal(ExprPtr n) const {
        n->height = n->child_height() + 1;
        if (n->height > kMaxTemplateDepth) fail_too_deep();
        return n;
    }
    const Token& peek(size_t ahead = 0) const {
        return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
    }
    bool at_end() const { return peek().kind == Token::Kind::end; }
    bool is_name(std::string_view n, size_t ahead = 0) const {
        return peek(ahead).kind == Token::Kind::name && peek(ahead).text == n;
    }
    bool is_op(std::string_view o) const {
        return peek().kind == Token::Kind::op && peek().text == o;
    }
    Token next() { return tokens_[std::min(pos_++, tokens_.size() - 1)]; }
    void expect_op(std::string_view o) {
        if (!is_op(o)) fail("expected '" + std::string(o) + "' but found '" + peek().text + "'");
        ++pos_;
    }
    std::string expect_name() {
        if (peek().kind != Token::Kind::name)
            fail("expected a name but found '" + peek().text + "'");
        return next().text;
    }
    void expect_end() {
        if (!at_end()) fail("unexpected '" + peek().text + "'");
    }

  private:
    // Counts the parser's own recursion (parentheses, brackets, chains of `not`, unary minus
    // and `else ... if`), which can be deep without making the tree tall.
    struct DepthGuard {
        int& depth;
        explicit DepthGuard(int& d) : depth(d) {
            if (++depth > kMaxTemplateDepth) fail_too_deep();
        }
        ~DepthGuard() { --depth; }
        DepthGuard(const DepthGuard&) = delete;
        DepthGuard& operator=(const DepthGuard&) = delete;
    };

    ExprPtr conditional() {
        const DepthGuard guard(depth_);
        ExprPtr e = or_expr();
        while (is_name("if")) {
            ++pos_;
            auto c = std::make_unique<CondExpr>();
            c->value = std::move(e);
            c->cond = or_expr();
            if (is_name("else")) {
                ++pos_;
                c->otherwise = conditional();
            }
            e = seal(std::move(c));
        }
        return e;
    }
    ExprPtr or_expr() {
        ExprPtr e = and_expr();
        while (is_name("or")) {
            ++pos_;
            auto n = std::make_unique<AndOrExpr>();
            n->l = std::move(e);
            n->r = and_expr();
            n->is_and = false;
            e = seal(std::move(n));
        }
        return e;
    }
    ExprPtr and_expr() {
        ExprPtr e = not_expr();
        while (is_name("and")) {
            ++pos_;
            auto n = std::make_unique<AndOrExpr>();
            n->l = std::move(e);
            n->r = not_expr();
            n->is_and = true;
            e = seal(std::move(n));
        }
        return e;
    }
    ExprPtr not_expr() {
        if (is_name("not")) {
            const DepthGuard guard(depth_);
            ++pos_;
            auto n = std::make_unique<NotExpr>();
            n->e = not_expr();
            return seal(std::move(n));
        }
        return comparison();
    }
    ExprPtr comparison() {
        ExprPtr e = math1();
        for (;;) {
            std::string op;
            if (peek().kind == Token::Kind::op && (is_op("==") || is_op("!=") || is_op("<") ||
                                                   is_op(">") || is_op("<=") || is_op(">=")))
                op = next().text;
            else if (is_name("in"))
                op = next().text;
            else if (is_name("not") && is_name("in", 1)) {
                pos_ += 2;
                op = "not in";
            } else {
                return e;
            }
            e = binary(op, std::move(e), math1(), true);
        }
    }
    ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, bool comparison) const {
        auto n = std::make_unique<BinaryExpr>();
        n->op = std::move(op);
        n->l = std::move(l);
        n->r = std::move(r);
        n->comparison = comparison;
        return seal(std::move(n));
    }
    ExprPtr math1() {
        ExprPtr e = concat();
        while (is_op("+") || is_op("-")) {
            std::string op = next().text;
            e = binary(op, std::move(e), concat(), false);
        }
        return e;
    }
    ExprPtr concat() {
        ExprPtr e = math2();
        while (is_op("~")) {
            ++pos_;
            e = binary("~", std::move(e), math2(), false);
        }
        return e;
    }
    ExprPtr math2() {
        ExprPtr e = power();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            std::string op = next().text;
            e = binary(op, std::move(e), power(), false);
        }
        return e;
    }
    ExprPtr power() {
        ExprPtr e = unary();
        while (is_op("**")) {
            ++pos_;
            e = binary("**", std::move(e), unary(), false);
        }
        return e;
    }
    ExprPtr unary() {
        if (is_op("-")) {
            const DepthGuard guard(depth_);
            ++pos_;
            auto n = std::make_unique<NegExpr>();
            n->e = unary();
            return filters(seal(std::move(n)));
        }
        if (is_op("+")) {
            const DepthGuard guard(depth_);
            ++pos_;
            return unary();
        }
        return filters(postfix(primary()));
    }
    // `kwargs` null: keyword arguments are refused here.
    std::vector<ExprPtr> call_args(KeywordArgs* kwargs = nullptr) {
        std::vector<ExprPtr> args;
        expect_op("(");
        while (!is_op(")")) {
            if (peek().kind == Token::Kind::name && peek(1).kind == Token::Kind::op &&
                peek(1).text == "=") {
                if (!kwargs) fail("keyword arguments are not supported");
                std::string name = next().text;
                ++pos_;
                kwargs->emplace_back(std::move(name), expression());
                if (!is_op(")")) expect_op(",");
                continue;
            }
            if (kwargs && !kwargs->empty()) fail("positional argument follows keyword argument");
            args.push_back(expression());
            if (!is_op(")")) expect_op(",");
        }
        expect_op(")");
        return args;
    }
    ExprPtr filters(ExprPtr e) {
        for (;;) {
            if (is_op("|")) {
                ++pos_;
                auto f = std::make_unique<FilterExpr>();
                f->obj = std::move(e);
                f->name = expect_name();
                if (is_op("(")) f->args = call_args();
                e = seal(std::move(f));
            } else if (is_name("is")) {
                ++pos_;
                auto t = std::make_unique<TestExpr>();
                t->obj = std::move(e);
                if (is_name("not")) {
                    ++pos_;
                    t->negate = true;
                }
                t->name = next().text;  // tests may be keywords: none, true, false
                if (is_op("(")) t->args = call_args();
                e = seal(std::move(t));
            } else {
                return e;
            }
        }
    }
    ExprPtr postfix(ExprPtr e) {
        for (;;) {
            if (is_op(".")) {
                ++pos_;
                auto a = std::make_unique<AttrExpr>();
                a->obj = std::move(e);
                if (peek().kind == Token::Kind::integer) {  // x.0 is x[0] in jinja2
                    auto it = std::make_unique<ItemExpr>();
                    it->obj = std::move(a->obj);
                    it->key = std::make_unique<Literal>(Value(next().i));
                    e = seal(std::move(it));
                    continue;
                }
                a->name = expect_name();
                e = seal(std::move(a));
            } else if (is_op("[")) {
                ++pos_;
                ExprPtr first = is_op(":") ? nullptr : expression();
                if (is_op(":")) {
                    auto s = std::make_unique<SliceExpr>();
                    s->obj = std::move(e);
                    s->start = std::move(first);
                    ++pos_;
                    if (!is_op("]") && !is_op(":")) s->stop = expression();
                    if (is_op(":")) {
                        ++pos_;
                        if (!is_op("]")) s->step = expression();
                    }
                    e = seal(std::move(s));
                } else {
                    auto it = std::make_unique<ItemExpr>();
                    it->obj = std::move(e);
                    it->key = std::move(first);
                    e = seal(std::move(it));
                }
                expect_op("]");
            } else if (is_op("(")) {
                auto c = std::make_unique<CallExpr>();
                c->callee = std::move(e);
                c->args = call_args(&c->kwargs);
                e = seal(std::move(c));
            } else {
                return e;
            }
        }
    }
    ExprPtr primary() {
        const Token t = next();
        switch (t.kind) {
            case Token::Kind::string: {
                std::string s = t.text;
                while (peek().kind == Token::Kind::string) s += next().text;  // "a" "b" is "ab"
                return std::make_unique<Literal>(Value(s));
            }
            case Token::Kind::integer:
                return std::make_unique<Literal>(Value(t.i));
            case Token::Kind::floating:
                return std::make_unique<Literal>(Value(t.f));
            case Token::Kind::name:
                if (t.text == "true" || t.text == "True")
                    return std::make_unique<Literal>(Value(true));
                if (t.text == "false" || t.text == "False")
                    return std::make_unique<Literal>(Value(false));
                if (t.text == "none" || t.text == "None")
                    return std::make_unique<Literal>(Value::none());
                return std::make_unique<NameExpr>(t.text);
            case Token::Kind::op:
                if (t.text == "(") {
                    ExprPtr e = expression();
                    if (is_op(",")) fail("tuples are not supported");
                    expect_op(")");
                    return e;
                }
                if (t.text == "[") {
                    auto l = std::make_unique<ListExpr>();
                    while (!is_op("]")) {
                        l->items.push_back(expression());
                        if (!is_op("]")) expect_op(",");
                    }
                    expect_op("]");
                    return seal(std::move(l));
                }
                if (t.text == "{") {
                    auto d = std::make_unique<DictExpr>();
                    while (!is_op("}")) {
                        ExprPtr k = expression();
                        expect_op(":");
                        d->items.emplace_back(std::move(k), expression());
                        if (!is_op("}")) expect_op(",");
                    }
                    expect_op("}");
                    return seal(std::move(d));
                }
                fail("unexpected '" + t.text + "'");
            case Token::Kind::end:
                fail("expression ends too early");
        }
        fail("unexpected token");
    }

    std::vector<Token> tokens_;
    size_t pos_ = 0;
    int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Statements

struct Stmt {
    virtual ~Stmt() = default;
    virtual void render(Context& ctx, std::string& out) const = 0;
};
using Body = std::vector<std::unique_ptr<Stmt>>;

void render_body(const Body& body, Context& ctx, std::string& out) {
    for (const auto& s : body) s->render(ctx, out);
}

struct TextStmt : Stmt {
    std::string text;
    void render(Context&, std::string& out) const override { out += text; }
};

struct OutputStmt : Stmt {
    ExprPtr e;
    void render(Context& ctx, std::string& out) const override { out += str(e->eval(ctx)); }
};

struct IfStmt : Stmt {
    std::vector<std::pair<ExprPtr, Body>> branches;
    Body otherwise;
    void render(Context& ctx, std::string& out) const override {
        for (const auto& [cond, body] : branches)
            if (truthy(cond->eval(ctx))) return render_body(body, ctx, out);
        render_body(otherwise, ctx, out);
    }
};

struct ForStmt : Stmt {
    std::vector<std::string> vars;
    ExprPtr iterable;
    Body body, otherwise;
    void render(Context& ctx, std::string& out) const override {
        const Value::List items = items_of(iterable->eval(ctx));
        const auto n = static_cast<int64_t>(items.size());
        for (int64_t i = 0; i < n; ++i) {
            ctx.scopes.emplace_back();  // each iteration starts from the enclosing scope
            const Value& item = items[static_cast<size_t>(i)];
            if (vars.size() == 1) {
                ctx.set(vars[0], item);
            } else {
                if (item.kind() != Value::Kind::list || item.list().size() != vars.size())
                    fail("cannot unpack a loop item into " + std::to_string(vars.size()) +
                         " names");
                for (size_t k = 0; k < vars.size(); ++k) ctx.set(vars[k], item.list()[k]);
            }
            ctx.set("loop", Value::Dict{{"index", i + 1},
                                        {"index0", i},
                                        {"first", i == 0},
                                        {"last", i == n - 1},
                                        {"length", n},
                                        {"revindex", n - i},
                                        {"revindex0", n - i - 1}});
            try {
                render_body(body, ctx, out);
            } catch (...) {
                ctx.scopes.pop_back();
                throw;
            }
            ctx.scopes.pop_back();
        }
        if (n == 0) render_body(otherwise, ctx, out);
    }
};

struct SetStmt : Stmt {
    std::string name;
    std::string attribute;  // {% set name.attribute = e %}: a namespace's, set in place
    ExprPtr e;
    void render(Context& ctx, std::string&) const override {
        if (attribute.empty()) return ctx.set(name, e->eval(ctx));
        const Value target = ctx.lookup(name);
        if (target.kind() != Value::Kind::ns)  // jinja2's message
            fail("cannot assign attribute on non-namespace object");
        target.set_attribute(attribute, e->eval(ctx));
    }
};

class StmtParser {
  public:
    explicit StmtParser(std::vector<Segment> segments) : segs_(std::move(segments)) {}

    Body parse_all() {
        std::string end;
        Body b = body({}, end);
        if (!end.empty()) fail("unexpected '{% " + end + " %}'");
        return b;
    }

  private:
    // Parses statements until a {% keyword %} in `stops`; `ended` gets that keyword and the
    // parser of its tag is left positioned after it.
    // Blocks nest by recursion here, in rendering and in destruction: bounded like expressions.
    Body body(const std::vector<std::string_view>& stops, std::string& ended) {
        if (++block_depth_ > kMaxTemplateDepth) fail_too_deep();
        struct Leave {
            int& depth;
            ~Leave() { --depth; }
        } leave{block_depth_};
        Body out;
        while (pos_ < segs_.size()) {
            const Segment& s = segs_[pos_++];
            if (s.kind == Segment::Kind::text) {
                auto t = std::make_unique<TextStmt>();
                t->text = s.body;
                out.push_back(std::move(t));
                continue;
            }
            tag_ = std::make_unique<ExprParser>(s.body);
            if (s.kind == Segment::Kind::expr) {
                auto o = std::make_unique<OutputStmt>();
                o->e = tag_->expression();
                tag_->expect_end();
                out.push_back(std::move(o));
                continue;
            }
            const std::string keyword = tag_->expect_name();
            if (std::find(stops.begin(), stops.end(), keyword) != stops.end()) {
                ended = keyword;
                return out;
            }
            if (keyword == "if")
                out.push_back(if_stmt());
            else if (keyword == "for")
                out.push_back(for_stmt());
            else if (keyword == "set")
                out.push_back(set_stmt());
            else
                fail("'{% " + keyword + " %}' is not supported");
        }
        if (!stops.empty()) fail("missing '{% " + std::string(stops.back()) + " %}'");
        return out;
    }

    std::unique_ptr<Stmt> if_stmt() {
        auto n = std::make_unique<IfStmt>();
        ExprPtr cond = tag_->expression();
        tag_->expect_end();
        for (;;) {
            std::string ended;
            Body b = body({"elif", "else", "endif"}, ended);
            n->branches.emplace_back(std::move(cond), std::move(b));
            if (ended == "elif") {
                cond = tag_->expression();
                tag_->expect_end();
                continue;
            }
            if (ended == "else") {
                tag_->expect_end();
                n->otherwise = body({"endif"}, ended);
            }
            tag_->expect_end();
            return n;
        }
    }

    std::unique_ptr<Stmt> for_stmt() {
        auto n = std::make_unique<ForStmt>();
        n->vars.push_back(tag_->expect_name());
        while (tag_->is_op(",")) {
            tag_->next();
            n->vars.push_back(tag_->expect_name());
        }
        if (!tag_->is_name("in")) fail("expected 'in' in a for loop");
        tag_->next();
        n->iterable = tag_->expression();
        if (tag_->is_name("recursive")) fail("recursive loops are not supported");
        tag_->expect_end();
        std::string ended;
        n->body = body({"else", "endfor"}, ended);
        if (ended == "else") {
            tag_->expect_end();
            n->otherwise = body({"endfor"}, ended);
        }
        tag_->expect_end();
        return n;
    }

    std::unique_ptr<Stmt> set_stmt() {
        auto n = std::make_unique<SetStmt>();
        n->name = tag_->expect_name();
        if (tag_->is_op(".")) {
            tag_->next();
            n->attribute = tag_->expect_name();
        }
        if (!tag_->is_op("="))
            fail("block assignments ({% set x %}...{% endset %}) are not supported");
        tag_->next();
        n->e = tag_->expression();
        tag_->expect_end();
        return n;
    }

    std::vector<Segment> segs_;
    size_t pos_ = 0;
    int block_depth_ = 0;
    std::unique_ptr<ExprParser> tag_;
};

}  // namespace

std::string render(std::string_view source, const std::map<std::string, Value>& variables) {
    StmtParser parser(split_segments(source));
    const Body body = parser.parse_all();
    Context ctx;
    ctx.scopes.push_back(variables);
    std::string out;
    render_body(body, ctx, out);
    return out;
}

void check_nesting(std::string_view source) {
    try {
        StmtParser parser(split_segments(source));
        parser.parse_all();
    } catch (const Error& e) {
        if (e.detail() == too_deep_message()) throw;
    }
}

}  // namespace qforge::jinja
