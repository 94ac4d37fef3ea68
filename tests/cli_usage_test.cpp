// The CLI's contract for usage errors (README.md, "Errors and exit codes"): every bad command line
// exits 2 with exactly one line on stderr, "qforge: error: ...", naming the option; nothing on
// stdout and nothing written. Values at the edges of each range are accepted, --help and
// --version exit 0.
//
// The model and input files given to the bad command lines are not models at all: options are
// checked before any input is opened, so a command line that got past its checks would fail on
// them with exit code 1 instead (which is how the edge values are shown to be accepted).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "test_support.hpp"

namespace cli_usage_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using qforge::test::q;

struct Run {
    int exit_code;
    std::string out, err;
};

// Runs qforge with stdout and stderr captured apart (test::run_qforge merges them).
Run run_split(const std::string& args, const fs::path& io_dir) {
    const fs::path out = io_dir / "stdout", err = io_dir / "stderr";
    const std::string cmd = "QFORGE_NO_PROGRESS=1 " + test::qforge_command() + " " + args + " >" +
                            q(out) + " 2>" + q(err) + " </dev/null";
    const int status = std::system(cmd.c_str());
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const auto o = test::read_file(out), e = test::read_file(err);
    return {code, std::string(o.begin(), o.end()), std::string(e.begin(), e.end())};
}

