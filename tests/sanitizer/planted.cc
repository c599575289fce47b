// Plants one sanitizer finding, named by the first argument, for
// tests/sanitizer/reports_test.sh: "ub" a signed overflow, "heap" a heap
// buffer overflow. Built only with COVERAGE_SANITIZE.
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  if (std::strcmp(argv[1], "ub") == 0) {
    volatile int big = INT_MAX;
    std::printf("%d\n", big + argc);
  } else if (std::strcmp(argv[1], "heap") == 0) {
    auto bytes = std::make_unique<char[]>(8);
    volatile int past = 8;
    bytes[past] = 1;
    std::printf("%d\n", bytes[0]);
  }
  return 0;
}
