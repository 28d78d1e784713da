#include "kvlab/core/report.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kvlab/core/check.h"
#include "kvlab/core/config.h"
#include "kvlab/core/provenance.h"

namespace kvlab {

namespace {

// Writes all of `text` to the open descriptor `fd` and fsyncs it; returns 0 or the errno.
int write_all_and_sync(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENOSPC;
    done += static_cast<size_t>(n);
  }
  return ::fsync(fd) == 0 ? 0 : errno;
}

// fsync of a directory makes a rename in it durable; filesystems that cannot (EINVAL) are fine.
void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_text_atomic(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  KVLAB_CHECK(!ec, "cannot create the folder of '{}': {}", path, ec.message());
  const std::string tmp = path + ".partial";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KVLAB_CHECK(fd >= 0, "cannot write '{}': {}", tmp, std::strerror(errno));
  int err = write_all_and_sync(fd, text);
  if (::close(fd) != 0 && err == 0) err = errno;  // NFS and others may report a full disk only here
  if (err != 0) {
    fs::remove(tmp, ec);
    KVLAB_FAIL("cannot write '{}': {}{}; {}", path, std::strerror(err),
               err == ENOSPC || err == EDQUOT ? " (disk full)" : "",
               fs::exists(path, ec) ? "the previous file is unchanged" : "nothing was written");
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    KVLAB_FAIL("cannot rename '{}' to '{}': {}", tmp, path, ec.message());
  }
  sync_dir(p.parent_path().string());
}

bool remove_stale_partial(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string partial = path + ".partial";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(partial, ec))) return false;
  fs::remove(partial, ec);
  KVLAB_CHECK(!ec, "cannot remove '{}', left by an interrupted run: {}", partial, ec.message());
  return true;
}

void check_output_file(const std::string& path, const std::string& flag, const std::vector<std::string>& inputs,
                       bool overwrite) {
  namespace fs = std::filesystem;
  KVLAB_CHECK(!path.empty(), "{} is required", flag);
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  for (const auto& in : inputs) {
    if (in.empty() || !fs::exists(in, ec)) continue;
    if (fs::is_directory(in, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(in, ec))
        KVLAB_CHECK(!fs::equivalent(e.path(), path, ec), "{} {}: is {}, an input of this command; refusing to write "
                    "over it", flag, path, e.path().string());
    } else {
      KVLAB_CHECK(!fs::equivalent(in, path, ec), "{} {}: is an input of this command ({}); refusing to write over it",
                  flag, path, in);
    }
  }
  KVLAB_CHECK(fs::is_regular_file(path, ec), "{} {}: exists and is not a regular file; refusing to write over it",
              flag, path);
  KVLAB_CHECK(overwrite, "{} {}: exists; pass --overwrite to replace it", flag, path);
}

void write_json_atomic(const std::string& path, const nlohmann::json& j) {
  write_text_atomic(path, j.dump(2) + "\n");
}

namespace {

// The pid a lock file holds (what its writer wrote, trailing space dropped), or "".
std::string lock_holder(int fd) {
  std::string holder;
  std::array<char, 64> buf;
  for (ssize_t n; (n = ::pread(fd, buf.data(), buf.size(), off_t(holder.size()))) > 0;) holder.append(buf.data(), size_t(n));
  while (!holder.empty() && std::isspace(static_cast<unsigned char>(holder.back()))) holder.pop_back();
  return holder;
}

// Whether a run folder holds no result yet: nothing but config.json, the lock, a result.json
// without rows, the samples under data/ (made again from the config) and empty files.
bool holds_no_results(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path rel = fs::relative(it->path(), dir, ec);
    const std::string top = rel.begin() == rel.end() ? std::string() : rel.begin()->string();
    if (it->is_directory(ec) || top == "data" || rel == "config.json" || rel == ".kvlab.lock") continue;
    if (it->is_regular_file(ec) && it->file_size(ec) == 0) continue;
    if (rel == "result.json") {
      try {
        const auto j = nlohmann::json::parse(std::ifstream(it->path()));
        if (j.value("rows", nlohmann::json::array()).empty() && !j.contains("rows_file")) continue;
      } catch (const std::exception&) {
      }
    }
    return false;
  }
  return !ec;
}