size_t count_lines(const std::string& s) {
    return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

std::set<std::string> listing(const fs::path& dir) {
    std::set<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        names.insert(fs::relative(e.path(), dir).string());
    return names;
}

// Fixtures: files that exist but are not what their names say, a directory, a missing path.
struct Fixture {
    test::ScratchDir dir{"cli-usage"};
    test::ScratchDir io{"cli-usage-io"};
    fs::path model = dir / "m.qf";     // garbage bytes
    fs::path text = dir / "text.txt";  // plain text
    fs::path subdir = dir / "sub";     // a directory
    fs::path ckpt = dir / "ckpt";      // an empty directory as a checkpoint
    fs::path missing = dir / "missing.qf";
    fs::path out = dir / "out.qf";

    Fixture() {
        test::write_file(model, std::string("this is not a .qf file at all\n"));
        test::write_file(text, std::string("Once upon a time there was a cat.\n"));
        fs::create_directories(subdir);
        fs::create_directories(ckpt);
    }

    // "M", "T", "D", "C", "X", "O" in a command line stand for the fixtures.
    std::string expand(const std::string& line) const {
        const std::pair<char, const fs::path*> names[] = {{'M', &model},   {'T', &text},
                                                          {'D', &subdir},  {'C', &ckpt},
                                                          {'X', &missing}, {'O', &out}};
        std::string s;
        for (const char c : line) {
            const auto* hit = std::find_if(std::begin(names), std::end(names),
                                           [c](const auto& n) { return n.first == c; });
            s += hit == std::end(names) ? std::string(1, c) : q(*hit->second);
        }
        return s;
    }
};

struct BadLine {
    const char* args;  // capital letters M T D C X O: see Fixture::expand; none appear otherwise
    const char* what;  // the message names this (the option, mostly)
};

// Lower-case except for the fixture letters.
const BadLine kBadLines[] = {
    // No, unknown subcommands; unknown options.
    {"", "missing subcommand; expected one of: convert, quantize, inspect, verify, tokenize, ppl"},
    {"frobnicate", "unknown subcommand 'frobnicate'; expected one of: convert"},
    {"--bogus", "unknown option '--bogus' for 'qforge'"},
    {"ppl M -f T --foo", "unknown option '--foo' for 'qforge ppl'"},
    {"ppl M -f T --foo=3", "unknown option '--foo' for 'qforge ppl'"},
    {"verify M M", "qforge verify: unexpected argument"},
    {"verify", "qforge verify: missing required argument: file"},
    // ppl
    {"ppl M -f T --ctx 1", "--ctx: 1 is out of range; expected an integer from 2 to 16777216"},
    {"ppl M -f T --ctx 0", "--ctx: 0 is out of range"},
    {"ppl M -f T --ctx -1", "--ctx: -1 is out of range"},
    {"ppl M -f T --ctx abc", "--ctx: 'abc' is not an integer"},
    {"ppl M -f T --ctx ''", "--ctx: '' is not an integer"},
    {"ppl M -f T --ctx 1e99", "--ctx: '1e99' is not an integer"},
    {"ppl M -f T --ctx 5x", "--ctx: '5x' is not an integer"},
    {"ppl M -f T --ctx 0x10", "--ctx: '0x10' is not an integer"},
    {"ppl M -f T --ctx ' 64'", "--ctx: ' 64' is not an integer"},
    {"ppl M -f T --ctx 99999999999999999999999", "--ctx: 99999999999999999999999 is out of range"},
    {"ppl M -f T --ctx 16777217", "--ctx: 16777217 is out of range"},
    {"ppl M -f T --ctx \"$(printf '6\\n4')\"", "--ctx: '6\\x0a4' is not an integer"},
    {"ppl M -f T --ctx", "--ctx"},
    {"ppl M -f T --chunks -1", "--chunks: -1 is out of range; expected an integer from 0"},
    {"ppl M -f T --chunks 4294967296", "--chunks: 4294967296 is out of range"},
    {"ppl M -f T --protocol foo",
     "--protocol: 'foo' is not valid; expected one of: llamacpp, gptq"},
    {"ppl M -f T --protocol ''", "--protocol: '' is not valid"},
    {"ppl M -f T -t -1", "-t/--threads: -1 is out of range; expected an integer from 0 to 1024"},
    {"ppl M -f T --threads 1025", "-t/--threads: 1025 is out of range"},
    {"ppl M -f T --threads 1.5", "-t/--threads: '1.5' is not an integer"},
    {"ppl M -f T --backend gpu", "--backend: 'gpu' is not valid; expected one of: auto, cpu, cuda"},
    {"ppl M -f D", "-f/--file: '"},
    {"ppl M -f X", "-f/--file: '"},
    {"ppl M -f ''", "-f/--file: '' does not exist"},
    {"ppl M", "qforge ppl: missing required argument: -f/--file"},
    {"ppl X -f T", "model: '"},
    {"ppl M -f T --kl-base X", "--kl-base: '"},
    // generate
    {"generate M -n -1", "-n/--tokens: -1 is out of range; expected an integer from 1 to 16777216"},
    {"generate M -n 0", "-n/--tokens: 0 is out of range"},
    {"generate M --tokens 18446744073709551615",
     "-n/--tokens: 18446744073709551615 is out of range"},
    {"generate M --seed -1",
     "--seed: -1 is out of range; expected an integer from 0 to "
     "18446744073709551615"},
    {"generate M --seed 18446744073709551616", "--seed: 18446744073709551616 is out of range"},
    {"generate M --seed abc", "--seed: 'abc' is not an integer"},
    {"generate M --top-p 0", "--top-p: 0 is out of range; expected a number in (0, 1]"},
    {"generate M --top-p 1.5", "--top-p: 1.5 is out of range"},
    {"generate M --min-p 1.5", "--min-p: 1.5 is out of range; expected a number in [0, 1]"},
    {"generate M --min-p -0.1", "--min-p: -0.1 is out of range"},
    {"generate M --top-p 1e-50", "--top-p: 1e-50 is out of range"},  // 0 as a float
    {"generate M --top-p nan", "--top-p: 'nan' is not a number"},
    {"generate M --top-p 0.5x", "--top-p: '0.5x' is not a number"},
    {"generate M --top-k -1",
     "--top-k: -1 is out of range; expected an integer from 0 to 4294967295"},
    {"generate M --top-k 4294967296", "--top-k: 4294967296 is out of range"},
    {"generate M --temp -0.1", "--temp: -0.1 is out of range; expected a number in [0, 100]"},
    {"generate M --temp inf", "--temp: 'inf' is not a number"},
    {"generate M --temp 1e99", "--temp: 1e99 is out of range"},
    {"generate M --temp ''", "--temp: '' is not a number"},
    {"generate M --presence-penalty 2.5",
     "--presence-penalty: 2.5 is out of range; expected a number in [-2, 2]"},
    {"generate M --frequency-penalty -3", "--frequency-penalty: -3 is out of range"},
    {"generate M --frequency-penalty nan", "--frequency-penalty: 'nan' is not a number"},
    {"generate M --logit-bias 13", "--logit-bias '13': expected ID=BIAS"},
    {"generate M --logit-bias x=1", "--logit-bias 'x=1': the token id must be"},
    {"generate M --logit-bias 1=101", "--logit-bias '1=101': the bias must be a number in"},
    {"generate X", "model: '"},
    {"generate M --greedy=2", "--greedy"},  // a flag takes no value
    {"ppl M -f T --json=false", "--json"},
    // bench
    {"bench M -p 0", "-p/--prompt: 0 is out of range; expected an integer from 1 to 16777216"},
    {"bench M --prefill -5", "-p/--prompt: -5 is out of range"},
    {"bench M -n -1", "-n/--gen: -1 is out of range"},
    {"bench M --decode 16777217", "-n/--gen: 16777217 is out of range"},
    {"bench M -r 0", "-r/--reps: 0 is out of range; expected an integer from 1 to 1000"},
    {"bench M -r 1001", "-r/--reps: 1001 is out of range"},
    {"bench M --bandwidth 0", "--bandwidth: 0 is out of range; expected a number in (0, 1e+06]"},
    {"bench M --bandwidth -5", "--bandwidth: -5 is out of range"},
    {"bench M --bandwidth fast", "--bandwidth: 'fast' is not a number"},
    {"bench M --bandwidth 1e400", "--bandwidth: 1e400 is out of range"},
    {"bench M --bandwidth -inf", "--bandwidth: '-inf' is not a number"},
    // quantize
    {"quantize C -o O --qtype q5_k", "--qtype: unknown qtype 'q5_k' (valid: f32, f16, bf16, q8"},
    {"quantize C -o O --qtype ''", "--qtype: unknown qtype ''"},
    {"quantize C -o O", "qforge quantize: missing required argument: --qtype"},
    {"quantize C -o O --qtype q4_g32 --tensor-type 'attn.(q=q8'",
     "--tensor-type 'attn.(q=q8': bad regex"},
    {"quantize C -o O --qtype q4_g32 --tensor-type attn=q2",
     "--tensor-type 'attn=q2': unknown qtype 'q2'"},
    {"quantize C -o O --qtype q4_g32 --tensor-type attn",
     "--tensor-type 'attn': expected REGEX=TYPE"},
    {"quantize C -o O --qtype q4_g32 --method foo",
     "--method 'foo' is not a method (valid: rtn, gptq"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib T --nsamples 0",
     "--nsamples: 0 is out of range; expected an integer from 1 to 1048576"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib T --nsamples -1",
     "--nsamples: -1 is out of range"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib T --seqlen 1",
     "--seqlen: 1 is out of range; expected an integer from 2 to 1048576"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib T --seqlen 1048577",
     "--seqlen: 1048577 is out"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib T --damp 1.5",
     "--damp: 1.5 is out of range; expected a number in [0, 1]"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib T --damp -0.01",
     "--damp: -0.01 is out of range"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib T --damp abc",
     "--damp: 'abc' is not a number"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib D", "--calib: '"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib T --calib-products fp8",
     "--calib-products: 'fp8' is not one of auto, f32, bf16"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib T X", "--calib: '"},
    {"quantize C -o O --qtype q4_g32 --method gptq",
     "--method gptq needs calibration text: --calib FILE"},
    {"quantize C -o O --qtype q4_g32 --importance",
     "--method rtn --importance needs calibration text: --calib FILE"},
    {"quantize C -o O --qtype q4_g32 --method gptq --calib T --importance --mse",
     "--importance and --mse choose each group's grid differently"},
    {"quantize C -o O --qtype q4_g32 --resume D", "--resume is for calibrated methods"},
    {"quantize C -o O --qtype q4_g32 --calib T --no-importance",
     "--method rtn --no-importance reads no calibration text: drop --calib FILE"},
    {"quantize C -o O --qtype q5", "--qtype: unknown qtype 'q5' (valid: f32,"},
    {"quantize C -o O --qtype q5", "; families: q3 = q3k_g32, q4 = q4k_g32, q8 = q8)"},
    {"quantize X -o O --qtype q4_g32", "input: '"},
    {"quantize C -o O --qtype q4_g32 --tokenizer X", "--tokenizer: '"},
    {"quantize C -o O --qtype q4_g32 -t -2", "-t/--threads: -2 is out of range"},
    // convert
    {"convert C -o O --dtype f8", "--dtype: 'f8' is not valid; expected one of: f32, f16, bf16"},
    {"convert C -o O --dtype q4_g32", "--dtype: 'q4_g32' is not valid"},
    {"convert C", "qforge convert: missing required argument: -o/--output"},
    {"convert C -o O --tokenizer D", "--tokenizer: '"},
    {"convert X -o O", "input: '"},
    {"convert C -o O --compress=maybe", "--compress"},
    // export
    {"export M -o D/e --format foo", "--format: 'foo' is not valid; expected one of: gptq, awq"},
    {"export M -o D/e", "qforge export: missing required argument: --format"},
    {"export X -o D/e --format gptq", "input: '"},
    // serve
    {"serve M --port 70000", "--port: 70000 is out of range"},
    {"serve M --max-seqs 0", "--max-seqs: 0 is out of range"},
    {"serve M --chat-template /nonexistent.jinja",
     "--chat-template: '/nonexistent.jinja' does not exist"},
    {"serve X", "model: '"},
    // tokenize, inspect
    {"tokenize M", "qforge tokenize: missing the text: -p/--prompt TEXT or -f/--file FILE"},
    {"tokenize M -f D", "-f/--file: '"},
    {"tokenize M -p hi -f T", "cannot be used with"},
    {"tokenize X -p hi", "source: '"},
    {"inspect X", "file: '"},
    {"inspect M --json extra", "qforge inspect: unexpected argument 'extra'"},
};

}  // namespace

TEST_CASE("every usage error: exit 2, one line naming the option, nothing written",
          "[hostile][cli]") {
    const Fixture f;
    const std::set<std::string> before = listing(f.dir.path());
    size_t n = 0;
    for (const BadLine& b : kBadLines) {
        const std::string args = f.expand(b.args);
        INFO("qforge " << args);
        const Run r = run_split(args, f.io.path());
        INFO("stderr: " << r.err);
        INFO("stdout: " << r.out);
        CHECK(r.exit_code == 2);
        CHECK(count_lines(r.err) == 1);
        CHECK(r.err.rfind("qforge: error: ", 0) == 0);
        CHECK_THAT(r.err, Contains(b.what));
        CHECK(r.err.find("Run with --help") == std::string::npos);
        CHECK(r.out.empty());
        CHECK(listing(f.dir.path()) == before);
        ++n;
    }
    REQUIRE(n >= 40);
}

TEST_CASE("a missing or directory -f names the path and says which", "[hostile][cli]") {
    const Fixture f;
    Run r = run_split(f.expand("ppl M -f D"), f.io.path());
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Contains(f.subdir.string() + "' is a directory; expected a file"));
    // A directory as the model is a checkpoint to read (any input kind is taken): an input
    // error naming it, not a usage error.
    r = run_split(f.expand("ppl D -f T"), f.io.path());
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Contains(f.subdir.string() + ": no config.json in the checkpoint"));
    r = run_split(f.expand("ppl M -f X"), f.io.path());
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Contains(f.missing.string() + "' does not exist"));
    if (::geteuid() != 0) {  // root reads anything
        const fs::path locked = f.dir / "locked.txt";
        test::write_file(locked, std::string("text"));
        fs::permissions(locked, fs::perms::none);
        r = run_split("ppl " + q(f.model) + " -f " + q(locked), f.io.path());
        CHECK(r.exit_code == 2);
        CHECK_THAT(r.err, Contains("-f/--file: '" + locked.string() + "' cannot be read: "));
    }
}

