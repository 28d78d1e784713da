#include "kvlab/core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace kvlab {

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled), tty_(::isatty(2) != 0),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void Progress::advance(int64_t by, const std::string& note) {
  done_ += by;
  if (enabled_) draw(note);
}

void Progress::skip(int64_t by, const std::string& note) {
  skipped_ += by;
  advance(by, note);
}

void Progress::draw(const std::string& note) {
  using namespace std::chrono;
  auto now = steady_clock::now();
  double elapsed = duration<double>(now - start_).count();
  double frac = total_ > 0 ? static_cast<double>(done_) / total_ : 1.0;
  // Rate from the work done in this run only: a resumed run's earlier records took no time here.
  const int64_t worked = done_ - skipped_;
  double eta = worked > 0 ? elapsed * static_cast<double>(total_ - done_) / static_cast<double>(worked) : 0;
  if (tty_) {
    if (done_ < total_ && now - last_draw_ < milliseconds(100)) return;
    last_draw_ = now;
    int width = 30, fill = static_cast<int>(frac * width);
    fmt::print(stderr, "\r{} [{}{}] {}/{} {:.0f}s eta {:.0f}s {}\x1b[K", label_, std::string(fill, '#'),
               std::string(width - fill, '.'), done_, total_, elapsed, eta, note);
  } else {
    int decile = static_cast<int>(frac * 10);
    if (decile == last_decile_) return;
    last_decile_ = decile;
    fmt::print(stderr, "{}: {}/{} ({:.0f}%) {:.1f}s eta {:.0f}s {}\n", label_, done_, total_, frac * 100, elapsed,
               eta, note);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && tty_) fmt::print(stderr, "\n");
}

Progress::~Progress() { finish(); }

}  // namespace kvlab
