// Hostile output paths for every writing command (convert, quantize RTN and GPTQ, export): an
// output that is an input (directly, through a symlink or a hard link, inside the input
// directory, a file read beside the input), empty, a device node, a FIFO, a directory, or in a
// missing directory is refused with one line before any work, and afterwards the inputs are byte
// for byte what they were and the output directory holds nothing new. A convert or quantize
// killed with SIGKILL at any moment leaves no file at all (O_TMPFILE) and the old output whole;
// SIGINT during convert or export leaves no temporary file or directory.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_support.hpp"
#include "formats/architectures.hpp"
#include "formats/model_config.hpp"
#include "formats/safetensors.hpp"
#include "test_support.hpp"

namespace output_safety_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data";

using qforge::test::q;

// What a directory tree holds: each entry's type, device numbers and, for files, bytes.
using Snapshot = std::map<std::string, std::pair<std::string, std::vector<uint8_t>>>;

Snapshot snapshot(const fs::path& dir) {
    Snapshot s;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
        struct stat st {};
        REQUIRE(::lstat(e.path().c_str(), &st) == 0);
        const std::string meta = std::to_string(st.st_mode) + ":" + std::to_string(st.st_rdev);
        s[fs::relative(e.path(), dir).string()] = {
            meta, S_ISREG(st.st_mode) ? test::read_file(e.path()) : std::vector<uint8_t>{}};
    }
    return s;
}

struct DeviceState {
    mode_t mode;
    dev_t rdev;
    ino_t ino;
    bool operator==(const DeviceState&) const = default;
};
DeviceState device_state(const fs::path& p) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return {st.st_mode, st.st_rdev, st.st_ino};
}

void require_refused(const test::CommandResult& r, const std::vector<std::string>& fragments) {
    INFO(r.output);
    REQUIRE(r.exit_code != 0);
    REQUIRE(std::count(r.output.begin(), r.output.end(), '\n') == 1);
    REQUIRE(r.output.rfind("qforge: error: ", 0) == 0);
    REQUIRE_THAT(r.output, !Contains("qforge-tmp") && !Contains(".tmp."));
    for (const auto& f : fragments) REQUIRE_THAT(r.output, Contains(f));
}

// A Llama checkpoint (config.json + one f16 model.safetensors) with deterministic pseudo-random
// weights in `dir`; vocab 512 so the fixtures' tok512.bin serves as its tokenizer.
void make_checkpoint(const fs::path& dir, uint64_t hidden, uint64_t intermediate, uint64_t layers) {
    fs::create_directories(dir);
    nlohmann::json cfg = nlohmann::json::parse(
        test::read_file(kData / "hf_models" / "llama_gqa_untied" / "config.json"));
    cfg["hidden_size"] = hidden;
    cfg["head_dim"] = hidden / 4;
    cfg["intermediate_size"] = intermediate;
    cfg["num_hidden_layers"] = layers;
    cfg["vocab_size"] = 512;
    test::write_file(dir / "config.json", cfg.dump(2));
    const ModelConfig config = parse_model_config(cfg, "config.json");
    uint64_t state = 0x9e3779b97f4a7c15ull;
    auto next = [&]() {  // xorshift64*: uniform in [-1, 1)
        state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
        return static_cast<float>((state * 0x2545f4914f6cdd1dull) >> 40) / float(1 << 23) - 1.0f;
    };
    std::vector<std::vector<uint8_t>> data;
    std::vector<TensorView> views;
    for (const TensorSpec& s : expected_tensors(config)) {
        uint64_t count = 1;
        for (uint64_t d : s.shape) count *= d;
        std::vector<float> v(count);
        for (float& x : v) x = s.is_matrix ? 0.05f * next() : 1.0f + 0.05f * next();
        data.push_back(test::float_bytes(QType::f16, v));
    }
    size_t i = 0;
    for (const TensorSpec& s : expected_tensors(config))
        views.push_back({s.hf_name, DType::f16, s.shape, data[i++]});
    write_safetensors((dir / "model.safetensors").string(), views);
}

