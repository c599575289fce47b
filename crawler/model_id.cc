#include "crawler/model_id.h"

#include <string>

namespace coverage::crawler {
namespace {

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Printable and short, so a hostile id cannot flood a log line.
std::string Shown(std::string_view id) {
  std::string out;
  for (char c : id.substr(0, 120)) {
    const unsigned char u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? std::string(1, c) : "?";
  }
  if (id.size() > 120) out += "...";
  return "'" + out + "'";
}

Status CheckPart(std::string_view id, std::string_view part, const char* what) {
  if (part.empty()) return Status::InvalidArgument("model id " + Shown(id) + ": empty " + what);
  for (char c : part) {
    if (!IsWordChar(c) && c != '-' && c != '.') {
      return Status::InvalidArgument("model id " + Shown(id) + ": " + what +
                                     " may only hold letters, digits, '_', '-' and '.'");
    }
  }
  if (!IsWordChar(part.front()) || !IsWordChar(part.back())) {
    return Status::InvalidArgument("model id " + Shown(id) + ": " + what +
                                   " must start and end with a letter, digit or '_'");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateModelId(std::string_view id) {
  if (id.empty()) return Status::InvalidArgument("model id is empty");
  const size_t slash = id.find('/');
  if (slash != std::string_view::npos && id.find('/', slash + 1) != std::string_view::npos) {
    return Status::InvalidArgument("model id " + Shown(id) + ": more than one '/'");
  }
  if (id.find("--") != std::string_view::npos || id.find("..") != std::string_view::npos) {
    return Status::InvalidArgument("model id " + Shown(id) + ": '--' and '..' are not allowed");
  }
  if (id.size() >= 4 && id.substr(id.size() - 4) == ".git") {
    return Status::InvalidArgument("model id " + Shown(id) + ": must not end with '.git'");
  }
  const std::string_view name = slash == std::string_view::npos ? id : id.substr(slash + 1);
  if (slash != std::string_view::npos) COV_RETURN_IF_ERROR(CheckPart(id, id.substr(0, slash), "namespace"));
  COV_RETURN_IF_ERROR(CheckPart(id, name, "name"));
  if (name.size() > 96) {
    return Status::InvalidArgument("model id " + Shown(id) + ": name is " + std::to_string(name.size()) +
                                   " characters, more than 96");
  }
  return Status::Ok();
}

}  // namespace coverage::crawler
