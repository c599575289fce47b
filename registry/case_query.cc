#include "registry/case_query.h"

#include <cctype>
#include <charconv>

namespace coverage::registry {
namespace {

bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

Result<int64_t> ParseInt(std::string_view s, std::string_view whole, std::string_view what) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) {
    return Status::InvalidArgument("--dim '" + std::string(whole) + "': " + std::string(what) + " '" +
                                   std::string(s) + "' is not an integer");
  }
  return v;
}

}  // namespace

std::string NormaliseOpName(std::string_view op) {
  if (op.find("::") != std::string_view::npos) return std::string(op);
  return "aten::" + std::string(op);
}

Result<DimPredicate> ParseDimPredicate(std::string_view text) {
  const std::string whole(text);
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--dim '" + whole + "': " + why +
                                   " (expected ARG[IDX] OP N or ARG.rank OP N, e.g. 'self[-1]>=4096')");
  };
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  }
  DimPredicate d;
  d.text = whole;
  size_t i = 0;
  if (i < s.size() && s[i] == '*') {
    d.arg = "*";
    ++i;
  } else {
    while (i < s.size() && IsIdentChar(s[i])) d.arg.push_back(s[i++]);
    if (d.arg.empty()) return bad("missing argument name");
  }
  if (i < s.size() && s[i] == '[') {
    size_t close = s.find(']', i);
    if (close == std::string::npos) return bad("missing ']'");
    COV_ASSIGN_OR_RETURN(int64_t idx, ParseInt(std::string_view(s).substr(i + 1, close - i - 1), whole, "index"));
    d.index = idx;
    i = close + 1;
  } else if (s.compare(i, 5, ".rank") == 0) {
    i += 5;
  } else {
    return bad("expected '[' or '.rank' after the argument name");
  }
  static constexpr std::string_view kOps[] = {"==", "!=", "<=", ">=", "<", ">"};
  for (std::string_view op : kOps) {
    if (s.compare(i, op.size(), op) == 0) {
      d.op = op == "==" ? "=" : std::string(op);
      i += op.size();
      break;
    }
  }
  if (d.op.empty()) return bad("expected one of == != < <= > >=");
  COV_ASSIGN_OR_RETURN(d.value, ParseInt(std::string_view(s).substr(i), whole, "value"));
  return d;
}

}  // namespace coverage::registry