// in/: hf/ (a checkpoint), tok512.bin beside it, small.qf (its conversion), calib.txt and,
// when `quantized`, q4.qf (RTN q4_g32, embeddings f16, exportable); out/: empty.
struct Fixture {
    test::ScratchDir dir;
    fs::path in, out, hf, tok, qf, calib, q4;
    explicit Fixture(const std::string& name, bool quantized = false)
        : dir(name),
          in(dir / "in"),
          out(dir / "out"),
          hf(in / "hf"),
          tok(in / "tok512.bin"),
          qf(in / "small.qf"),
          calib(in / "calib.txt"),
          q4(in / "q4.qf") {
        fs::create_directories(out);
        make_checkpoint(hf, 128, 256, 1);
        fs::copy_file(kData / "quant_checkpoints" / "tok512.bin", tok);
        std::string text;
        for (int k = 0; k < 200; ++k) text += "Once upon a time there was a little dog. ";
        test::write_file(calib, text);
        auto r = test::run_qforge("convert " + q(hf) + " -o " + q(qf));
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
        if (quantized) {
            r = test::run_qforge("quantize " + q(qf) + " -o " + q(q4) +
                                 " --qtype q4_g32 --tensor-type '^embed$=f16'");
            INFO(r.output);
            REQUIRE(r.exit_code == 0);
        }
    }
};

// Runs each refused command and checks the inputs and the output directory did not change.
void check_refusals(const Fixture& fx,
                    const std::vector<std::pair<std::string, std::vector<std::string>>>& cases) {
    for (const auto& [args, fragments] : cases) {
        INFO(args);
        const Snapshot in_before = snapshot(fx.in), out_before = snapshot(fx.out);
        const DeviceState null_before = device_state("/dev/null"),
                          full_before = device_state("/dev/full");
        require_refused(test::run_qforge(args), fragments);
        REQUIRE(snapshot(fx.in) == in_before);
        REQUIRE(snapshot(fx.out) == out_before);
        REQUIRE(device_state("/dev/null") == null_before);
        REQUIRE(device_state("/dev/full") == full_before);
    }
}

}  // namespace

TEST_CASE("convert refuses an output that is an input, a device, a FIFO or in a missing directory",
          "[hostile][output][cli]") {
    Fixture fx("out-convert");
    const fs::path st = fx.hf / "model.safetensors";
    fs::create_symlink(st, fx.out / "link.qf");
    fs::create_hard_link(st, fx.out / "hard.qf");
    fs::create_hard_link(fx.hf / "config.json", fx.out / "hard-config.qf");
    fs::create_symlink(fx.hf, fx.out / "hf-link");
    REQUIRE(::mkfifo((fx.out / "fifo").c_str(), 0644) == 0);
    // A reader on the FIFO, so a wrong open for writing would not block the test.
    const int fifo_reader = ::open((fx.out / "fifo").c_str(), O_RDONLY | O_NONBLOCK);
    REQUIRE(fifo_reader >= 0);
    const std::string c = "convert ";
    check_refusals(
        fx,
        {
            {c + q(st) + " -o " + q(st), {"is the input", st.string()}},
            {c + q(st) + " -o " + q(fx.out / "link.qf"), {"is the input"}},
            {c + q(st) + " -o " + q(fx.out / "hard.qf"), {"is the input"}},
            {c + q(fx.hf) + " -o " + q(fx.hf), {"is the input"}},
            {c + q(fx.hf) + " -o " + q(fx.out / "hard-config.qf"), {"is the input", "config.json"}},
            {c + q(fx.hf) + " -o " + q(fx.hf / "out.qf"),
             {"inside the input directory", fx.hf.string()}},
            {c + q(fx.hf) + " -o " + q(fx.out / "hf-link" / "out.qf"),
             {"inside the input directory"}},
            {c + q(fx.hf) + " -o " + q(fx.in / "hf" / ".." / "hf" / "config.json"),
             {"is the input", "config.json"}},
            {c + q(st) + " -o " + q(fx.hf / "config.json"), {"is the input", "config.json"}},
            {c + q(fx.hf) + " -o " + q(fx.tok), {"is the input", "tok512.bin"}},
            {c + q(fx.hf) + " --tokenizer " + q(fx.tok) + " -o " + q(fx.tok), {"is the input"}},
            {c + q(fx.hf) + " -o ''", {"output path is empty"}},
            {c + q(fx.hf) + " -o /dev/null", {"/dev/null", "a character device"}},
            {c + q(fx.hf) + " -o /dev/full", {"/dev/full", "a character device"}},
            {c + q(fx.hf) + " -o " + q(fx.out / "fifo"), {"a FIFO"}},
            {c + q(fx.hf) + " -o " + q(fx.out), {"a directory"}},
            {c + q(fx.hf) + " -o " + q(fx.out.string() + "/"), {"names a directory"}},
            {c + q(fx.hf) + " -o " + q(fx.out / "missing" / "deeper" / "x.qf"), {"does not exist"}},
        });
    char byte;
    REQUIRE(::read(fifo_reader, &byte, 1) <= 0);  // nothing was written into the FIFO
    ::close(fifo_reader);

    // Before any work: with a broken input, the output's error still comes first.
    const fs::path broken = fx.in / "broken";
    fs::create_directories(broken);
    fs::copy_file(fx.hf / "config.json", broken / "config.json");
    test::write_file(broken / "model.safetensors", std::vector<uint8_t>{1, 2, 3});
    check_refusals(fx, {{c + q(broken) + " -o " + q(fx.out / "missing" / "x.qf"),
                         {"does not exist", (fx.out / "missing").string()}}});

    // The positive control: the same input to a new path, and over an existing regular file
    // that is no input (replaced atomically), succeed with equal bytes.
    test::write_file(fx.out / "old.qf", std::string("an older file"));
    for (const char* name : {"new.qf", "old.qf"}) {
        const auto r = test::run_qforge(c + q(fx.hf) + " -o " + q(fx.out / name));
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
    }
    REQUIRE(test::read_file(fx.out / "old.qf") == test::read_file(fx.qf));
    REQUIRE(test::read_file(fx.out / "new.qf") == test::read_file(fx.qf));
}

