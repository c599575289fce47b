// Writing a file a user named with -o/--out (a report, an export), so that
// nothing but that file's contents can change:
//  * a regular file (or a path not there yet) is replaced atomically: the
//    text goes to a fresh temporary file beside it (created exclusively, so
//    a file or symlink planted at any name is never opened), which is then
//    renamed over the path; a failed write (a full disk) leaves the
//    previous file as it was and no temporary behind;
//  * a symlink is followed: the file it names is replaced, the link stays;
//  * anything else that exists (a character device such as /dev/stdout or
//    /dev/null, a FIFO, a socket) is written through, never replaced.
// Errors name the path and the system's reason.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace coverage {

Status WriteOutputFile(const std::string& path, std::string_view text);

}  // namespace coverage
