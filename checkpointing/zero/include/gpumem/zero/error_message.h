// error_message(e): the text of an exception for a person to read. c10::Error's what() carries
// a C++ backtrace of libtorch's frames (dozens of lines, rarely what a user needs); this returns
// its message alone, and what() for every other exception.
//
// Thread-safety: a pure function.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace gpumem::zero {

inline std::string error_message(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace gpumem::zero
