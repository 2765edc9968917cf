#include "json_reader.h"

#include <charconv>
#include <cstdlib>
#include <unordered_map>

#include <fmt/format.h>

#include "gpumem/forensics/error.h"
#include "pickle_tree.h"

namespace gpumem::forensics::detail {
namespace {

// Values the parser may build per record the limits allow (as the pickle reader).
constexpr std::uint64_t kValuesPerRecord = 8;

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& source, const ReadLimits& limits)
      : t_(text), source_(source), limits_(limits) {
    const std::uint64_t budget = limits.max_records * kValuesPerRecord;
    value_budget_ = budget / kValuesPerRecord == limits.max_records ? budget : ~std::uint64_t{0};
  }

  PickleValue document() {
    PickleValue v = value(0);
    skip_ws();
    if (p_ != t_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < p_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') { ++line; col = 1; } else { ++col; }
    }
    throw ForensicsError(fmt::format("{}: line {}, column {}: {}; the file is not valid JSON (write snapshots "
                                     "with gpumem or torch.cuda.memory._dump_snapshot)",
                                     source_, line, col, what));
  }
  void skip_ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\n' || t_[p_] == '\r' || t_[p_] == '\t')) ++p_;
  }
  char peek() {
    skip_ws();
    if (p_ >= t_.size()) fail("the text ends early");
    return t_[p_];
  }
  void expect(char c) {
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++p_;
  }
  bool literal(std::string_view word) {
    if (t_.substr(p_, word.size()) == word) { p_ += word.size(); return true; }
    return false;
  }

  PickleValue value(int depth) {
    if (depth >= kMaxNestingDepth) {
      fail(fmt::format("arrays and objects are nested more than {} levels deep (a memory snapshot nests 7)",
                       kMaxNestingDepth));
    }
    if (++values_ > value_budget_) {
      fail(fmt::format("the text holds more than {} values, more than a snapshot of {} records would; {}",
                       value_budget_, limits_.max_records, read_limit_hint("GPUMEM_MAX_RECORDS", limits_.max_records)));
    }
    const char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return PickleValue::string(string());
    if (literal("true")) return PickleValue::boolean(true);
    if (literal("false")) return PickleValue::boolean(false);
    if (literal("null")) return PickleValue();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(fmt::format("unexpected character '{}'", c));
  }

  // Object keys repeat in every entry of a trace: one shared string per distinct key.
  PickleValue key_string() {
    std::string text = string();
    auto it = keys_.find(text);
    if (it == keys_.end()) {
      if (keys_.size() >= 4096) return PickleValue::string(std::move(text));  // not a key vocabulary
      it = keys_.emplace(text, PickleValue::string(text)).first;
    }
    return it->second;
  }

  PickleValue object(int depth) {
    ++p_;
    PickleDictItems items;
    detail::DictKeys index;
    if (peek() == '}') { ++p_; return PickleValue::dict(std::move(items)); }
    for (;;) {
      if (peek() != '"') fail("expected a string key");
      PickleValue key = key_string();
      expect(':');
      // A repeated key keeps its place and takes the later value, as Python's json does.
      PickleValue v = value(depth + 1);
      detail::DictKeys::set(items, std::move(key), std::move(v),
                            items.size() >= detail::DictKeys::kIndexFrom ? &index : nullptr);
      const char c = peek();
      ++p_;
      if (c == '}') break;
      if (c != ',') { --p_; fail("expected ',' or '}'"); }
    }
    return PickleValue::dict(std::move(items));
  }

  PickleValue array(int depth) {
    ++p_;
    PickleItems items;
    if (peek() == ']') { ++p_; return PickleValue::list(std::move(items)); }
    for (;;) {
      items.push_back(value(depth + 1));
      const char c = peek();
      ++p_;
      if (c == ']') break;
      if (c != ',') { --p_; fail("expected ',' or ']'"); }
    }
    return PickleValue::list(std::move(items));
  }

  void utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  std::uint32_t hex4() {
    if (p_ + 4 > t_.size()) fail("a \\u escape is cut short");
    std::uint32_t v = 0;
    auto r = std::from_chars(t_.data() + p_, t_.data() + p_ + 4, v, 16);
    if (r.ptr != t_.data() + p_ + 4) fail("a \\u escape needs four hex digits");
    p_ += 4;
    return v;
  }

  std::string string() {
    ++p_;  // opening quote
    std::string out;
    for (;;) {
      if (p_ >= t_.size()) fail("a string is not closed");
      const char c = t_[p_++];
      if (c == '"') return out;
      if (c != '\\') { out.push_back(c); continue; }
      if (p_ >= t_.size()) fail("a string is not closed");
      const char e = t_[p_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && t_.substr(p_, 2) == "\\u") {
            const std::size_t at = p_;
            p_ += 2;
            const std::uint32_t lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              p_ = at;  // a lone high surrogate; the next escape stands alone
            }
          }
          utf8(out, cp);
          break;
        }
        default: --p_; fail(fmt::format("unknown escape '\\{}'", e));
      }
    }
  }

  PickleValue number() {
    const std::size_t start = p_;
    if (t_[p_] == '-') ++p_;
    bool integral = true;
    while (p_ < t_.size()) {
      const char c = t_[p_];
      if (c >= '0' && c <= '9') { ++p_; continue; }
      if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') { integral = false; ++p_; continue; }
      break;
    }
    const std::string_view text = t_.substr(start, p_ - start);
    if (integral) {
      std::int64_t v = 0;
      auto r = std::from_chars(text.data(), text.data() + text.size(), v);
      if (r.ec == std::errc() && r.ptr == text.data() + text.size()) return PickleValue::integer(v);
    }
    const std::string copy(text);
    char* end = nullptr;
    const double d = std::strtod(copy.c_str(), &end);
    if (end != copy.c_str() + copy.size()) { p_ = start; fail(fmt::format("'{}' is not a number", copy)); }
    return PickleValue::floating(d);
  }

  std::string_view t_;
  const std::string& source_;
  const ReadLimits& limits_;
  std::uint64_t value_budget_ = 0;
  std::uint64_t values_ = 0;
  std::size_t p_ = 0;
  std::unordered_map<std::string, PickleValue> keys_;
};

}  // namespace

PickleValue parse_json(std::string_view text, const std::string& source, const ReadLimits& limits) {
  return JsonParser(text, source, limits).document();
}

}  // namespace gpumem::forensics::detail
