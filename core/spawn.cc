#include "core/spawn.h"

#include <signal.h>

#include <initializer_list>

namespace coverage {

void InitChildSpawnAttributes(posix_spawnattr_t* attr) {
  posix_spawnattr_init(attr);
  sigset_t defaults, empty;
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP}) sigaddset(&defaults, s);
  sigemptyset(&empty);
  posix_spawnattr_setsigdefault(attr, &defaults);
  posix_spawnattr_setsigmask(attr, &empty);
  posix_spawnattr_setpgroup(attr, 0);
  posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
}

}  // namespace coverage