TEST_CASE("convert of a llama2.c checkpoint refuses its own file and the vocabulary beside it",
          "[hostile][output][cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    Fixture fx("out-llama2c");
    const fs::path bin = fx.in / "stories260K.bin";
    fs::copy_file(data / "stories260K" / "stories260K.bin", bin);
    fs::create_symlink(bin, fx.out / "link.bin");
    check_refusals(fx,
                   {
                       {"convert " + q(bin) + " -o " + q(bin), {"is the input"}},
                       {"convert " + q(bin) + " -o " + q(fx.out / "link.bin"), {"is the input"}},
                       {"convert " + q(bin) + " -o " + q(fx.tok), {"is the input", "tok512.bin"}},
                   });
}

TEST_CASE("quantize (RTN and GPTQ) refuses an output or --resume that is an input",
          "[hostile][output][cli][quant]") {
    Fixture fx("out-quantize");
    fs::create_symlink(fx.qf, fx.out / "link.qf");
    fs::create_hard_link(fx.qf, fx.out / "hard.qf");
    REQUIRE(::mkfifo((fx.out / "fifo").c_str(), 0644) == 0);
    const int fifo_reader = ::open((fx.out / "fifo").c_str(), O_RDONLY | O_NONBLOCK);
    REQUIRE(fifo_reader >= 0);
    const std::string rtn = " --qtype q4_g32";
    const std::string gptq =
        " --qtype q4_g32 --method gptq --calib " + q(fx.calib) + " --nsamples 2 --seqlen 16";
    std::vector<std::pair<std::string, std::vector<std::string>>> cases;
    for (const std::string& method : {rtn, gptq}) {
        const std::string qz = "quantize " + q(fx.qf) + method;
        cases.push_back({qz + " -o " + q(fx.qf), {"is the input", fx.qf.string()}});
        cases.push_back({qz + " -o " + q(fx.out / "link.qf"), {"is the input"}});
        cases.push_back({qz + " -o " + q(fx.out / "hard.qf"), {"is the input"}});
        cases.push_back({qz + " -o ''", {"output path is empty"}});
        cases.push_back({qz + " -o /dev/null", {"a character device"}});
        cases.push_back({qz + " -o " + q(fx.out / "fifo"), {"a FIFO"}});
        cases.push_back({qz + " -o " + q(fx.out / "missing" / "q.qf"), {"does not exist"}});
        cases.push_back({"quantize " + q(fx.hf) + method + " -o " + q(fx.hf / "q.qf"),
                         {"inside the input directory"}});
    }
    const std::string qg = "quantize " + q(fx.qf) + gptq;
    const std::string hg = "quantize " + q(fx.hf) + gptq;
    cases.push_back({qg + " -o " + q(fx.calib), {"is the input", "calib.txt"}});
    cases.push_back({qg + " -o " + q(fx.out / "q.qf") + " --resume " + q(fx.out / "q.qf"),
                     {"--resume", "is this directory or inside it"}});
    cases.push_back({qg + " -o " + q(fx.out / "q.qf") + " --resume " + q(fx.out),
                     {"--resume", "is this directory or inside it"}});
    cases.push_back({qg + " -o " + q(fx.out / "q.qf") + " --resume " + q(fx.in),
                     {"--resume", "holds the input"}});
    cases.push_back({qg + " -o " + q(fx.out / "q.qf") + " --resume " + q(fx.qf),
                     {"--resume", "not a directory"}});
    cases.push_back({hg + " -o " + q(fx.out / "q.qf") + " --resume " + q(fx.hf / "state"),
                     {"--resume", "input directory"}});
    cases.push_back({qg + " -o " + q(fx.out / "q.qf") + " --resume " + q(fx.out / "no" / "state"),
                     {"does not exist"}});
    check_refusals(fx, cases);
    char byte;
    REQUIRE(::read(fifo_reader, &byte, 1) <= 0);
    ::close(fifo_reader);

    // The positive control: the same RTN command to a new path succeeds.
    const auto r = test::run_qforge("quantize " + q(fx.qf) + rtn + " -o " + q(fx.out / "q.qf"));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
}

