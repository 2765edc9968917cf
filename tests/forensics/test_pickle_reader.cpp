// The pickle reader: pickles written by Python (protocols 2 to 5), handmade opcodes, the real
// snapshot, and one clear error with the byte offset for truncated and corrupt input.
#include <string>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/pickle_reader.h"

namespace fx = gpumem::forensics;
using fx::PickleValue;
using fx::testing::TempDir;

namespace {

// Writes value.pN for N in 2..5: one dict exercising every plain type the reader supports.
const char* kWriteValues = R"PY(
import pickle, sys
shared = [1, 2, 3]
value = {
    "none": None, "true": True, "false": False,
    "small": 7, "byte": 255, "short": 65535, "neg": -5, "int32": -2**31, "big": 140524012961792,
    "max64": 2**63 - 1, "min64": -2**63,
    "float": 0.1, "negfloat": -2.5e300,
    "str": "hello", "unicode": "gr\u00fc\u00df \u2603", "long_str": "x" * 300,
    "bytes": b"\x00\x01\xff", "long_bytes": b"y" * 300,
    "tuple": (1, "a"), "tuple3": (1, 2, 3), "tuple5": (1, 2, 3, 4, 5), "empty_tuple": (),
    "list": list(range(2500)), "empty_list": [], "nested": [[1], {"k": [None]}],
    "shared_a": shared, "shared_b": shared,
    "set": {4, 5}, "frozenset": frozenset({6}),
    "dict": {1: "int key", "s": 2},
}
for proto in (2, 3, 4, 5):
    with open(f"{sys.argv[1]}/value.p{proto}", "wb") as f:
        pickle.dump(value, f, protocol=proto)
)PY";

std::string error_of(std::string_view bytes) {
  try {
    fx::parse_pickle(bytes, "test.pickle");
  } catch (const fx::ForensicsError& e) {
    return e.what();
  }
  return "(no error)";
}

std::int64_t int_at(const PickleValue& d, const char* key) {
  const PickleValue* v = d.find(key);
  REQUIRE(v);
  REQUIRE(v->is_int());
  return v->as_int();
}

}  // namespace

TEST_CASE("pickles written by Python, protocols 2 to 5", "[pickle]") {
  const auto python = fx::testing::python();
  if (!python) GPUMEM_SKIP("GPUMEM_PYTHON is not set (scripts/setup.sh sets it); skipping Python-written pickles");
  TempDir dir;
  const std::string script = dir.file("write.py");
  fx::testing::write_file(script, kWriteValues);
  REQUIRE(fx::testing::run_python(*python, script, "'" + dir.file("") + "'") == 0);
  for (int proto = 2; proto <= 5; ++proto) {
    INFO("protocol " << proto);
    const PickleValue d = fx::read_pickle_file(dir.file("value.p" + std::to_string(proto)));
    REQUIRE(d.is_dict());
    CHECK(d.find("none")->is_none());
    CHECK(d.find("true")->as_bool());
    CHECK_FALSE(d.find("false")->as_bool());
    CHECK(int_at(d, "small") == 7);
    CHECK(int_at(d, "byte") == 255);
    CHECK(int_at(d, "short") == 65535);
    CHECK(int_at(d, "neg") == -5);
    CHECK(int_at(d, "int32") == -2147483648LL);
    CHECK(int_at(d, "big") == 140524012961792LL);
    CHECK(int_at(d, "max64") == INT64_MAX);
    CHECK(int_at(d, "min64") == INT64_MIN);
    CHECK(d.find("float")->as_float() == 0.1);
    CHECK(d.find("negfloat")->as_float() == -2.5e300);
    CHECK(d.find("str")->as_string() == "hello");
    CHECK(d.find("unicode")->as_string() == "gr\xc3\xbc\xc3\x9f \xe2\x98\x83");
    CHECK(d.find("long_str")->as_string() == std::string(300, 'x'));
    CHECK(d.find("bytes")->is_bytes());
    CHECK(d.find("bytes")->as_string() == std::string("\x00\x01\xff", 3));
    CHECK(d.find("long_bytes")->as_string() == std::string(300, 'y'));
    CHECK(d.find("tuple")->is_tuple());
    CHECK(d.find("tuple")->items()[1].as_string() == "a");
    CHECK(d.find("tuple3")->items().size() == 3);
    CHECK(d.find("tuple5")->items()[4].as_int() == 5);
    CHECK(d.find("empty_tuple")->items().empty());
    const auto& list = d.find("list")->items();
    REQUIRE(list.size() == 2500);
    CHECK(list[2499].as_int() == 2499);
    CHECK(d.find("empty_list")->items().empty());
    CHECK(d.find("nested")->items()[1].find("k")->items()[0].is_none());
    // The same list object twice: the memo gives both keys one shared list.
    CHECK(&d.find("shared_a")->items() == &d.find("shared_b")->items());
    CHECK(d.find("set")->is_set());
    CHECK(d.find("set")->items().size() == 2);
    CHECK(d.find("frozenset")->items()[0].as_int() == 6);
    const PickleValue& inner = *d.find("dict");
    REQUIRE(inner.dict_items().size() == 2);
    CHECK(inner.dict_items()[0].first.as_int() == 1);
    CHECK(inner.find("s")->as_int() == 2);
  }
}

