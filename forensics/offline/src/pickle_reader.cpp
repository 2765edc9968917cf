#include "gpumem/forensics/pickle_reader.h"

#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "file_bytes.h"
#include "gpumem/forensics/error.h"
#include "pickle_tree.h"

namespace gpumem::forensics {
namespace {

// The pickle virtual machine, restricted to plain data. See the header for the opcode list.
// Values the machine may hold per record the limits allow (a trace entry of PyTorch's is a dict
// of about 8 keys and values plus its frames, each a dict of 3).
constexpr std::uint64_t kValuesPerRecord = 8;

class Unpickler {
 public:
  Unpickler(std::string_view bytes, const std::string& source, const ReadLimits& limits)
      : in_(bytes), source_(source), limits_(limits) {
    const std::uint64_t budget = limits.max_records * kValuesPerRecord;
    value_budget_ = budget / kValuesPerRecord == limits.max_records ? budget : ~std::uint64_t{0};
  }
  ~Unpickler() {
    // Anything the machine still holds (a failed read) may form cycles: take it all apart.
    stack_.clear();
    memo_.clear();
    for (auto& c : created_) c.clear_items();
  }
  Unpickler(const Unpickler&) = delete;
  Unpickler& operator=(const Unpickler&) = delete;

  PickleValue run() {
    for (;;) {
      op_pos_ = pos_;
      if (pos_ >= in_.size()) {
        fail(fmt::format("the pickle ends at byte offset {} without its STOP opcode: the file is "
                         "truncated (write it again)",
                         pos_));
      }
      const auto op = static_cast<unsigned char>(in_[pos_++]);
      if (op == '.') {  // STOP
        if (stack_.size() != 1 || !marks_.empty()) fail("STOP with an unbalanced stack: the pickle is corrupt");
        PickleValue root = take_value(std::move(stack_.back()));
        stack_.clear();
        memo_.clear();
        switch (detail::PickleTree::adopt(root, created_, kMaxNestingDepth)) {
          case detail::PickleTree::Shape::ok: break;
          case detail::PickleTree::Shape::cycle:
            fail("a container holds itself (through the memo): a memory snapshot has no such cycles; the "
                 "pickle is corrupt or not a snapshot");
          case detail::PickleTree::Shape::too_deep:
            fail(fmt::format("containers are nested more than {} levels deep (a memory snapshot nests 7): the "
                             "pickle is corrupt or not a snapshot",
                             kMaxNestingDepth));
        }
        return root;
      }
      step(op);
    }
  }

 private:
  // A stack slot: a value, or a reference to a global (only torch.jit._pickle helpers).
  struct Slot {
    PickleValue value;
    std::string global;  // "module.name" when this slot is a global, else empty
  };

  [[noreturn]] void fail(const std::string& what) const {
    throw ForensicsError(fmt::format("{}: byte offset {}: {}", source_, op_pos_, what));
  }

