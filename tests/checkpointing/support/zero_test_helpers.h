// Small helpers shared by the ZeRO test files (which compile as one unity translation unit).
#pragma once

#include <exception>
#include <string>

namespace gpumem::zero::testing {

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The message of what fn throws, or "(no error)".
template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace gpumem::zero::testing
