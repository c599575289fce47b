#include "apps/flags.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "backends/host.h"
#include "core/text_safety.h"

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

CLI::Validator SeedCheck() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0])) || end != s.data() + s.size()) {
          return "'" + TerminalSafe(s, 40) + "' is not a whole number in [0, 2^64 - 1]";
        }
        if (ec == std::errc::result_out_of_range) return s + " is over 2^64 - 1";
        return std::string();
      },
      "UINT64");
}

CLI::Validator DeviceNameCheck() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const bool shaped = !s.empty() && s.size() <= 32 && std::islower(static_cast<unsigned char>(s[0])) &&
                            std::all_of(s.begin(), s.end(), [](char c) {
                              return std::islower(static_cast<unsigned char>(c)) ||
                                     std::isdigit(static_cast<unsigned char>(c)) || c == '_';
                            });
        if (!shaped) {
          return "'" + TerminalSafe(s, 40) + "' is not a device name: lower-case letters, digits and '_', starting "
                 "with a letter, at most 32 (e.g. neuron)";
        }
        // PyTorch's own device types cannot be a PrivateUse1 device's name.
        for (const char* taken : {"cpu", "cuda", "mps", "xpu", "meta", "hip", "xla", "lazy", "mtia", "hpu", "ve",
                                  "ipu", "vulkan", "metal", "fpga", "maia", "mkldnn", "opengl", "opencl", "ideep",
                                  "ort", "privateuseone"}) {
          if (s == taken) return "'" + s + "' is PyTorch's own device type; give the plugin's device a name of its own";
        }
        return std::string();
      },
      "NAME");
}

CLI::Validator ThreadCount() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        const int cores = backends::AvailableCores();
        if (end == s.c_str() || *end != '\0' || errno == ERANGE) return "'" + s + "' is not a whole number";
        if (v < 0 || v > cores) {
          return fmt::format("{} is outside [0, {}]: 0 means one thread per core, and this process may run on {} "
                             "cores",
                             s, cores, cores);
        }
        return std::string();
      },
      "INT in [0, cores]");
}

CLI::Validator RunIdCheck() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        Status ok = CheckRunId(s, "");
        return ok.ok() ? std::string() : ok.message();
      },
      "RUN_ID");
}

double PhysicalMemoryGb() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) / 1e9 : 8.0;
}

}  // namespace coverage::apps