  std::string_view take(std::size_t n) {
    if (n > in_.size() - pos_) {
      fail(fmt::format("opcode needs {} more bytes but the pickle ends at byte offset {}: the file "
                       "is truncated (write it again)",
                       n, in_.size()));
    }
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::uint64_t take_le(std::size_t n) {
    std::string_view s = take(n);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t{static_cast<unsigned char>(s[i])} << (8 * i);
    return v;
  }
  std::string_view take_line() {
    const std::size_t eol = in_.find('\n', pos_);
    if (eol == std::string_view::npos) fail("text argument without its newline: the file is truncated");
    std::string_view s = in_.substr(pos_, eol - pos_);
    pos_ = eol + 1;
    return s;
  }
  std::size_t take_length(std::size_t width) {
    const std::uint64_t n = take_le(width);
    if (n > in_.size()) fail(fmt::format("length {} is larger than the whole pickle: the pickle is corrupt", n));
    return static_cast<std::size_t>(n);
  }

  // Every value, mark and memo entry the machine makes counts against the budget, so that no
  // pickle makes it hold more than the limits allow (a single opcode byte can push a value).
  void spend(std::uint64_t n = 1) {
    values_ += n;
    if (values_ > value_budget_) {
      fail(fmt::format("the pickle builds more than {} values, more than a snapshot of {} records would; {}",
                       value_budget_, limits_.max_records, read_limit_hint("GPUMEM_MAX_RECORDS", limits_.max_records)));
    }
  }
  // A new container: remembered, so that whatever cycles a damaged pickle makes can be broken.
  PickleValue made(PickleValue container) {
    created_.push_back(container);
    return container;
  }
  void push(PickleValue v) {
    spend();
    stack_.push_back(Slot{std::move(v), {}});
  }
  Slot pop_slot() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      fail("an opcode needs a value but the stack is empty: the pickle is corrupt");
    }
    Slot s = std::move(stack_.back());
    stack_.pop_back();
    return s;
  }
  PickleValue take_value(Slot s) const {
    if (!s.global.empty()) {
      fail(fmt::format("the global '{}' is used as data; a memory snapshot holds plain data only",
                       s.global));
    }
    return std::move(s.value);
  }
  PickleValue pop() { return take_value(pop_slot()); }
  Slot& top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      fail("an opcode needs a value but the stack is empty: the pickle is corrupt");
    }
    return stack_.back();
  }
  // Pops everything above the last MARK, and the mark.
  PickleItems pop_to_mark() {
    if (marks_.empty()) fail("an opcode needs a MARK but none is open: the pickle is corrupt");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    PickleItems items;
    items.reserve(stack_.size() - m);
    for (std::size_t i = m; i < stack_.size(); ++i) items.push_back(take_value(std::move(stack_[i])));
    stack_.resize(m);
    return items;
  }
  void memo_put(std::uint64_t index) {
    Slot& s = top();
    auto [it, inserted] = memo_.try_emplace(index, s);
    if (inserted) {
      spend();
    } else {
      it->second = s;
    }
  }
  void memo_get(std::uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) fail(fmt::format("memo entry {} is used before it is defined: the pickle is corrupt", index));
    spend();
    stack_.push_back(it->second);
  }

  static PickleValue signed_le(std::string_view s, const Unpickler& self) {
    if (s.empty()) return PickleValue::integer(0);
    if (s.size() > 8) {
      // Accept wider encodings whose extra bytes are pure sign extension.
      const unsigned char sign = (static_cast<unsigned char>(s[7]) & 0x80) ? 0xff : 0x00;
      for (std::size_t i = 8; i < s.size(); ++i) {
        if (static_cast<unsigned char>(s[i]) != sign) {
          self.fail(fmt::format("an integer of {} bytes does not fit in 64 bits; a memory snapshot "
                                "has no such numbers",
                                s.size()));
        }
      }
      s = s.substr(0, 8);
    }
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < s.size(); ++i) v |= std::uint64_t{static_cast<unsigned char>(s[i])} << (8 * i);
    if (s.size() < 8 && (static_cast<unsigned char>(s.back()) & 0x80)) v |= ~std::uint64_t{0} << (8 * s.size());
    return PickleValue::integer(static_cast<std::int64_t>(v));
  }

  PickleValue parse_decimal(std::string_view text) const {
    if (!text.empty() && text.back() == 'L') text.remove_suffix(1);
    if (text == "01") return PickleValue::boolean(true);
    if (text == "00") return PickleValue::boolean(false);
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || p != text.data() + text.size()) {
      fail(fmt::format("'{}' is not an integer that fits in 64 bits", text));
    }
    return PickleValue::integer(v);
  }

  static std::string unquote(std::string_view s) {
    if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front()) {
      s = s.substr(1, s.size() - 2);
    }
    return std::string(s);
  }

  void add_to_list(Slot& target, PickleItems items) {
    if (!target.global.empty() || !(target.value.is_list() || target.value.is_set())) {
      fail(fmt::format("APPEND(S)/ADDITEMS on a {}: the pickle is corrupt",
                       PickleValue::kind_name(target.value.kind())));
    }
    auto& dst = target.value.items();
    for (auto& v : items) dst.push_back(std::move(v));
  }

  void set_items(Slot& target, PickleItems kv) {
    if (!target.global.empty() || !target.value.is_dict()) {
      fail(fmt::format("SETITEM(S) on a {}: the pickle is corrupt", PickleValue::kind_name(target.value.kind())));
    }
    if (kv.size() % 2 != 0) fail("SETITEMS with an odd number of items: the pickle is corrupt");
    auto& dst = target.value.dict_items();
    for (std::size_t i = 0; i < kv.size(); i += 2) {
      // Python semantics: a repeated key keeps its place and takes the later value.
      detail::DictKeys* index = nullptr;
      if (dst.size() >= detail::DictKeys::kIndexFrom) index = &dict_keys_[target.value.container_id()];
      detail::DictKeys::set(dst, std::move(kv[i]), std::move(kv[i + 1]), index);
    }
  }

  void push_global(std::string module, std::string name) {
    if (module == "__builtin__") module = "builtins";  // protocol 2's name for it
    const std::string full = module + "." + name;
    const bool plain_data_constructor =
        full == "builtins.set" || full == "builtins.frozenset" || full == "builtins.bytes" ||
        full == "builtins.bytearray" || full == "_codecs.encode";
    if (module != "torch.jit._pickle" && !plain_data_constructor) {
      fail(fmt::format("the pickle refers to the Python class or function '{}'; a PyTorch memory "
                       "snapshot holds plain data only (dict, list, str, int, float, bool, None)",
                       full));
    }
    spend();
    stack_.push_back(Slot{PickleValue(), full});
  }

  // Latin-1 bytes of a UTF-8 string (how protocol 2 carries bytes: _codecs.encode(s, 'latin1')).
  std::string latin1_of(const std::string& utf8) const {
    std::string out;
    for (std::size_t i = 0; i < utf8.size(); ++i) {
      const auto c = static_cast<unsigned char>(utf8[i]);
      if (c < 0x80) {
        out += static_cast<char>(c);
      } else if ((c & 0xe0) == 0xc0 && i + 1 < utf8.size() && c <= 0xc3) {
        out += static_cast<char>(((c & 0x1f) << 6) | (static_cast<unsigned char>(utf8[++i]) & 0x3f));
      } else {
        fail("_codecs.encode of a character outside Latin-1: the pickle is corrupt");
      }
    }
    return out;
  }

  void reduce() {
    PickleValue args = pop();
    Slot callable = pop_slot();
    if (callable.global.empty()) fail("REDUCE on a value that is not a callable: the pickle is corrupt");
    if (!args.is_tuple()) fail(fmt::format("REDUCE of '{}' without an argument tuple: the pickle is corrupt", callable.global));
    const std::string& c = callable.global;
    if (c == "builtins.set" || c == "builtins.frozenset") {
      if (args.items().empty()) {
        push(made(PickleValue::set()));
        return;
      }
      const PickleValue& from = args.items()[0];
      if (!from.is_sequence() && !from.is_set()) {
        fail(fmt::format("REDUCE of '{}' over a {} (a set is made of a list or tuple): the pickle is corrupt", c,
                         PickleValue::kind_name(from.kind())));
      }
      spend(from.items().size());
      push(made(PickleValue::set(from.items())));
      return;
    }
    if (c == "builtins.bytes" || c == "builtins.bytearray") {
      if (args.items().empty()) {
        push(PickleValue::bytes(""));
        return;
      }
      const PickleValue& from = args.items()[0];
      if (from.is_sequence()) {  // bytes([1, 2, 3])
        std::string out;
        out.reserve(from.items().size());
        for (const auto& b : from.items()) {
          if (!b.is_int() || b.as_int() < 0 || b.as_int() > 255) {
            fail(fmt::format("REDUCE of '{}' over a list holding {} (bytes are ints 0 to 255): the pickle is corrupt",
                             c, b.is_int() ? std::to_string(b.as_int()) : std::string("a ") + PickleValue::kind_name(b.kind())));
          }
          out += static_cast<char>(b.as_int());
        }
        push(PickleValue::bytes(std::move(out)));
        return;
      }
      if (from.is_string() || from.is_bytes()) {
        push(PickleValue::bytes(from.as_string()));
        return;
      }
      fail(fmt::format("REDUCE of '{}' over a {}: the pickle is corrupt", c, PickleValue::kind_name(from.kind())));
    }
    if (c == "_codecs.encode") {
      if (args.items().empty() || !args.items()[0].is_string()) fail("_codecs.encode without a string: the pickle is corrupt");
      push(PickleValue::bytes(latin1_of(args.items()[0].as_string())));
      return;
    }
    if (args.items().empty()) {
      fail(fmt::format("REDUCE of '{}' without arguments: the pickle is corrupt", callable.global));
    }
    const std::string& g = callable.global;
    if (g == "torch.jit._pickle.restore_type_tag" || g == "torch.jit._pickle.build_intlist" ||
        g == "torch.jit._pickle.build_doublelist" || g == "torch.jit._pickle.build_boollist" ||
        g == "torch.jit._pickle.build_genericlist" || g == "torch.jit._pickle.build_list") {
      push(args.items().front());  // the wrapped list or dict itself
      return;
    }
    fail(fmt::format("the pickle calls '{}', which is not part of a memory snapshot", g));
  }

  void step(unsigned char op) {
    switch (op) {
      case 0x80: {  // PROTO
        const auto proto = static_cast<unsigned>(take_le(1));
        if (proto > 5) {
          fail(fmt::format("pickle protocol {} is newer than this reader understands (2 to 5); "
                           "write the snapshot with pickle protocol 5 or lower",
                           proto));
        }
        return;
      }
      case 0x95: take_le(8); return;  // FRAME: a framing hint only
      case '(':  // MARK
        spend();
        marks_.push_back(stack_.size());
        return;
      case '0': pop_slot(); return;                        // POP
      case '1': pop_to_mark(); return;                     // POP_MARK
      case '2': {  // DUP
        Slot copy = top();
        spend();
        stack_.push_back(std::move(copy));
        return;
      }
      case 'N': push(PickleValue()); return;
      case 0x88: push(PickleValue::boolean(true)); return;
      case 0x89: push(PickleValue::boolean(false)); return;
      case 'I': push(parse_decimal(take_line())); return;
      case 'L': push(parse_decimal(take_line())); return;
      case 'J': push(PickleValue::integer(static_cast<std::int32_t>(take_le(4)))); return;
      case 'K': push(PickleValue::integer(static_cast<std::int64_t>(take_le(1)))); return;
      case 'M': push(PickleValue::integer(static_cast<std::int64_t>(take_le(2)))); return;
      case 0x8a: push(signed_le(take(take_length(1)), *this)); return;  // LONG1
      case 0x8b: push(signed_le(take(take_length(4)), *this)); return;  // LONG4
      case 'F': {
        const std::string text(take_line());
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str()) fail(fmt::format("'{}' is not a float", text));
        push(PickleValue::floating(v));
        return;
      }
      case 'G': {  // BINFLOAT: big-endian IEEE 754 double
        std::string_view s = take(8);
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(s[i]);
        double v = 0;
        std::memcpy(&v, &bits, sizeof v);
        push(PickleValue::floating(v));
        return;
      }
      case 'S': push(PickleValue::string(unquote(take_line()))); return;            // STRING
      case 'T': push(PickleValue::string(std::string(take(take_length(4))))); return;  // BINSTRING
      case 'U': push(PickleValue::string(std::string(take(take_length(1))))); return;  // SHORT_BINSTRING
      case 'V': push(PickleValue::string(std::string(take_line()))); return;        // UNICODE
      case 'X': push(PickleValue::string(std::string(take(take_length(4))))); return;  // BINUNICODE
      case 0x8c: push(PickleValue::string(std::string(take(take_length(1))))); return;  // SHORT_BINUNICODE
      case 0x8d: push(PickleValue::string(std::string(take(take_length(8))))); return;  // BINUNICODE8
      case 'B': push(PickleValue::bytes(std::string(take(take_length(4))))); return;    // BINBYTES
      case 'C': push(PickleValue::bytes(std::string(take(take_length(1))))); return;    // SHORT_BINBYTES
      case 0x8e: push(PickleValue::bytes(std::string(take(take_length(8))))); return;   // BINBYTES8
      case 0x96: push(PickleValue::bytes(std::string(take(take_length(8))))); return;   // BYTEARRAY8
      case '}': push(made(PickleValue::dict())); return;
      case ']': push(made(PickleValue::list())); return;
      case ')': push(made(PickleValue::tuple())); return;
      case 0x8f: push(made(PickleValue::set())); return;  // EMPTY_SET
      case 'd': {                                    // DICT
        PickleItems kv = pop_to_mark();
        push(made(PickleValue::dict()));
        set_items(stack_.back(), std::move(kv));
        return;
      }
      case 'l': push(made(PickleValue::list(pop_to_mark()))); return;  // LIST
      case 't': push(made(PickleValue::tuple(pop_to_mark()))); return;  // TUPLE
      case 0x91: push(made(PickleValue::set(pop_to_mark()))); return;   // FROZENSET
      case 0x85: {  // TUPLE1
        PickleValue a = pop();
        push(made(PickleValue::tuple({std::move(a)})));
        return;
      }
      case 0x86: {  // TUPLE2
        PickleValue b = pop();
        PickleValue a = pop();
        push(made(PickleValue::tuple({std::move(a), std::move(b)})));
        return;
      }
      case 0x87: {  // TUPLE3
        PickleValue c = pop();
        PickleValue b = pop();
        PickleValue a = pop();
        push(made(PickleValue::tuple({std::move(a), std::move(b), std::move(c)})));
        return;
      }
      case 'a': {  // APPEND
        PickleValue v = pop();
        PickleItems one;
        one.push_back(std::move(v));
        add_to_list(top(), std::move(one));
        return;
      }
      case 'e':     // APPENDS
      case 0x90: {  // ADDITEMS
        PickleItems items = pop_to_mark();
        add_to_list(top(), std::move(items));
        return;
      }
      case 's': {  // SETITEM
        PickleValue v = pop();
        PickleValue k = pop();
        set_items(top(), {std::move(k), std::move(v)});
        return;
      }
      case 'u': {  // SETITEMS
        PickleItems kv = pop_to_mark();
        set_items(top(), std::move(kv));
        return;
      }
      case 'g': {  // GET
        const std::string_view t = take_line();
        std::uint64_t i = 0;
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), i);
        if (ec != std::errc() || p != t.data() + t.size()) fail(fmt::format("bad memo index '{}'", t));
        memo_get(i);
        return;
      }
      case 'h': memo_get(take_le(1)); return;  // BINGET
      case 'j': memo_get(take_le(4)); return;  // LONG_BINGET
      case 'p': {                               // PUT
        const std::string_view t = take_line();
        std::uint64_t i = 0;
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), i);
        if (ec != std::errc() || p != t.data() + t.size()) fail(fmt::format("bad memo index '{}'", t));
        memo_put(i);
        return;
      }
      case 'q': memo_put(take_le(1)); return;  // BINPUT
      case 'r': memo_put(take_le(4)); return;  // LONG_BINPUT
      case 0x94: memo_put(memo_.size()); return;  // MEMOIZE
      case 'c': {                                  // GLOBAL
        std::string module(take_line());
        std::string name(take_line());
        push_global(std::move(module), std::move(name));
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        PickleValue name = pop();
        PickleValue module = pop();
        if (!name.is_string() || !module.is_string()) fail("STACK_GLOBAL needs two strings: the pickle is corrupt");
        push_global(module.as_string(), name.as_string());
        return;
      }
      case 'R': reduce(); return;
      default: break;
    }
    const char* name = nullptr;
    switch (op) {
      case 'P': name = "PERSID"; break;
      case 'Q': name = "BINPERSID"; break;
      case 'b': name = "BUILD"; break;
      case 'i': name = "INST"; break;
      case 'o': name = "OBJ"; break;
      case 0x81: name = "NEWOBJ"; break;
      case 0x82: case 0x83: case 0x84: name = "EXT"; break;
      case 0x92: name = "NEWOBJ_EX"; break;
      case 0x97: name = "NEXT_BUFFER"; break;
      case 0x98: name = "READONLY_BUFFER"; break;
      default: break;
    }
    if (name) {
      fail(fmt::format("opcode {} builds a Python object; a PyTorch memory snapshot holds plain data "
                       "only (dict, list, str, int, float, bool, None)",
                       name));
    }
    fail(fmt::format("byte 0x{:02x} is not a pickle opcode: the file is corrupt or not a pickle", op));
  }

  std::string_view in_;
  const std::string& source_;
  const ReadLimits& limits_;
  std::uint64_t value_budget_ = 0;
  std::uint64_t values_ = 0;
  std::vector<PickleValue> created_;  // every container made (see made())
  std::unordered_map<const void*, detail::DictKeys> dict_keys_;  // indexes of large dicts
  std::size_t pos_ = 0;
  std::size_t op_pos_ = 0;
  std::vector<Slot> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, Slot> memo_;
};

}  // namespace

PickleValue parse_pickle(std::string_view bytes, const std::string& source, const ReadLimits& limits) {
  if (bytes.empty()) throw ForensicsError(fmt::format("{}: the file is empty, not a pickle", source));
  return Unpickler(bytes, source, limits).run();
}

PickleValue read_pickle_file(const std::string& path, const ReadLimits& limits) {
  const detail::FileBytes file = detail::read_file_bytes(path, limits);
  return parse_pickle(file.bytes, path, limits);
}

}  // namespace gpumem::forensics
