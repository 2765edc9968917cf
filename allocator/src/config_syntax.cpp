// The configuration string's syntax: tokens, entries, key lookup across the layers' tables, and the
// value helpers key handlers use. See gpumem/alloc/config_syntax.h.
//
// Parsing runs in three steps:
//   1. tokenize: ',' ':' '[' ']' separate tokens; white space is dropped (PyTorch does the same),
//      except that each word also keeps a copy with only its ends trimmed (Entry::raw_value);
//   2. group the tokens into entries: key ':' value, where value is one token, a list
//      '[' a:b, c:d ']', or nothing (the key's handler decides whether that is allowed); an unknown
//      key fails here, with the nearest known key of any table;
//   3. apply the entries: keys marked apply_first, then the others in the order written, then each
//      table's cross-key check.
// Inside this file a failure travels as a Failure exception; parse_config_text turns it into a
// ConfigError.
#include "gpumem/alloc/config_syntax.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

namespace gpumem::alloc::config_syntax {
namespace {

struct Failure {
  std::string message;  // without the prefix
};

// ---- step 1: tokens ----

enum class TokenKind : std::uint8_t { word, colon, comma, open, close };

struct Token {
  TokenKind kind = TokenKind::word;
  std::string text;  // words: white space removed
  std::string raw;   // words: only the ends trimmed
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::vector<Token> tokenize(std::string_view text) {
  std::vector<Token> tokens;
  std::string word;
  auto flush = [&] {
    std::size_t b = 0, e = word.size();
    while (b < e && is_space(word[b])) ++b;
    while (e > b && is_space(word[e - 1])) --e;
    if (b == e) {
      word.clear();
      return;
    }
    Token t;
    t.raw = word.substr(b, e - b);
    for (char c : t.raw)
      if (!is_space(c)) t.text += c;
    tokens.push_back(std::move(t));
    word.clear();
  };
  for (char c : text) {
    TokenKind kind;
    switch (c) {
      case ':': kind = TokenKind::colon; break;
      case ',': kind = TokenKind::comma; break;
      case '[': kind = TokenKind::open; break;
      case ']': kind = TokenKind::close; break;
      default: word += c; continue;
    }
    flush();
    tokens.push_back(Token{kind, std::string(1, c), std::string(1, c)});
  }
  flush();
  return tokens;
}

// ---- key lookup ----

struct KeyRef {
  std::size_t table = 0;
  std::size_t index = 0;
  bool operator==(const KeyRef&) const = default;
};

std::optional<KeyRef> find_key(std::span<const KeyTable> tables, std::string_view name) {
  for (std::size_t t = 0; t < tables.size(); ++t)
    for (std::size_t i = 0; i < tables[t].size(); ++i) {
      const KeyInfo& k = tables[t].info(i);
      if (name == k.name || (!k.alias.empty() && name == k.alias)) return KeyRef{t, i};
    }
  return std::nullopt;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0u : 1u)});
      diag = up;
    }
  }
  return row[b.size()];
}

[[noreturn]] void fail_unknown_key(std::span<const KeyTable> tables, std::string_view key) {
  std::string hint;
  std::size_t best = 4;  // suggest only close misspellings
  for (std::string_view k : key_names(tables)) {
    std::size_t d = edit_distance(key, k);
    if (d < best) {
      best = d;
      hint = fmt::format(" did you mean '{}'?", k);
    }
  }
  std::string accepted;
  for (const KeyTable& table : tables)
    for (std::size_t i = 0; i < table.size(); ++i) {
      if (!accepted.empty()) accepted += ", ";
      accepted += table.info(i).name;
    }
  fail(fmt::format("unknown key '{}';{} accepted keys: {}", key, hint, accepted));
}

// ---- step 2: entries ----

std::string describe(const Token& t) { return "'" + t.text + "'"; }

struct Given {
  KeyRef ref;
  Entry entry;
};

