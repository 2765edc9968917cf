// ForensicsError: the one error a reader or the replay raises for input a user controls (a trace
// file, a snapshot, a policy name). Its message names the thing (the file, and the byte offset or
// line where it went wrong) and what to do about it; callers print it as it is.
//
// Thread-safety: a plain value.
#pragma once

#include <stdexcept>
#include <string>

namespace gpumem::forensics {

class ForensicsError : public std::runtime_error {
 public:
  explicit ForensicsError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace gpumem::forensics
