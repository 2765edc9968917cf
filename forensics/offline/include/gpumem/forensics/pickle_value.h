// PickleValue: a generic tree of the plain Python data a pickle can carry (None, bool, int,
// float, str, bytes, list, tuple, dict, set). It is what the pickle and JSON readers produce and
// what the snapshot reader walks.
//
// Containers and strings are shared (a pickle may refer to one object many times through its
// memo), so copying a PickleValue is cheap (no string or item is copied) and copies of a container
// see the same items. Dicts keep their insertion order. Integers are 64-bit signed (a snapshot's
// addresses and sizes fit).
//
// Trees from the readers are finite and acyclic (the readers refuse a container that holds itself)
// and at most kMaxNestingDepth deep, so recursive walks of them are bounded. Destroying any tree,
// however deep, uses a bounded amount of stack: containers are taken apart iteratively.
//
// Accessors require the matching kind; a wrong kind throws ForensicsError ("... is a str, used as
// an int"), never aborts: readers check kinds first and name the file and position themselves.
//
// Thread-safety: a value; share it read-only once reading is done.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace gpumem::forensics {

namespace detail {
struct PickleTree;  // the readers' checks of a tree they built (forensics/offline/src/pickle_tree.h)
}

class PickleValue;
using PickleItems = std::vector<PickleValue>;
using PickleDictItems = std::vector<std::pair<PickleValue, PickleValue>>;

class PickleValue {
 public:
  enum class Kind : std::uint8_t { none, boolean, integer, floating, string, bytes, list, tuple, dict, set };

  PickleValue() = default;  // None
  static PickleValue boolean(bool v);
  static PickleValue integer(std::int64_t v);
  static PickleValue floating(double v);
  static PickleValue string(std::string v);
  static PickleValue string(std::shared_ptr<const std::string> v);  // shares v
  static PickleValue bytes(std::string v);
  static PickleValue list(PickleItems items = {});
  static PickleValue tuple(PickleItems items = {});
  static PickleValue set(PickleItems items = {});
  static PickleValue dict(PickleDictItems items = {});

  Kind kind() const noexcept { return kind_; }
  bool is_none() const noexcept { return kind_ == Kind::none; }
  bool is_bool() const noexcept { return kind_ == Kind::boolean; }
  bool is_int() const noexcept { return kind_ == Kind::integer; }
  bool is_float() const noexcept { return kind_ == Kind::floating; }
  bool is_string() const noexcept { return kind_ == Kind::string; }
  bool is_bytes() const noexcept { return kind_ == Kind::bytes; }
  bool is_list() const noexcept { return kind_ == Kind::list; }
  bool is_tuple() const noexcept { return kind_ == Kind::tuple; }
  bool is_sequence() const noexcept { return kind_ == Kind::list || kind_ == Kind::tuple; }
  bool is_dict() const noexcept { return kind_ == Kind::dict; }
  bool is_set() const noexcept { return kind_ == Kind::set; }
  bool is_container() const noexcept { return kind_ >= Kind::list; }

  // Accessors; each requires the matching kind (a wrong kind throws ForensicsError).
  bool as_bool() const;
  std::int64_t as_int() const;
  double as_float() const;              // also accepts an integer
  const std::string& as_string() const;  // str or bytes
  const PickleItems& items() const;      // list, tuple or set
  PickleItems& items();
  const PickleDictItems& dict_items() const;
  PickleDictItems& dict_items();

  // For a dict: the value under a str key, or nullptr if absent (or not a dict). The last entry
  // with the key wins, as in Python (readers keep one entry per key anyway).
  const PickleValue* find(std::string_view key) const noexcept;

  // The identity of a container (the same for every copy of it), null for other kinds.
  const void* container_id() const noexcept;
  // Removes every item of a container (no-op for other kinds). Readers use it to take apart a
  // tree that a damaged file made cyclic.
  void clear_items() noexcept;

  // Python-like rendering (repr-ish), for messages and settings; long containers are cut.
  std::string to_repr(std::size_t max_chars = 200) const;

  static const char* kind_name(Kind kind) noexcept;

 private:
  friend struct detail::PickleTree;
  struct Container;  // list/tuple/set items or dict items; destroyed iteratively (pickle_value.cpp)

  Kind kind_ = Kind::none;
  std::variant<std::monostate, bool, std::int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<Container>>
      data_;
};

}  // namespace gpumem::forensics