TEST_CASE("export refuses an output that is its input, a device or in a missing directory",
          "[hostile][output][cli]") {
    Fixture fx("out-export", true);
    fs::create_symlink(fx.q4, fx.out / "link.qf");
    test::write_file(fx.out / "file", std::string("x"));
    const std::string e = "export --format gptq " + q(fx.q4);
    check_refusals(fx, {
                           {e + " -o " + q(fx.q4), {"is the input"}},
                           {e + " -o " + q(fx.out / "link.qf"), {"is the input"}},
                           {e + " -o " + q(fx.in), {"contains the input"}},
                           {e + " -o " + q(fx.out / "file"), {"a regular file, not a directory"}},
                           {e + " -o ''", {"output path is empty"}},
                           {e + " -o /dev/null", {"a character device"}},
                           {e + " -o " + q(fx.out / "missing" / "gptq"), {"does not exist"}},
                       });
    // A full disk while writing (ulimit -f: 8 KiB files): the error names the file under the
    // output directory with the errno text, and the temporary directory is gone.
    const Snapshot out_before = snapshot(fx.out);
    require_refused(test::run_qforge(e + " -o " + q(fx.out / "gptq"), "ulimit -f 8;"),
                    {(fx.out / "gptq" / "model.safetensors").string(), "File too large"});
    REQUIRE(snapshot(fx.out) == out_before);

    const auto r = test::run_qforge(e + " -o " + q(fx.out / "gptq"));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE(fs::exists(fx.out / "gptq" / "config.json"));
}

namespace {

// Starts qforge with `args` (one argv entry each), its output discarded.
// The signals the tests send are blocked across fork(), so one that arrives before exec() waits
// until the child has dropped Catch2's handlers (which are not fork-safe) for the default ones.
pid_t spawn_qforge(const std::vector<std::string>& args) {
    sigset_t block, old;
    sigemptyset(&block);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&block, sig);
    ::pthread_sigmask(SIG_BLOCK, &block, &old);
    const pid_t pid = ::fork();
    if (pid == 0) {
        for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
        ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
        const int null = ::open("/dev/null", O_RDWR);
        ::dup2(null, 1);
        ::dup2(null, 2);
        ::setenv("QFORGE_NO_PROGRESS", "1", 1);
        std::vector<char*> argv{const_cast<char*>("qforge")};
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(QFORGE_BINARY, argv.data());
        _exit(127);
    }
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    REQUIRE(pid >= 0);
    return pid;
}

struct Interrupted {
    int finished = 0, killed = 0;
};

// Starts qforge with `args`, sends it `sig` after `delay_ms` and waits for it: its exit status.
int run_and_signal(const std::vector<std::string>& args, int sig, int delay_ms) {
    const pid_t pid = spawn_qforge(args);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, sig);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return status;
}

// The names in `dir`, sorted.
std::vector<std::string> names_in(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

// Runs `args` (writing `target`) again and again, sending `sig` after a growing delay; after each
// run the directory of `target` must hold exactly what it held before plus, at most, the
// complete output `reference` under the target's name.
Interrupted interrupt_repeatedly(const std::vector<std::string>& args, const fs::path& target,
                                 const std::vector<uint8_t>& old_bytes,
                                 const std::vector<uint8_t>& reference, int sig) {
    Interrupted counts;
    const fs::path dir = target.parent_path();
    for (const int delay_ms : {0, 2, 5, 10, 20, 35, 50, 75, 100, 150, 200, 300, 450, 700}) {
        INFO("signal " << sig << " after " << delay_ms << " ms");
        fs::remove_all(dir);
        fs::create_directories(dir);
        if (!old_bytes.empty()) test::write_file(target, old_bytes);
        const int status = run_and_signal(args, sig, delay_ms);
        const bool done = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        counts.finished += done;
        counts.killed += WIFSIGNALED(status);
        const auto names = names_in(dir);
        INFO("left: " << names.size() << (names.empty() ? "" : " first " + names.front()));
        if (done) {
            REQUIRE(names.size() == 1);
            REQUIRE(test::read_file(target) == reference);
        } else if (old_bytes.empty()) {
            REQUIRE(names.size() <= 1);
            if (names.size() == 1) REQUIRE(test::read_file(target) == reference);
        } else {
            REQUIRE(names.size() == 1);
            const auto now = test::read_file(target);
            REQUIRE((now == old_bytes || now == reference));
        }
    }
    return counts;
}

}  // namespace

