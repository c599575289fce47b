// Attributes of every child process coverage spawns (worker processes, the
// capture tracer): the signals the parent handles or ignores back at their
// default dispositions, an empty signal mask, and a process group of its
// own, so a terminal's Ctrl-C reaches only the parent, which then ends its
// children (Note [Worker processes] in isolation/worker.cc).
#pragma once

#include <spawn.h>

namespace coverage {

// Initialises `attr` (posix_spawnattr_init) and sets the above; the caller
// destroys it.
void InitChildSpawnAttributes(posix_spawnattr_t* attr);

}  // namespace coverage