std::vector<Given> group_entries(std::span<const KeyTable> tables, const std::vector<Token>& t) {
  std::vector<Given> entries;
  std::size_t i = 0;
  const std::size_t n = t.size();
  while (i < n) {
    if (t[i].kind != TokenKind::word) {
      if (t[i].kind == TokenKind::comma)
        fail("an empty entry (a leading ',' or two ',' in a row); entries look like "
             "key:value,key2:value2");
      fail(fmt::format("found {} where a key was expected; entries look like "
                       "key:value,key2:[a:b,c:d]",
                       describe(t[i])));
    }
    Entry e;
    e.key = t[i].text;
    const std::optional<KeyRef> ref = find_key(tables, e.key);
    if (!ref) fail_unknown_key(tables, e.key);
    const KeyInfo& spec = tables[ref->table].info(ref->index);
    ++i;
    if (i >= n || t[i].kind != TokenKind::colon)
      fail(fmt::format("{} has no ':' and no value; expected {}, e.g. {}", e.key, spec.forms, spec.example));
    ++i;
    if (i < n && t[i].kind == TokenKind::open) {
      e.is_list = true;
      e.list_text.push_back('[');  // (push_back: g++ 12 warns falsely on = "[")
      ++i;
      bool closed = false;
      while (i < n) {
        if (t[i].kind == TokenKind::close) {
          closed = true;
          ++i;
          break;
        }
        if (t[i].kind != TokenKind::word)
          fail(fmt::format("{}:{}... is malformed at {}; expected {}, e.g. {}", e.key, e.list_text,
                           describe(t[i]), spec.forms, spec.example));
        Entry::Item item;
        item.first = t[i].text;
        e.list_text += t[i].text;
        ++i;
        if (i < n && t[i].kind == TokenKind::colon) {
          if (i + 1 >= n || t[i + 1].kind != TokenKind::word)
            fail(fmt::format("{}:{}:... is malformed at {}; list items look like a:b, so expected "
                             "{}, e.g. {}",
                             e.key, e.list_text, i + 1 < n ? describe(t[i + 1]) : "the end", spec.forms,
                             spec.example));
          item.has_second = true;
          item.second = t[i + 1].text;
          e.list_text += ":" + item.second;
          i += 2;
        }
        e.items.push_back(std::move(item));
        if (i < n && t[i].kind == TokenKind::comma) {
          e.list_text += ",";
          ++i;
        } else if (i < n && t[i].kind != TokenKind::close) {
          fail(fmt::format("{}:{}... is malformed at {}; separate list items with ',', e.g. {}", e.key,
                           e.list_text, describe(t[i]), spec.example));
        }
      }
      if (!closed)
        fail(fmt::format("the '[' after {}: is never closed; lists look like {}", e.key, spec.example));
      e.list_text += "]";
    } else if (i < n && t[i].kind == TokenKind::word) {
      e.value = t[i].text;
      e.raw_value = t[i].raw;
      ++i;
    }
    // else: no value; the key's handler decides whether that is allowed.
    if (i < n) {
      if (t[i].kind != TokenKind::comma)
        fail(fmt::format("unexpected {} after {}; separate entries with ',' (values cannot contain "
                         "':', ',', '[' or ']')",
                         describe(t[i]), e.shown()));
      ++i;  // a trailing ',' at the very end is accepted, as PyTorch does
    }
    entries.push_back(Given{*ref, std::move(e)});
  }
  return entries;
}

// ---- step 3 ----

void parse_or_throw(std::string_view text, std::span<const KeyTable> tables) {
  const std::vector<Given> given = group_entries(tables, tokenize(text));

  // One entry per key (an alias counts as its key).
  for (std::size_t a = 0; a < given.size(); ++a)
    for (std::size_t b = 0; b < a; ++b)
      if (given[a].ref == given[b].ref)
        fail(fmt::format("{} is given twice ({} and {}); give each key once",
                         tables[given[a].ref.table].info(given[a].ref.index).name, given[b].entry.shown(),
                         given[a].entry.shown()));

  auto first = [&](const Given& g) { return tables[g.ref.table].info(g.ref.index).apply_first; };
  for (const Given& g : given)
    if (first(g)) tables[g.ref.table].apply(g.ref.index, g.entry);
  for (const Given& g : given)
    if (!first(g)) tables[g.ref.table].apply(g.ref.index, g.entry);
  for (const KeyTable& table : tables) table.check();
}

}  // namespace

