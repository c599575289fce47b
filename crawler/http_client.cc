#include "crawler/http_client.h"

#include <cctype>

namespace coverage::crawler {

std::string HttpResponse::Header(const std::string& name) const {
  std::string lower;
  for (char c : name) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  auto it = headers.find(lower);
  return it == headers.end() ? std::string() : it->second;
}

}  // namespace coverage::crawler
