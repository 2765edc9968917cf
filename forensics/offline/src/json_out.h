// JsonOut: a small streaming JSON writer for reports (objects, arrays, numbers, strings, null).
// Internal to gpumem::forensics. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace gpumem::forensics::detail {

class JsonOut {
 public:
  JsonOut& obj() { sep(); out_ += '{'; first_.push_back(true); return *this; }
  JsonOut& end_obj() { out_ += '}'; first_.pop_back(); return *this; }
  JsonOut& arr() { sep(); out_ += '['; first_.push_back(true); return *this; }
  JsonOut& end_arr() { out_ += ']'; first_.pop_back(); return *this; }
  JsonOut& key(std::string_view k) { sep(); quote(k); out_ += ':'; after_key_ = true; return *this; }
  JsonOut& str(std::string_view s) { sep(); quote(s); return *this; }
  JsonOut& num(std::uint64_t v) { sep(); out_ += fmt::format("{}", v); return *this; }
  JsonOut& num(std::int64_t v) { sep(); out_ += fmt::format("{}", v); return *this; }
  JsonOut& num(int v) { return num(static_cast<std::int64_t>(v)); }
  JsonOut& num(std::size_t v, int) { return num(static_cast<std::uint64_t>(v)); }
  JsonOut& real(double v) { sep(); out_ += fmt::format("{:.6g}", v); return *this; }
  JsonOut& boolean(bool b) { sep(); out_ += b ? "true" : "false"; return *this; }
  JsonOut& null() { sep(); out_ += "null"; return *this; }
  std::string take() { return std::move(out_) + "\n"; }

 private:
  void sep() {
    if (after_key_) { after_key_ = false; return; }
    if (first_.empty()) return;
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
  void quote(std::string_view s) {
    out_ += '"';
    for (char c : s) {
      if (c == '"' || c == '\\') { out_ += '\\'; out_ += c; }
      else if (c == '\n') out_ += "\\n";
      else if (static_cast<unsigned char>(c) < 0x20) out_ += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      else out_ += c;
    }
    out_ += '"';
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace gpumem::forensics::detail