// flock(2) on <dir>/.kvlab.lock; see RunDir.
std::shared_ptr<int> lock_run_dir(const std::string& dir) {
  const std::string path = dir + "/.kvlab.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  KVLAB_CHECK(fd >= 0, "--out {}: cannot open its lock file {}: {}", dir, path, std::strerror(errno));
  const std::string holder = lock_holder(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    KVLAB_CHECK(err != EWOULDBLOCK, "--out {}: another kvlab run (pid {}) is writing there; wait for it to finish or "
                "choose another --out", dir, holder.empty() ? std::string("unknown") : holder);
    KVLAB_FAIL("--out {}: cannot lock {}: {}", dir, path, std::strerror(err));
  }
  if (!holder.empty())
    fmt::print(stderr, "[kvlab] --out {}: the run of pid {} that wrote there did not finish (killed?); taking over\n",
               dir, holder);
  const std::string pid = fmt::format("{}\n", ::getpid());
  KVLAB_CHECK(::ftruncate(fd, 0) == 0 && ::pwrite(fd, pid.data(), pid.size(), 0) == ssize_t(pid.size()),
              "--out {}: cannot write its lock file {}: {}", dir, path, std::strerror(errno));
  return std::shared_ptr<int>(new int(fd), [](int* p) {
    if (::ftruncate(*p, 0) != 0) {}  // finished: no pid left behind
    ::close(*p);
    delete p;
  });
}

}  // namespace

bool same_run_config(nlohmann::json a, nlohmann::json b) {
  if (!a.is_object() || !b.is_object()) return a == b;
  // Keys that say how a run goes, not what it computes (no_batch: the same outputs either way).
  for (auto* j : {&a, &b})
    for (const char* k : {"overwrite", "quiet", "out", "no_batch"}) j->erase(k);
  // A key a later kvlab added to a command's config is absent from one written before it: the two
  // are the same config when the key holds the value that computes what runs before it computed.
  static const std::pair<const char*, nlohmann::json> kAddedLater[] = {
      {"ratio_of", "prompt"}, {"layer_error", false}, {"weights", "fp32"}};
  for (const auto& [k, before] : kAddedLater) {
    if (!a.contains(k) && b.contains(k) && b[k] == before) b.erase(k);
    if (!b.contains(k) && a.contains(k) && a[k] == before) a.erase(k);
  }
  return a == b;
}

std::string run_dir_writer(const std::string& dir) {
  const std::string path = dir + "/.kvlab.lock";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";  // no lock file: no kvlab run ever wrote there
  std::string holder;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    holder = lock_holder(fd);
    if (holder.empty()) holder = "unknown";
  }
  ::close(fd);  // drops the shared lock if it was taken
  return holder;
}

RunDir::RunDir(const std::string& base, const std::string& experiment, const nlohmann::json& config,
               bool exact, bool overwrite) {
  namespace fs = std::filesystem;
  if (exact) {
    path_ = base;
  } else {
    std::string sha = git_sha().substr(0, 7);
    path_ = fmt::format("{}/{}/{}_{}{}", base, experiment, utc_stamp(), sha, git_dirty() ? "-dirty" : "");
  }
  std::error_code ec;
  if (exact && fs::exists(path_, ec)) {
    // A folder kvlab did not make (no config.json) is the user's: never written into unasked.
    KVLAB_CHECK(fs::is_directory(path_, ec), "--out {}: exists and is not a folder; refusing to write there", path_);
    const bool ours = fs::exists(path_ + "/config.json", ec);
    const bool empty = fs::directory_iterator(path_, ec) == fs::directory_iterator();
    KVLAB_CHECK(ours || empty || overwrite, "--out {}: holds files kvlab did not make (no config.json); choose a new "
                "or empty folder, or pass --overwrite to write into it", path_);
  }
  if (exact && fs::exists(path_ + "/config.json") && !overwrite) {
    // A folder of earlier results is never replaced by a run of another config (same_run_config).
    nlohmann::json earlier;
    try {
      earlier = nlohmann::json::parse(std::ifstream(path_ + "/config.json"));
    } catch (const std::exception&) {
    }
    KVLAB_CHECK(same_run_config(earlier, config), "--out {}: holds the results of another config ({}/config.json differs); "
                "choose another --out, or pass --overwrite to replace them", path_, path_);
  }
  // A folder this run makes (or finds empty) and leaves by an error before any result is in it is
  // removed, so that the corrected command is not refused as another config's (issue 50).
  const bool existed = fs::exists(path_, ec);
  const bool fresh = !existed || fs::directory_iterator(path_, ec) == fs::directory_iterator();
  fs::create_directories(path_, ec);
  KVLAB_CHECK(!ec, "cannot create results directory '{}': {}", path_, ec.message());
  lock_ = lock_run_dir(path_);
  if (fresh) {
    const int unwinding = std::uncaught_exceptions();
    const std::string dir = path_;
    std::shared_ptr<int> lock = lock_;
    lock_ = std::shared_ptr<int>(lock.get(), [lock, dir, unwinding, existed](int*) mutable {
      const bool failed = std::uncaught_exceptions() > unwinding;
      if (failed && holds_no_results(dir)) {  // as it was found: absent, or an empty folder
        std::error_code e;
        if (!existed) fs::remove_all(dir, e);
        else
          for (const auto& entry : fs::directory_iterator(dir, e)) fs::remove_all(entry.path(), e);
      }
      lock.reset();
    });
  }
  write_json_atomic(file("config.json"), config);
}

