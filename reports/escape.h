// Escaping of untrusted text (model ids, error messages, case summaries) for
// the formats reports write.
#pragma once

#include <string>
#include <string_view>

namespace coverage::reports {

std::string EscapeHtml(std::string_view text);  // & < > " ' (text and attribute values)
std::string EscapeXml(std::string_view text);   // XML 1.0: characters XML cannot hold shown as \xNN

}  // namespace coverage::reports
