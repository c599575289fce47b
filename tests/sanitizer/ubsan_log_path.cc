// Linked into every target of a COVERAGE_SANITIZE build (Note [Sanitizers]
// in CMakeLists.txt): makes UBSan honour log_path in UBSAN_OPTIONS.
//
// With GCC, UBSan beside ASan is libubsan.so next to libasan.so, each with
// its own copy of the sanitizer runtime's report file. libubsan applies its
// log_path by calling __sanitizer_set_report_path, an exported symbol that
// libasan (first in the library list) interposes, so libubsan's own reports
// would still go to stderr, which workers, death tests and the CLI tests
// capture or discard. This calls libubsan's own definition once per process,
// after libubsan has initialised (its constructors run before ours).
#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace {

__attribute__((constructor)) void RouteUndefinedBehaviorReportsToLogPath() {
  const char* options = std::getenv("UBSAN_OPTIONS");
  if (options == nullptr) return;
  const std::string s = options;
  size_t at = s.find("log_path=");
  while (at != std::string::npos && at > 0 && s[at - 1] != ':' && s[at - 1] != ' ') at = s.find("log_path=", at + 1);
  if (at == std::string::npos) return;
  const size_t begin = at + 9;
  const std::string path = s.substr(begin, s.find_first_of(": ", begin) - begin);
  void* ubsan = dlopen("libubsan.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (ubsan == nullptr) return;
  if (auto set = reinterpret_cast<void (*)(const char*)>(dlsym(ubsan, "__sanitizer_set_report_path"))) {
    set(path.c_str());
  }
  dlclose(ubsan);
}

}  // namespace