TEST_CASE("values at the edges of every range pass the checks", "[hostile][cli]") {
    // Each line gets past its option checks and fails on the garbage model or input (exit 1, the
    // file named); one step past an edge is in the table above (exit 2).
    const Fixture f;
    const char* edges[] = {
        "ppl M -f T --ctx 2 --chunks 0 -t 0 --protocol llamacpp",
        "ppl M -f T --ctx 16777216 --chunks 4294967295 --threads 1024 --protocol gptq --backend "
        "cpu",
        "ppl M -f T --ctx 008",  // decimal, not octal
        "generate M -n 1 --seed 0 --top-p 1 --top-k 0 --temp 0",
        "generate M -n 16777216 --seed 18446744073709551615 --top-p 1e-6 --top-k 4294967295 "
        "--temp 100",
        "generate M --seed -0",
        "generate M --presence-penalty -2 --frequency-penalty 2 --logit-bias 0=-100 "
        "--logit-bias 2147483647=100",
        "bench M -p 1 -n 1 -r 1 --bandwidth 1e6",
        "bench M -p 16777216 -n 16777216 -r 1000 --bandwidth 0.001",
        "quantize M -o O --qtype q4_g32 --method gptq --calib T --nsamples 1 --seqlen 2 --damp 0",
        "quantize M -o O --qtype q4_g32 --method gptq --calib T --nsamples 1048576 --seqlen "
        "1048576 "
        "--damp 1",
        "quantize M -o O --qtype q8 --tensor-type 'mlp=q4_g32' --tensor-type '^lm_head$=f16'",
        "convert M -o O --dtype bf16",
        "verify M",
        "inspect M",
        "tokenize M -p hi",
    };
    const std::set<std::string> before = listing(f.dir.path());
    for (const char* line : edges) {
        const std::string args = f.expand(line);
        INFO("qforge " << args);
        const Run r = run_split(args, f.io.path());
        INFO("stderr: " << r.err);
        CHECK(r.exit_code == 1);
        CHECK(r.err.rfind("qforge: error: ", 0) == 0);
        CHECK_THAT(r.err, Contains("m.qf"));
        CHECK(listing(f.dir.path()) == before);
    }
}