// Hidden ("[.]", run it with `qforge_tests "[slow]"`): about 19 s in the release build on a
// loaded 2-core machine, far more in the sanitizer build, and the CI budget has no room for it.
// Until the split of test names at ';' was fixed it ran in no ctest run either.
TEST_CASE("SIGKILL during convert or quantize leaves no file, the old output stays whole",
          "[.][hostile][output][cli][slow]") {
    test::ScratchDir dir("out-sigkill");
    const fs::path hf = dir / "hf", ref = dir / "ref", work = dir / "work";
    // About 11M parameters: converting to f32 writes 45 MB, some hundreds of milliseconds.
    make_checkpoint(hf, 384, 1024, 6);
    fs::create_directories(ref);
    const std::vector<std::string> convert = {"convert", hf.string(), "--dtype", "f32", "-o"};
    auto with = [](std::vector<std::string> v, const fs::path& out) {
        v.push_back(out.string());
        return v;
    };
    auto run_to_end = [&](const std::vector<std::string>& args) {
        int status = 0;
        const pid_t pid = spawn_qforge(args);
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        REQUIRE(WIFEXITED(status));
        REQUIRE(WEXITSTATUS(status) == 0);
    };
    run_to_end(with(convert, ref / "c.qf"));
    const std::vector<std::string> quantize = {
        "quantize", (ref / "c.qf").string(), "--qtype", "q4_g32", "-t", "1", "-o"};
    run_to_end(with(quantize, ref / "q.qf"));
    const auto converted = test::read_file(ref / "c.qf"), quantized = test::read_file(ref / "q.qf");

    const std::vector<uint8_t> old_file(1000, 0x5a);
    for (const auto& old_bytes : {std::vector<uint8_t>{}, old_file}) {
        const auto c = interrupt_repeatedly(with(convert, work / "t.qf"), work / "t.qf", old_bytes,
                                            converted, SIGKILL);
        const auto qz = interrupt_repeatedly(with(quantize, work / "t.qf"), work / "t.qf",
                                             old_bytes, quantized, SIGKILL);
        // How many runs the kill caught mid-way (timing-dependent, so reported, not required).
        WARN("SIGKILL: convert killed " << c.killed << ", finished " << c.finished
                                        << "; quantize killed " << qz.killed << ", finished "
                                        << qz.finished);
        REQUIRE(c.killed + c.finished == 14);
    }
    // SIGINT, with O_TMPFILE and with the named fallback: the handler removes the temporary.
    for (const bool named : {false, true}) {
        if (named) ::setenv("QFORGE_NO_O_TMPFILE", "1", 1);
        interrupt_repeatedly(with(convert, work / "t.qf"), work / "t.qf", old_file, converted,
                             SIGINT);
        ::unsetenv("QFORGE_NO_O_TMPFILE");
    }
}

TEST_CASE("SIGINT during export leaves no temporary directory", "[hostile][output][cli][slow]") {
    test::ScratchDir dir("out-export-sigint");
    const fs::path hf = dir / "hf", ref = dir / "ref", work = dir / "work";
    make_checkpoint(hf, 384, 1024, 6);
    fs::create_directories(ref);
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"convert", hf.string(), "-o", (ref / "c.qf").string()},
             {"quantize", (ref / "c.qf").string(), "--qtype", "q4_g32", "--tensor-type",
              "^embed$=f16", "-o", (ref / "q.qf").string()}}) {
        int status = 0;
        const pid_t pid = spawn_qforge(args);
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    }
    const std::vector<std::string> args = {"export", (ref / "q.qf").string(), "--format", "gptq",
                                           "-o",     (work / "gptq").string()};
    for (const bool named : {false, true}) {
        if (named) ::setenv("QFORGE_NO_O_TMPFILE", "1", 1);
        for (const int delay_ms : {0, 5, 10, 20, 40, 60, 90, 130, 200, 300}) {
            INFO("SIGINT after " << delay_ms << " ms, named temporaries " << named);
            fs::remove_all(work);
            fs::create_directories(work);
            const int status = run_and_signal(args, SIGINT, delay_ms);
            const bool done = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            const auto names = names_in(work);
            INFO("left: " << names.size());
            // A signal that lands after the final rename (while the process tears down) finds
            // the directory already complete: the one outcome besides nothing at all.
            if (done || !names.empty()) {
                REQUIRE(names == std::vector<std::string>{"gptq"});
                REQUIRE(fs::exists(work / "gptq" / "config.json"));
                REQUIRE(fs::exists(work / "gptq" / "model.safetensors"));
            }
        }
        ::unsetenv("QFORGE_NO_O_TMPFILE");
    }
}

