#include "apps/flags.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace coverage::apps {

CLI::Validator FiniteRange(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0' || !std::isfinite(v)) return "'" + s + "' is not a finite number";
        if (v < lo || v > hi) return fmt::format("{} is outside [{}, {}]", s, lo, hi);
        return std::string();
      },
      fmt::format("NUMBER in [{}, {}]", lo, hi));
}

double PhysicalMemoryGb() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) / 1e9 : 8.0;
}

}  // namespace coverage::apps