TEST_CASE("--help and --version exit 0 on stdout", "[hostile][cli]") {
    const Fixture f;
    Run r = run_split("--help", f.io.path());
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Contains("quantize") && Contains("ppl") && Contains("export"));
    r = run_split("--version", f.io.path());
    CHECK(r.exit_code == 0);
    CHECK(r.out.rfind("qforge ", 0) == 0);
    for (const char* sub : {"convert", "quantize", "inspect", "verify", "tokenize", "ppl",
                            "generate", "bench", "export", "serve"}) {
        INFO(sub);
        r = run_split(std::string(sub) + " --help", f.io.path());
        CHECK(r.exit_code == 0);
        CHECK(r.err.empty());
        CHECK_THAT(r.out, Contains(sub));
    }
    // The ranges are stated in the help, from the same place that checks them.
    r = run_split("ppl --help", f.io.path());
    CHECK_THAT(r.out, Contains("[2, 16777216]"));
    // --help wins over a bad value beside it (CLI11 validates before it looks for --help).
    const std::string help = r.out;
    for (const char* line : {"ppl --ctx 1 --help", "ppl --help --ctx 1", "ppl X -h"}) {
        INFO(line);
        r = run_split(f.expand(line), f.io.path());
        CHECK(r.exit_code == 0);
        CHECK(r.err.empty());
        CHECK(r.out == help);
    }
}