TEST_CASE("handmade opcodes: protocol 0 text forms, LONG4, libtorch's list wrappers", "[pickle]") {
  // {'a': 12, 'b': 'hi', 'c': [1.5], 'd': True} in protocol 0 text opcodes.
  const std::string p0 = "(dp0\nVa\np1\nI12\nsVb\np2\nS'hi'\np3\nsVc\n(lp4\nF1.5\nasVd\nI01\ns.";
  const PickleValue v = fx::parse_pickle(p0, "p0");
  CHECK(v.find("a")->as_int() == 12);
  CHECK(v.find("b")->as_string() == "hi");
  CHECK(v.find("c")->items()[0].as_float() == 1.5);
  CHECK(v.find("d")->as_bool());

  // LONG4 of -2 (one byte 0xfe), then STOP.
  const std::string long4 = std::string("\x80\x02\x8b\x01\x00\x00\x00\xfe.", 9);
  CHECK(fx::parse_pickle(long4, "long4").as_int() == -2);

  // torch.jit._pickle.build_intlist([1, 2]) as libtorch's pickler writes typed lists.
  const std::string jit = std::string("\x80\x02") + "ctorch.jit._pickle\nbuild_intlist\n" + "]" + "(K\x01K\x02" +
                          "e" + "\x85" + "R" + ".";
  const PickleValue l = fx::parse_pickle(jit, "jit");
  REQUIRE(l.is_list());
  CHECK(l.items().size() == 2);
  CHECK(l.items()[1].as_int() == 2);
}

TEST_CASE("every truncation of a pickle is one error with a byte offset", "[pickle]") {
  // {'segments': [], 'n': [1, 'x']} in protocol 2.
  static const char kBytes[] =
      "\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\x01\x00\x00\x00nq\x03]q\x04(K\x01X\x01"
      "\x00\x00\x00xq\x05" "eu.";
  const std::string good(kBytes, sizeof(kBytes) - 1);
  REQUIRE(good.size() == 49);
  const PickleValue ok = fx::parse_pickle(good, "good");
  REQUIRE(ok.is_dict());
  REQUIRE(ok.find("n")->items().size() == 2);
  for (std::size_t cut = 1; cut < good.size(); ++cut) {
    INFO("cut at " << cut);
    const std::string err = error_of(std::string_view(good).substr(0, cut));
    CHECK(err.find("test.pickle: byte offset") != std::string::npos);
  }
}

TEST_CASE("corrupt and unsupported pickles are one clear error", "[pickle]") {
  CHECK(error_of("").find("empty") != std::string::npos);
  CHECK(error_of("\x80\x02\xff.").find("byte offset 2: byte 0xff is not a pickle opcode") != std::string::npos);
  CHECK(error_of("\x80\x09N.").find("protocol 9") != std::string::npos);
  CHECK(error_of("\x80\x02h\x05.").find("memo entry 5") != std::string::npos);
  CHECK(error_of("\x80\x02s.").find("stack is empty") != std::string::npos);
  const std::string global = "\x80\x02" "cos\nsystem\n" "X\x02\x00\x00\x00ls" "\x85R.";
  const std::string err = error_of(global);
  CHECK(err.find("os.system") != std::string::npos);
  CHECK(err.find("byte offset 2") != std::string::npos);
  CHECK(error_of("\x80\x02\x81.").find("NEWOBJ") != std::string::npos);
  CHECK(error_of(std::string("\x80\x02K\x01K\x02.", 7)).find("unbalanced") != std::string::npos);
  CHECK(error_of(std::string("\x80\x02X\xff\xff\xff\x7f", 7)).find("larger than the whole pickle") != std::string::npos);
}
