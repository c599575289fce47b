#include "core/utc_time.h"

#include <chrono>
#include <cstdio>
#include <ctime>

namespace coverage {
namespace {

std::string Format(const char* format) {
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, format, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                tm.tm_sec, static_cast<int>(ms % 1000));
  return buf;
}

}  // namespace

std::string UtcNowIso8601Ms() { return Format("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ"); }
std::string UtcNowCompactMs() { return Format("%04d%02d%02dT%02d%02d%02d%03dZ"); }

}  // namespace coverage