TEST_CASE("edge values run for real on a tiny model", "[hostile][cli]") {
    const fs::path gguf = test::fixture("gguf/tiny_llama.gguf");
    const Fixture f;
    const fs::path model = f.dir / "t.qf";
    Run r = run_split("convert " + q(gguf) + " -o " + q(model), f.io.path());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    std::string words;
    for (int i = 0; i < 40; ++i) words += "the cat sat on the mat. ";
    const fs::path text = f.dir / "words.txt";
    test::write_file(text, words);
    const char* lines[] = {
        "generate T -n 1 --temp 0 --top-k 0 --top-p 1 -t 1 -q -p hello",
        "generate T -n 2 --temp 100 --top-k 1 --top-p 1e-6 --seed 18446744073709551615 -q -p hi",
        "ppl T -f W --ctx 8 --chunks 1 -q",
        "ppl T -f W --ctx 8 --chunks 1 --protocol gptq -q",
        "bench T -p 1 -n 1 -r 1 --bandwidth 1e6 -t 1 -q",
    };
    for (const char* line : lines) {
        std::string args;
        for (const char* c = line; *c; ++c) {
            if (*c == 'T')
                args += q(model);
            else if (*c == 'W')
                args += q(text);
            else
                args += *c;
        }
        INFO("qforge " << args);
        r = run_split(args, f.io.path());
        INFO("stderr: " << r.err);
        CHECK(r.exit_code == 0);
    }
    // Constrained generation: the reply is one of the choices, or a whole match of the pattern
    // (std::regex checks it: another engine than the one that constrained it).
    r = run_split("generate " + q(model) + " -n 16 --choice yes --choice 'no way' -q -p hi",
                  f.io.path());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(std::regex_search(r.out, std::regex("(yes|no way)\n?$")));
    r = run_split("generate " + q(model) + " -n 16 --regex '[0-9]{2}x' --seed 4 -q -p hi",
                  f.io.path());
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    CHECK(std::regex_search(r.out, std::regex("(^|[^0-9])[0-9]{2}x\n?$")));
    for (const char* bad : {"--regex '(?=a)'", "--regex a --choice b", "--regex a --ignore-eos"}) {
        INFO(bad);
        r = run_split("generate " + q(model) + " -q -p hi " + bad, f.io.path());
        CHECK(r.exit_code == 2);
        CHECK(r.err.rfind("qforge: error: ", 0) == 0);
    }
    // A leading zero is decimal (strtoull's base 0 would read 010 as 8).
    r = run_split("ppl " + q(model) + " -f " + q(text) + " --ctx 010 --chunks 1 --json -q",
                  f.io.path());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(nlohmann::json::parse(r.out).at("ctx") == 10);
}

}  // namespace cli_usage_test
