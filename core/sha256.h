// SHA-256 (FIPS 180-4) of a byte string, as lower-case hex. Used for stable
// case keys; not for anything security-relevant.
#pragma once

#include <string>
#include <string_view>

namespace coverage {

std::string Sha256Hex(std::string_view data);

}  // namespace coverage
