// Text for SVG and HTML: & < > " written as entities (attributes are double-quoted everywhere).
#pragma once

#include <string>
#include <string_view>

namespace lmscope {

inline std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace lmscope
