#include "stages/shard.h"

#include <charconv>

#include <fmt/format.h>

#include "core/hash.h"

namespace coverage::stages {
namespace {

std::optional<long long> ParseInt(std::string_view s) {
  long long v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

Result<Shard> Make(long long index, long long count, const std::string& source) {
  if (count < 1 || count > 1000000) {
    return Status::InvalidArgument(fmt::format("{}: the shard count must be between 1 and 1000000, got {}", source, count));
  }
  if (index < 0 || index >= count) {
    return Status::InvalidArgument(
        fmt::format("{}: shard index {} is outside 0..{} (indices start at 0)", source, index, count - 1));
  }
  return Shard{static_cast<int>(index), static_cast<int>(count)};
}

}  // namespace

std::string Shard::ToString() const { return fmt::format("{}/{}", index, count); }

bool Shard::Contains(std::string_view key) const {
  if (count <= 1) return true;
  return Mix64(Fnv1a64(key)) % static_cast<uint64_t>(count) == static_cast<uint64_t>(index);
}

Result<Shard> ParseShard(std::string_view text) {
  const size_t slash = text.find('/');
  auto i = slash == std::string_view::npos ? std::nullopt : ParseInt(text.substr(0, slash));
  auto n = slash == std::string_view::npos ? std::nullopt : ParseInt(text.substr(slash + 1));
  if (!i || !n) {
    return Status::InvalidArgument("--shard '" + std::string(text) + "' is not of the form i/N (e.g. 0/4)");
  }
  return Make(*i, *n, "--shard " + std::string(text));
}

Result<std::optional<Shard>> ShardFromEnvironment(const std::function<const char*(const char*)>& getenv,
                                                  bool engines) {
  auto get = [&](const char* name) -> std::optional<std::string> {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
  auto number = [&](const char* name, const std::string& value) -> Result<long long> {
    auto v = ParseInt(value);
    if (!v) return Status::InvalidArgument(fmt::format("{}='{}' is not an integer", name, value));
    return *v;
  };
  struct Pair {
    const char* index;
    const char* count;
    const char* offset;  // subtracted from the index, when set
    const char* step;    // the index is divided by it, when set
    bool engine;
  };
  for (const Pair& p : {Pair{"COVERAGE_SHARD_INDEX", "COVERAGE_TOTAL_SHARDS", nullptr, nullptr, false},
                        Pair{"JOB_COMPLETION_INDEX", "COVERAGE_TOTAL_SHARDS", nullptr, nullptr, true},
                        Pair{"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
                             "SLURM_ARRAY_TASK_STEP", true}}) {
    if (p.engine && !engines) continue;
    auto index_text = get(p.index);
    if (!index_text) continue;
    auto count_text = get(p.count);
    if (!count_text) {
      return Status::InvalidArgument(fmt::format("{} is set but {} is not: set it to the number of shards", p.index,
                                                 p.count));
    }
    COV_ASSIGN_OR_RETURN(long long index, number(p.index, *index_text));
    COV_ASSIGN_OR_RETURN(long long count, number(p.count, *count_text));
    if (p.offset) {
      if (auto min = get(p.offset)) {
        COV_ASSIGN_OR_RETURN(long long m, number(p.offset, *min));
        index -= m;
      }
    }
    if (p.step) {
      if (auto step_text = get(p.step)) {
        COV_ASSIGN_OR_RETURN(long long step, number(p.step, *step_text));
        if (step < 1 || index % step != 0) {
          return Status::InvalidArgument(fmt::format("{}={} does not fit {}={}", p.index, *index_text, p.step,
                                                     *step_text));
        }
        index /= step;
      }
    }
    COV_ASSIGN_OR_RETURN(Shard s, Make(index, count, fmt::format("{}={} {}={}", p.index, *index_text, p.count,
                                                                 *count_text)));
    return std::optional<Shard>(s);
  }
  return std::optional<Shard>();
}

}  // namespace coverage::stages
