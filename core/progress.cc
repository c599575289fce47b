#include "core/progress.h"
#include "core/text_safety.h"

#include <unistd.h>

#include <cstdio>

namespace coverage {

Progress::Progress(std::string label, int64_t total, bool enabled, double log_every_s)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled),
      tty_(isatty(STDERR_FILENO) != 0),
      log_every_s_(log_every_s),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

Progress::~Progress() { Finish(); }

void Progress::Update(int64_t done, const std::string& note, double work_done) {
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  const bool known_total = total_ > 0;
  const bool last_one = known_total && done >= total_;
  if (tty_ ? (since_last < 0.1 && !last_one) : (since_last < log_every_s_ && !last_one)) return;
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const std::string shown = TerminalSafe(note, 57);  // Note [Terminal-safe text]: model ids come from the Hub
  std::string counter;
  if (known_total) {
    const double pct = 100.0 * static_cast<double>(done) / static_cast<double>(total_);
    double eta = 0;
    if (work_done > 0 && work_done <= 1) {
      eta = elapsed * (1 - work_done) / work_done;
    } else if (done > 0 && total_ > done) {
      eta = elapsed / static_cast<double>(done) * static_cast<double>(total_ - done);
    }
    char buf[128];
    std::snprintf(buf, sizeof(buf), "[%lld/%lld %3.0f%%] %.0fs elapsed, ~%.0fs left", static_cast<long long>(done),
                  static_cast<long long>(total_), pct, elapsed, eta);
    counter = buf;
  } else {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.0fs elapsed", elapsed);  // total unknown: the note carries the counts
    counter = buf;
  }
  std::fprintf(stderr, tty_ ? "\r\033[K%s %s  %s" : "%s %s  %s\n", label_.c_str(), counter.c_str(), shown.c_str());
  std::fflush(stderr);
}

void Progress::Finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
}

}  // namespace coverage
