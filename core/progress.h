// Progress: a one-line progress display for long work. On a terminal it
// redraws one line on stderr (at most 10 times a second); otherwise it prints
// a plain line every `log_every_s` seconds, so CI logs stay short.
//
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace coverage {

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true, double log_every_s = 10.0);
  ~Progress();
  // `done` units of `total` finished; `note` is shown after the counter.
  // With total <= 0 (unknown) only the elapsed time and the note are shown.
  // `work_done`, when in (0, 1], is the share of the work finished where
  // units differ in cost (the unit stage runs its largest cases first); the
  // estimate of the time left follows it instead of done / total.
  void Update(int64_t done, const std::string& note = "", double work_done = -1);
  // Clears the line (terminal) and stops drawing.
  void Finish();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool tty_;
  double log_every_s_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace coverage
