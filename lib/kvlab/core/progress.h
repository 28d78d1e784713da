// Progress on stderr for long runs: a bar that redraws in place on a terminal, one line per
// ~10% otherwise (logs stay readable).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kvlab {

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true);
  void advance(int64_t by = 1, const std::string& note = "");
  // Work found done by an earlier run (resume): counted in the bar, left out of the ETA's rate.
  void skip(int64_t by = 1, const std::string& note = "");
  void finish();
  ~Progress();

 private:
  void draw(const std::string& note);
  std::string label_;
  int64_t total_, done_ = 0, skipped_ = 0;
  bool enabled_, tty_, finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace kvlab
