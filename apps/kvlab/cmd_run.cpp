// kvlab run FILE.json [--dry-run] [--results-dir DIR] [--force]: one file describes an experiment
// as ordered steps; each step runs as a child process of this binary,
//   /proc/self/exe [--threads N] <command> --config <step config written to a temp file>
// so every subcommand keeps one code path and validates its own keys.
//
// Run file (paths inside it are relative to the current directory, i.e. run from the repo root):
//   {"name": "balancekv_fig2", "paper_ref": "BalanceKV Fig. 2", "version": 1, "description": "...",
//    "steps": [{"command": "dump", "config": {...}}, {"command": "replay", "config": {...}}]}
// Unknown keys (top level and per step) are errors naming the key.
//
// Before anything runs, every step's config is checked by its own command (`--print-config`),
// which also yields the effective config with defaults filled in.
//
// Capture steps (dump, synth) are cached: after a successful run, "<out>.config.json" records the
// step's effective config and its sha256 (of the config JSON's compact dump), and the sha256 of the
// capture file itself. A later run skips the step (`--force` reruns it) only when the sidecar's
// config sha matches, the capture opens with its `complete` mark, and the capture's bytes still
// have the recorded digest: a truncated capture, or one replaced by another, is made again. The
// config sha does not cover the model file's or the binary's contents.
//
// SIGINT and SIGTERM are forwarded to the running step, and the run then stops with one line,
// removing its temporary folder (/tmp/kvlab-run-*).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "command.h"
#include "commands.h"
#include "kvlab/core/check.h"
#include "kvlab/core/progress.h"
#include "kvlab/core/report.h"
#include "kvlab/core/sha256.h"
#include "kvlab/io/capture.h"

namespace kvlab::cli {
namespace {

namespace fs = std::filesystem;

struct RunOptions {
  std::string file;
  bool dry_run = false;
  bool force = false;
  std::string results_dir;
  void fields(FieldList& f) {
    f.add("file", file, "experiment file (.json); paths inside it are relative to the current directory "
                        "(run from the repo root)").positional().required();
    f.add("dry_run", dry_run, "validate every step and print the commands without running them");
    f.add("force", force, "rerun capture steps (dump, synth) even when their sidecar config matches");
    f.add("results_dir", results_dir, "override 'results_dir' in every step whose command has that key");
  }
};

// Commands whose output file `out` is reused when its sidecar config matches.
const std::set<std::string> kCachedCommands = {"dump", "synth"};
const std::vector<std::string> kTopKeys = {"name", "paper_ref", "version", "description", "steps"};
const std::vector<std::string> kStepKeys = {"command", "config", "comment"};

struct Step {
  std::string command;
  nlohmann::json config;     // as written in the run file (+ overrides)
  nlohmann::json effective;  // the command's --print-config output
  std::string config_file;   // temp file holding `config`
};

void check_keys(const nlohmann::json& j, const std::vector<std::string>& allowed, const std::string& where) {
  KVLAB_CHECK(j.is_object(), "{}: expected a JSON object, found {}", where, j.type_name());
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end();
    if (known) continue;
    std::string near = closest_match(it.key(), allowed);
    KVLAB_FAIL("{}: unknown key '{}'{} (known: {})", where, it.key(),
               near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near), fmt::join(allowed, ", "));
  }
}

// argv[0] of child steps: this binary (exec'd through /proc/self/exe, see run_process).
const std::string kSelf = "kvlab";

// The step running now (0: none) and the first SIGINT/SIGTERM received (0: none). The handler
// only forwards the signal; the run stops once the step has exited.
volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_signal = 0;

extern "C" void forward_signal(int sig) {
  if (!g_signal) g_signal = sig;
  const pid_t child = static_cast<pid_t>(g_child);
  if (child > 0) kill(child, sig);
}