namespace {

// Sets TMPDIR for this process and the commands it starts; restores it when it goes.
struct TmpdirOverride {
    explicit TmpdirOverride(const fs::path& dir) {
        if (const char* old = std::getenv("TMPDIR")) saved = old;
        ::setenv("TMPDIR", dir.c_str(), 1);
    }
    ~TmpdirOverride() {
        if (saved.empty())
            ::unsetenv("TMPDIR");
        else
            ::setenv("TMPDIR", saved.c_str(), 1);
    }
    std::string saved;
};

}  // namespace

// A command given a checkpoint runs a temporary conversion (convert/qf_input): interrupted at
// any moment, before, during or after the conversion, it must leave the temporary directory as
// it found it.
TEST_CASE("SIGINT/SIGTERM during a command on a checkpoint removes its temporary conversion",
          "[hostile][output][cli]") {
    test::ScratchDir dir("out-qfinput-signal");
    const fs::path hf = dir / "hf", tmp = dir / "tmp";
    make_checkpoint(hf, 128, 256, 2);
    fs::create_directories(tmp);
    TmpdirOverride tmpdir(tmp);
    // Converting takes some milliseconds, the benchmark that follows some hundreds: the signals
    // land before, during and after the conversion.
    const std::vector<std::string> args = {"bench", hf.string(), "-p", "64", "-n",          "64",
                                           "-r",    "40",        "-t", "1",  "--bandwidth", "10"};
    int finished = 0;
    for (const int sig : {SIGINT, SIGTERM}) {
        for (const int delay_ms : {0, 5, 15, 30, 60, 100, 200, 400}) {
            INFO("signal " << sig << " after " << delay_ms << " ms");
            const int status = run_and_signal(args, sig, delay_ms);
            finished += WIFEXITED(status) && WEXITSTATUS(status) == 0;
            REQUIRE(names_in(tmp).empty());
        }
    }
    WARN("runs that finished before the signal: " << finished << " of 16");
}

// SIGKILL runs no handler: what it leaves, a later conversion removes once the process that made
// it is gone, and only then (a live process's file and a fresh one stay).
TEST_CASE("a conversion left by a killed process is removed by the next one",
          "[hostile][output][cli]") {
    test::ScratchDir dir("out-qfinput-stale");
    const fs::path hf = dir / "hf", tmp = dir / "tmp";
    make_checkpoint(hf, 128, 256, 1);
    fs::create_directories(tmp);
    const pid_t gone = ::fork();
    if (gone == 0) _exit(0);
    REQUIRE(gone > 0);
    REQUIRE(::waitpid(gone, nullptr, 0) == gone);
    const std::string dead = "qforge-" + std::to_string(gone) + "-0-old.qf";
    const std::string fresh = "qforge-" + std::to_string(gone) + "-1-fresh.qf";
    const std::string alive = "qforge-" + std::to_string(::getpid()) + "-0-alive.qf";
    const std::string other = "qforge-notes.qf";
    for (const auto& n : {dead, fresh, alive, other}) test::write_file(tmp / n, std::string("x"));
    const auto old = fs::file_time_type::clock::now() - std::chrono::minutes(5);
    for (const auto& n : {dead, alive, other}) fs::last_write_time(tmp / n, old);
    TmpdirOverride tmpdir(tmp);
    const auto r = test::run_qforge("bench " + q(hf) + " -p 4 -n 2 -r 1 -t 1 --bandwidth 10");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    std::vector<std::string> kept{alive, fresh, other};
    std::sort(kept.begin(), kept.end());
    REQUIRE(names_in(tmp) == kept);
}

}  // namespace output_safety_test