RunDir open_run_dir(const std::string& out, const std::string& results_dir, const std::string& name,
                    const nlohmann::json& config, bool overwrite) {
  return RunDir(out.empty() ? results_dir : out, name, config, /*exact=*/!out.empty(), overwrite);
}

std::string result_json_text(const nlohmann::json& j) {
  std::string text = "{";
  for (auto it = j.begin(); it != j.end(); ++it) {
    text += (it == j.begin() ? "\n  " : ",\n  ") + nlohmann::json(it.key()).dump() + ": ";
    if (it.key() == "rows" && it->is_array() && !it->empty()) {
      text += "[";
      for (size_t i = 0; i < it->size(); ++i) text += (i ? ",\n    " : "\n    ") + (*it)[i].dump();
      text += "\n  ]";
    } else {
      // Nested lines one level in; a newline inside a string is escaped, so every '\n' is layout.
      std::string value = it->dump(2);
      for (size_t p = 0; (p = value.find('\n', p)) != std::string::npos; p += 3) value.replace(p, 1, "\n  ");
      text += value;
    }
  }
  return text + (j.empty() ? "}\n" : "\n}\n");
}

void RunDir::write_result(const nlohmann::json& context, const nlohmann::json& rows,
                          const nlohmann::json& extra) const {
  nlohmann::json j = {{"context", context}, {"rows", rows}};
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  write_text_atomic(file("result.json"), result_json_text(j));
}

void RunDir::write_result_and_rows(const nlohmann::json& context, const nlohmann::json& rows,
                                   const std::string& rows_file, nlohmann::json extra) const {
  std::string text;
  for (const auto& r : rows) text += r.dump() + "\n";
  write_text_atomic(file(rows_file), text);
  extra["rows_file"] = rows_file;
  extra["n_rows"] = rows.size();
  write_result(context, nlohmann::json::array(), extra);
}

nlohmann::json read_result_rows(const nlohmann::json& result, const std::string& path) {
  if (!result.contains("rows_file")) return result.value("rows", nlohmann::json::array());
  const std::string rows_path =
      (std::filesystem::path(path).parent_path() / result["rows_file"].get<std::string>()).string();
  const size_t n_rows = result.value("n_rows", size_t(0));
  std::ifstream in(rows_path);
  KVLAB_CHECK(in.good(), "{}: names its rows file {} ({} rows), which is missing (replay's rows.jsonl is "
              "git-ignored: run the command again to make it)", path, rows_path, n_rows);
  nlohmann::json rows = nlohmann::json::array();
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    try {
      rows.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::parse_error& e) {
      KVLAB_FAIL("{}:{}: not a JSON row ({})", rows_path, line_no, e.what());
    }
  }
  KVLAB_CHECK(rows.size() == n_rows, "{}: holds {} rows but {} says {} (\"n_rows\")", rows_path, rows.size(), path,
              n_rows);
  return rows;
}

nlohmann::json read_result_rows(const std::string& path) { return read_result_rows(read_json_file(path), path); }

namespace {
std::string cell(const nlohmann::json& v, int precision) {
  if (v.is_null()) return "";
  if (v.is_number_float()) return fmt::format("{:.{}g}", v.get<double>(), precision);
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}
}  // namespace

std::string render_table(const nlohmann::json& rows, const std::vector<std::string>& columns,
                         int precision) {
  std::vector<size_t> width(columns.size());
  std::vector<std::vector<std::string>> cells;
  for (size_t c = 0; c < columns.size(); ++c) width[c] = columns[c].size();
  for (const auto& r : rows) {
    std::vector<std::string> line;
    for (size_t c = 0; c < columns.size(); ++c) {
      line.push_back(r.contains(columns[c]) ? cell(r[columns[c]], precision) : "");
      width[c] = std::max(width[c], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  std::string out;
  for (size_t c = 0; c < columns.size(); ++c) out += fmt::format("{:<{}}  ", columns[c], width[c]);
  out += "\n";
  for (const auto& line : cells) {
    for (size_t c = 0; c < columns.size(); ++c) out += fmt::format("{:<{}}  ", line[c], width[c]);
    out += "\n";
  }
  return out;
}

std::string render_csv(const nlohmann::json& rows, const std::vector<std::string>& columns) {
  auto quote = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  std::string out = fmt::format("{}\n", fmt::join(columns, ","));
  for (const auto& r : rows) {
    std::vector<std::string> line;
    for (const auto& c : columns) line.push_back(quote(r.contains(c) ? cell(r[c], 10) : ""));
    out += fmt::format("{}\n", fmt::join(line, ","));
  }
  return out;
}

}  // namespace kvlab
