// A "plugin" whose static constructor never returns, like a device library
// that waits forever for hardware at load time. `--backend
// privateuse1:<this .so>` hangs in dlopen inside the worker; the CLI test
// presses Ctrl-C there (issue: the start waited 300 s and exited 2).
#include <unistd.h>

namespace {

__attribute__((constructor)) void WaitForeverForTheDevice() {
  for (;;) pause();
}

}  // namespace