std::optional<ConfigError> parse_config_text(std::string_view text, std::string_view error_prefix,
                                             std::span<const KeyTable> tables) {
  try {
    parse_or_throw(text, tables);
  } catch (const Failure& f) {
    return ConfigError{fmt::format("{}{}", error_prefix, f.message)};
  }
  return std::nullopt;
}

std::vector<std::string_view> key_names(std::span<const KeyTable> tables) {
  std::vector<std::string_view> keys;
  for (const KeyTable& table : tables)
    for (std::size_t i = 0; i < table.size(); ++i) keys.push_back(table.info(i).name);
  for (const KeyTable& table : tables)
    for (std::size_t i = 0; i < table.size(); ++i)
      if (!table.info(i).alias.empty()) keys.push_back(table.info(i).alias);
  return keys;
}

EnvironmentText config_text_from_environment() {
  for (const char* var : {"GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    if (const char* value = std::getenv(var)) return EnvironmentText{var, value};
  }
  return EnvironmentText{};
}

std::string error_prefix(std::string_view variable) {
  if (variable.empty()) return "gpumem config: ";
  return fmt::format("gpumem config (from {}): ", variable);
}

// ---- for key handlers ----

void fail(std::string message) { throw Failure{std::move(message)}; }

void fail_value(const Entry& e, const KeyInfo& k, std::string_view problem) {
  if (!e.is_list && e.value.empty())
    fail(fmt::format("{} has no value; expected {}, e.g. {}", e.key, k.forms, k.example));
  fail(fmt::format("{} {}; expected {}, e.g. {}", e.shown(), problem, k.forms, k.example));
}

const std::string& want_scalar(const Entry& e, const KeyInfo& k) {
  if (e.is_list) fail_value(e, k, "is a list, but this key takes a single value");
  if (e.value.empty()) fail_value(e, k, "");
  return e.value;
}

bool want_bool(const Entry& e, const KeyInfo& k) {
  const std::string& v = want_scalar(e, k);
  if (v == "True") return true;
  if (v == "False") return false;
  std::string lower = v;
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (lower == "true" || lower == "false" || lower == "1" || lower == "0")
    fail_value(e, k, "is not accepted (booleans are exactly True or False)");
  fail_value(e, k, "is not a boolean");
}

bool parse_uint(std::string_view v, std::uint64_t& out, const char*& problem) {
  if (!v.empty() && v[0] == '-') {
    problem = "is negative";
    return false;
  }
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out, 10);
  if (ec == std::errc::result_out_of_range) {
    problem = "is too large";
    return false;
  }
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
    problem = "is not a whole number";
    return false;
  }
  return true;
}

std::uint64_t want_uint(const Entry& e, const KeyInfo& k, const std::string& v) {
  std::uint64_t out = 0;
  const char* problem = "";
  if (!parse_uint(v, out, problem)) fail_value(e, k, problem);
  return out;
}

std::uint64_t want_uint(const Entry& e, const KeyInfo& k) { return want_uint(e, k, want_scalar(e, k)); }

double want_number(const Entry& e, const KeyInfo& k) {
  const std::string& v = want_scalar(e, k);
  double out = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) fail_value(e, k, "is out of range");
  if (ec != std::errc() || end != v.data() + v.size()) fail_value(e, k, "is not a number");
  return out;
}

std::size_t mib_to_bytes(const Entry& e, const KeyInfo& k, std::uint64_t mib) {
  constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
  if (mib > SIZE_MAX / kMiB) fail_value(e, k, "is too large (the size in bytes does not fit in 64 bits)");
  return static_cast<std::size_t>(mib * kMiB);
}

std::size_t want_mib(const Entry& e, const KeyInfo& k) { return mib_to_bytes(e, k, want_uint(e, k)); }

}  // namespace gpumem::alloc::config_syntax
