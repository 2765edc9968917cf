#include "gpumem/forensics/pickle_value.h"

#include <fmt/format.h>

#include "gpumem/forensics/error.h"
#include "pickle_tree.h"

namespace gpumem::forensics {

namespace {

[[noreturn]] void wrong_kind(PickleValue::Kind have, const char* want) {
  throw ForensicsError(fmt::format("a {} was found where a {} was expected (the file's data has the wrong type)",
                                   PickleValue::kind_name(have), want));
}

}  // namespace

PickleValue PickleValue::boolean(bool v) {
  PickleValue p;
  p.kind_ = Kind::boolean;
  p.data_ = v;
  return p;
}
PickleValue PickleValue::integer(std::int64_t v) {
  PickleValue p;
  p.kind_ = Kind::integer;
  p.data_ = v;
  return p;
}
PickleValue PickleValue::floating(double v) {
  PickleValue p;
  p.kind_ = Kind::floating;
  p.data_ = v;
  return p;
}
PickleValue PickleValue::string(std::string v) {
  return string(std::make_shared<const std::string>(std::move(v)));
}
PickleValue PickleValue::string(std::shared_ptr<const std::string> v) {
  PickleValue p;
  p.kind_ = Kind::string;
  p.data_ = std::move(v);
  return p;
}
PickleValue PickleValue::bytes(std::string v) {
  PickleValue p;
  p.kind_ = Kind::bytes;
  p.data_ = std::make_shared<const std::string>(std::move(v));
  return p;
}
PickleValue PickleValue::list(PickleItems items) {
  PickleValue p;
  p.kind_ = Kind::list;
  auto c = std::make_shared<Container>();
  c->items = std::move(items);
  p.data_ = std::move(c);
  return p;
}
PickleValue PickleValue::tuple(PickleItems items) {
  PickleValue p = list(std::move(items));
  p.kind_ = Kind::tuple;
  return p;
}
PickleValue PickleValue::set(PickleItems items) {
  PickleValue p = list(std::move(items));
  p.kind_ = Kind::set;
  return p;
}
PickleValue PickleValue::dict(PickleDictItems items) {
  PickleValue p;
  p.kind_ = Kind::dict;
  auto c = std::make_shared<Container>();
  c->dict = std::move(items);
  p.data_ = std::move(c);
  return p;
}

bool PickleValue::as_bool() const {
  if (kind_ != Kind::boolean) wrong_kind(kind_, "bool");
  return std::get<bool>(data_);
}
std::int64_t PickleValue::as_int() const {
  if (kind_ != Kind::integer) wrong_kind(kind_, "int");
  return std::get<std::int64_t>(data_);
}
double PickleValue::as_float() const {
  if (kind_ == Kind::integer) return static_cast<double>(std::get<std::int64_t>(data_));
  if (kind_ != Kind::floating) wrong_kind(kind_, "float");
  return std::get<double>(data_);
}
const std::string& PickleValue::as_string() const {
  if (kind_ != Kind::string && kind_ != Kind::bytes) wrong_kind(kind_, "str");
  return *std::get<std::shared_ptr<const std::string>>(data_);
}
const PickleItems& PickleValue::items() const {
  if (kind_ != Kind::list && kind_ != Kind::tuple && kind_ != Kind::set) wrong_kind(kind_, "list");
  return std::get<std::shared_ptr<Container>>(data_)->items;
}
PickleItems& PickleValue::items() {
  if (kind_ != Kind::list && kind_ != Kind::tuple && kind_ != Kind::set) wrong_kind(kind_, "list");
  return std::get<std::shared_ptr<Container>>(data_)->items;
}
const PickleDictItems& PickleValue::dict_items() const {
  if (kind_ != Kind::dict) wrong_kind(kind_, "dict");
  return std::get<std::shared_ptr<Container>>(data_)->dict;
}
PickleDictItems& PickleValue::dict_items() {
  if (kind_ != Kind::dict) wrong_kind(kind_, "dict");
  return std::get<std::shared_ptr<Container>>(data_)->dict;
}

const PickleValue* PickleValue::find(std::string_view key) const noexcept {
  if (kind_ != Kind::dict) return nullptr;
  const auto& d = std::get<std::shared_ptr<Container>>(data_)->dict;
  for (auto it = d.rbegin(); it != d.rend(); ++it) {
    if (it->first.kind_ == Kind::string && *std::get<std::shared_ptr<const std::string>>(it->first.data_) == key) {
      return &it->second;
    }
  }
  return nullptr;
}

const void* PickleValue::container_id() const noexcept {
  const auto* c = std::get_if<std::shared_ptr<Container>>(&data_);
  return c ? c->get() : nullptr;
}

void PickleValue::clear_items() noexcept {
  auto* c = std::get_if<std::shared_ptr<Container>>(&data_);
  if (!c) return;
  // Moved out first: clearing may release the last reference to containers that hold this one.
  PickleItems items = std::move((*c)->items);
  PickleDictItems dict = std::move((*c)->dict);
  (*c)->items.clear();
  (*c)->dict.clear();
}

const char* PickleValue::kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
    case Kind::set: return "set";
  }
  return "?";
}

std::string PickleValue::to_repr(std::size_t max_chars) const {
  std::string out;
  auto append_seq = [&](const char* open, const char* close) {
    out += open;
    bool first = true;
    for (const auto& v : items()) {
      if (!first) out += ", ";
      first = false;
      out += v.to_repr(max_chars);
      if (out.size() > max_chars) break;
    }
    out += close;
  };
  switch (kind_) {
    case Kind::none: out = "None"; break;
    case Kind::boolean: out = as_bool() ? "True" : "False"; break;
    case Kind::integer: out = fmt::format("{}", as_int()); break;
    case Kind::floating: out = fmt::format("{}", as_float()); break;
    case Kind::string: out = "'" + as_string() + "'"; break;
    case Kind::bytes: out = fmt::format("b<{} bytes>", as_string().size()); break;
    case Kind::list: append_seq("[", "]"); break;
    case Kind::tuple: append_seq("(", ")"); break;
    case Kind::set: append_seq("{", "}"); break;
    case Kind::dict: {
      out = "{";
      bool first = true;
      for (const auto& [k, v] : dict_items()) {
        if (!first) out += ", ";
        first = false;
        out += k.to_repr(max_chars) + ": " + v.to_repr(max_chars);
        if (out.size() > max_chars) break;
      }
      out += "}";
      break;
    }
  }
  if (out.size() > max_chars) {
    out.resize(max_chars);
    out += "...";
  }
  return out;
}

}  // namespace gpumem::forensics
