// The registry's schema as numbered migrations. Migration N brings a
// database from version N-1 to N; the version is SQLite's user_version.
// Never edit a migration that has shipped: add the next one.
#pragma once

#include <string_view>
#include <vector>

namespace coverage::registry {

struct Migration {
  int version;
  std::string_view description;
  std::string_view sql;
};

const std::vector<Migration>& Migrations();
int LatestSchemaVersion();

}  // namespace coverage::registry