// Installs forward_signal for SIGINT and SIGTERM while alive; the previous handlers after.
struct SignalForwarding {
  struct sigaction old_int {}, old_term {};
  SignalForwarding() {
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~SignalForwarding() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
};

// Throws (so that the temporary folder is removed on the way out) once a signal has arrived.
void check_interrupted(const std::string& where) {
  const int sig = g_signal;
  KVLAB_CHECK(sig == 0, "interrupted by {} {}; stopped (temporary files removed)",
              sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : fmt::format("signal {}", sig), where);
}

// Runs argv; returns the exit status (128 + signal if killed). With `out`, captures stdout.
int run_process(const std::vector<std::string>& argv, std::string* out) {
  int fds[2] = {-1, -1};
  if (out) KVLAB_CHECK(pipe(fds) == 0, "pipe() failed");
  const pid_t parent = getpid();
  pid_t pid = fork();
  KVLAB_CHECK(pid >= 0, "fork() failed");
  if (pid == 0) {
    // The step dies with kvlab run, even when run is killed with -9 (no handler runs then), so a
    // killed run leaves no step writing behind it; the getppid check covers a parent that died
    // before prctl.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(128 + SIGTERM);
    if (out) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    // Exec the running binary's inode, not its path: a rebuild that replaces build/apps/kvlab
    // mid-run must not change (or break) the binary, and the git SHA, of later steps.
    execv(argv[0] == kSelf ? "/proc/self/exe" : args[0], args.data());
    _exit(127);
  }
  g_child = pid;
  if (g_signal) kill(pid, g_signal);  // arrived between fork and here
  if (out) {
    close(fds[1]);
    std::array<char, 4096> buf;
    ssize_t n;
    while ((n = read(fds[0], buf.data(), buf.size())) > 0) out->append(buf.data(), size_t(n));
    close(fds[0]);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    KVLAB_CHECK(errno == EINTR, "waitpid() failed");
  }
  g_child = 0;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string quote(const std::string& s) {
  if (s.find_first_of(" \t\"'$\\") == std::string::npos && !s.empty()) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + quote(a);
  return s;
}

// A step's command as argv words: "bench generate" is two.
std::vector<std::string> command_words(const std::string& command) {
  std::vector<std::string> words;
  std::istringstream in(command);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

std::string sidecar_path(const std::string& out) { return out + ".config.json"; }

// Capture steps replace their own output (the run re-makes it when its config changed): only a file
// an earlier run made, which its sidecar records. Any other file at `out` is left to the command,
// which refuses it unless the step's config says "overwrite" (as the command run directly does).
std::vector<std::string> step_argv(const std::string& exe, const Step& s) {
  std::vector<std::string> argv = {exe, "--threads", std::to_string(threads())};
  for (const auto& w : command_words(s.command)) argv.push_back(w);
  for (const auto& a : {std::string("--config"), s.config_file}) argv.push_back(a);
  if (kCachedCommands.count(s.command) && s.effective.contains("out") && s.effective["out"].is_string() &&
      fs::exists(sidecar_path(s.effective["out"].get<std::string>())))
    argv.push_back("--overwrite");
  return argv;
}
std::string config_sha(const nlohmann::json& effective) { return sha256_hex(effective.dump()); }

// Whether a capture step is done, decided from its output's own content: the sidecar records the
// same effective config, the capture opens and carries its `complete` mark, and its bytes have the
// digest recorded in the sidecar. `why` says what failed (empty: no sidecar or another config).
bool cached(const Step& s, std::string* why) {
  if (!kCachedCommands.count(s.command) || !s.effective.contains("out")) return false;
  const std::string out = s.effective["out"].get<std::string>();
  if (!fs::exists(out) || !fs::exists(sidecar_path(out))) return false;
  nlohmann::json side;
  try {
    side = read_json_file(sidecar_path(out));
  } catch (const Error&) {
    return false;
  }
  if (side.value("config_sha256", "") != config_sha(s.effective)) return false;
  try {
    CaptureReader check(out);  // structure and the `complete` mark
  } catch (const Error& e) {
    *why = fmt::format("{} is not a complete capture ({})", out, e.what());
    return false;
  }
  const std::string digest = sha256_file_hex(out);
  if (side.value("capture_sha256", "") != digest) {
    *why = fmt::format("{} is not the capture this config made (its sha256 {} differs from {}'s {})", out,
                       digest.substr(0, 12), sidecar_path(out),
                       side.value("capture_sha256", "(none)").substr(0, 12));
    return false;
  }
  return true;
}

struct TempDir {
  std::string path;
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/kvlab-run-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    KVLAB_CHECK(mkdtemp(buf.data()) != nullptr, "mkdtemp({}) failed", tmpl);
    path = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void run_run(const RunOptions& o, const nlohmann::json& /*effective*/) {
  const auto spec = read_json_file(o.file);
  check_keys(spec, kTopKeys, o.file);
  KVLAB_CHECK(spec.contains("steps") && spec["steps"].is_array() && !spec["steps"].empty(),
              "{}: 'steps' must be a non-empty array of {{\"command\": ..., \"config\": {{...}}}}", o.file);
  const std::string exe = kSelf;
  SignalForwarding forwarding;
  TempDir tmp;

  // 1. Parse and validate every step with its own command before running any: a child process
  // each (about 20 ms), so a long file shows progress, and one no experiment needs is refused
  // (issue 50: 200,000 steps ran silent for over an hour).
  std::vector<Step> steps;
  const auto& arr = spec["steps"];
  constexpr size_t kMaxSteps = 10000;
  KVLAB_CHECK(arr.size() <= kMaxSteps, "{}: {} steps, more than a run file may hold ({}); split it, or give a "
              "command a list (a sweep) or --shard", o.file, arr.size(), kMaxSteps);
  Progress checking("run: checking steps", int64_t(arr.size()), arr.size() >= 50);
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string where = fmt::format("{}: steps[{}]", o.file, i);
    check_keys(arr[i], kStepKeys, where);
    KVLAB_CHECK(arr[i].contains("command") && arr[i]["command"].is_string(),
                "{}: 'command' (a kvlab subcommand name) is required", where);
    Step s;
    s.command = arr[i]["command"].get<std::string>();
    KVLAB_CHECK(s.command != "run", "{}: a run file cannot run 'run'", where);
    s.config = arr[i].value("config", nlohmann::json::object());
    KVLAB_CHECK(s.config.is_object(), "{}: 'config' must be an object, found {}", where, s.config.type_name());
    s.config_file = fmt::format("{}/step{}_{}.json", tmp.path, i, fmt::join(command_words(s.command), "_"));
    write_json_atomic(s.config_file, s.config);
    std::string out;
    std::vector<std::string> probe = {exe};
    for (const auto& w : command_words(s.command)) probe.push_back(w);
    for (const char* a : {"--config", s.config_file.c_str(), "--print-config"}) probe.push_back(a);
    int rc = run_process(probe, &out);
    check_interrupted(fmt::format("while checking steps[{}]", i));
    KVLAB_CHECK(rc == 0, "{}: command '{}' rejected its config (exit {}; see the message above)", where, s.command,
                rc);
    try {
      s.effective = nlohmann::json::parse(out);
    } catch (const nlohmann::json::parse_error&) {
      KVLAB_FAIL("{}: '{}' is not a kvlab command with a config (its --print-config gave no JSON)", where,
                 s.command);
    }
    if (!o.results_dir.empty() && s.effective.contains("results_dir")) {
      s.config["results_dir"] = o.results_dir;
      s.effective["results_dir"] = o.results_dir;
      write_json_atomic(s.config_file, s.config);
    }
    steps.push_back(std::move(s));
    checking.advance(1);
  }

  checking.finish();
  fmt::print(stderr, "[run] {}: '{}'{} v{}, {} steps\n", o.file, spec.value("name", ""),
             spec.contains("paper_ref") ? " (" + spec["paper_ref"].get<std::string>() + ")" : "",
             spec.contains("version") ? spec["version"].dump() : "?", steps.size());

  // 2. Run them in order; stop at the first failure.
  const auto t_all = std::chrono::steady_clock::now();
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const auto argv = step_argv(exe, s);
    std::string why;
    const bool skip = !o.force && cached(s, &why);
    if (!skip && !why.empty() && !o.dry_run)
      fmt::print(stderr, "[run] step {} ({}): {}; running it again\n", i, s.command, why);
    if (o.dry_run) {
      fmt::print("# step {}: {}{}\n# config: {}\n{}\n", i, s.command,
                 skip ? " (skipped: output exists with the same config)" : "", s.config.dump(),
                 command_line(argv));
      continue;
    }
    if (skip) {
      fmt::print(stderr, "[run] step {} ({}): {} exists with the same config (sha256 in {}), skipped\n", i,
                 s.command, s.effective["out"].get<std::string>(),
                 sidecar_path(s.effective["out"].get<std::string>()));
      continue;
    }
    fmt::print(stderr, "[run] step {} ({}): {}\n", i, s.command, s.config.dump());
    const auto t0 = std::chrono::steady_clock::now();
    int rc = run_process(argv, nullptr);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check_interrupted(fmt::format("during steps[{}] ({}) after {:.1f} s; the signal was forwarded to it", i,
                                  s.command, sec));
    KVLAB_CHECK(rc == 0, "{}: steps[{}] ({}) failed with exit status {} after {:.1f} s", o.file, i, s.command, rc,
                sec);
    if (kCachedCommands.count(s.command) && s.effective.contains("out")) {
      const std::string out = s.effective["out"].get<std::string>();
      write_json_atomic(sidecar_path(out), {{"command", s.command},
                                            {"config", s.effective},
                                            {"config_sha256", config_sha(s.effective)},
                                            {"capture_sha256", sha256_file_hex(out)},
                                            {"run_file", o.file}});
    }
    fmt::print(stderr, "[run] step {} ({}) done in {:.1f} s\n", i, s.command, sec);
  }
  if (!o.dry_run)
    fmt::print(stderr, "[run] {} done in {:.1f} s\n", o.file,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t_all).count());
}

}  // namespace

void setup_run(CLI::App& app) {
  add_command<RunOptions>(app, "run",
                     "Run an experiment file: ordered steps {\"command\", \"config\"}, each as 'kvlab <command> --config <step "
                     "config>'. Paths in the file are relative to the current directory (run from the repo root)",
                     run_run);
}

}  // namespace kvlab::cli
