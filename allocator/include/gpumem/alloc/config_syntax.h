// The configuration string's syntax, and the key tables through which each layer parses its own
// keys out of one string.
//
// Syntax (PYTORCH_CUDA_ALLOC_CONF's): `key:value,key2:value2,key3:[a:b,c:d]`; white space is
// ignored (except inside values a key takes raw, see Entry::raw_value); a trailing ',' is allowed;
// each key may appear once.
//
// Every layer owns its keys and the type they fill: the engine's keys fill alloc::Config
// (gpumem/alloc/config.h), the forensics keys forensics::Config, the torch adapter's keys
// torch::AdapterConfig. A layer describes its keys as a table of Key<Settings> (name, accepted
// forms, an example, a handler that validates the value and writes the field) and hands
// parse_config_text() a KeyTable bound to the value to fill. The top layer (the torch adapter's
// gpumem::torch::parse_config) passes the tables of every layer, so one string is tokenized once,
// an unknown key is suggested from every layer's keys, and every error has one form: it names the
// key, the bad value and the accepted forms, on one line.
//
// Parsing order: syntax and unknown keys (in the order written), then duplicates, then the values:
// keys marked apply_first (in table order), the others in the order written, then each table's
// cross-key check. The first failure is the error.
//
// Thread-safety: parse_config_text() and the helpers are reentrant; the handlers they call write
// only the value their table is bound to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpumem::alloc {

struct ConfigError {
  std::string message;  // names the key, the bad value and the accepted forms; one line
};

namespace config_syntax {

// One key:value entry as written.
struct Entry {
  std::string key;        // as written (white space removed)
  bool is_list = false;   // the value was [ ... ]
  std::string value;      // scalar value, white space removed ("" = no value)
  std::string raw_value;  // scalar value with only its ends trimmed (paths may hold spaces)
  struct Item {
    std::string first;  // a
    bool has_second = false;
    std::string second;  // b, when the item is a:b
  };
  std::vector<Item> items;  // list items: a:b or a
  std::string list_text;    // the list as written, for messages: [a:b,c:d]

  // key:value as the user wrote it (for messages).
  std::string shown() const { return key + ":" + (is_list ? list_text : value); }
};

// What a key is called and what it accepts (for messages, docs and config_keys()).
struct KeyInfo {
  std::string_view name;
  std::string_view alias;    // another accepted spelling (PyTorch's ROCm names), or empty
  std::string_view forms;    // the accepted values, in words
  std::string_view example;  // one valid entry
  bool apply_first = false;  // applied before every other key (other keys are checked against it)
};

// A key of a layer whose settings type is Settings: apply validates the entry and writes the
// field, failing through fail() / fail_value().
template <class Settings>
struct Key {
  KeyInfo info;
  void (*apply)(const Entry& entry, const KeyInfo& key, Settings& settings);
};

// One layer's keys bound to the value they fill. The table refers to its keys and its value: both
// must outlive it.
class KeyTable {
 public:
  template <class Settings, std::size_t N>
  KeyTable(const Key<Settings> (&keys)[N], Settings& target, void (*check)(const Settings&) = nullptr) {
    infos_.reserve(N);
    for (const Key<Settings>& k : keys) infos_.push_back(&k.info);
    apply_ = [&keys, &target](std::size_t i, const Entry& e) { keys[i].apply(e, keys[i].info, target); };
    if (check != nullptr) check_ = [check, &target] { check(target); };
  }

  std::size_t size() const noexcept { return infos_.size(); }
  const KeyInfo& info(std::size_t i) const noexcept { return *infos_[i]; }
  void apply(std::size_t i, const Entry& e) const { apply_(i, e); }
  void check() const {
    if (check_) check_();
  }

 private:
  std::vector<const KeyInfo*> infos_;
  std::function<void(std::size_t, const Entry&)> apply_;
  std::function<void()> check_;
};

// Parses text against the tables (see the top of this file). Never throws; on failure returns one
// ConfigError whose message is error_prefix followed by the problem.
std::optional<ConfigError> parse_config_text(std::string_view text, std::string_view error_prefix,
                                             std::span<const KeyTable> tables);

// Every key of the tables: canonical names in table order, then the aliases.
std::vector<std::string_view> key_names(std::span<const KeyTable> tables);

// The configuration variable a process was started with: the first of GPUMEM_ALLOC_CONF,
// PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF that is set (PyTorch's precedence for the last two),
// even if it is empty. variable is empty when none is set.
struct EnvironmentText {
  std::string variable;
  std::string text;
};
EnvironmentText config_text_from_environment();

// The prefix of error messages for text from `variable` ("gpumem config: " when empty).
std::string error_prefix(std::string_view variable);

// ---- for key handlers ----

// Fails the parse with message (which names the key, the value and the accepted forms).
[[noreturn]] void fail(std::string message);
// Fails with "<key:value> <problem>; expected <forms>, e.g. <example>" (or "has no value").
[[noreturn]] void fail_value(const Entry& e, const KeyInfo& k, std::string_view problem);

// The entry's single value (fails on a list or no value).
const std::string& want_scalar(const Entry& e, const KeyInfo& k);
// Exactly True or False.
bool want_bool(const Entry& e, const KeyInfo& k);
// A non-negative decimal integer: digits only, no sign, no suffix.
std::uint64_t want_uint(const Entry& e, const KeyInfo& k);
std::uint64_t want_uint(const Entry& e, const KeyInfo& k, const std::string& value);
// parse_uint without failing: false with problem = "is negative" / "is too large" /
// "is not a whole number".
bool parse_uint(std::string_view value, std::uint64_t& out, const char*& problem);
// A decimal number (0.8, .5, 8e-1).
double want_number(const Entry& e, const KeyInfo& k);
// A whole number of MiB, in bytes (fails if the bytes do not fit in 64 bits).
std::size_t want_mib(const Entry& e, const KeyInfo& k);
std::size_t mib_to_bytes(const Entry& e, const KeyInfo& k, std::uint64_t mib);

constexpr bool is_pow2(std::uint64_t v) noexcept { return v != 0 && (v & (v - 1)) == 0; }
constexpr const char* bool_text(bool v) noexcept { return v ? "True" : "False"; }

}  // namespace config_syntax
}  // namespace gpumem::alloc
