// COV_CHECK: aborts on a broken invariant (a bug in coverage), like
// TORCH_INTERNAL_ASSERT. Never use it for user input: bad input gets a Status.
#pragma once

#include <cstdio>
#include <cstdlib>

#define COV_CHECK(cond, msg)                                                        \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: internal check failed: %s (%s)\n", __FILE__,     \
                   __LINE__, #cond, msg);                                           \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)
