// Moment: the point of a trace a report, a diff or the viewer describes. `gpumem report --at`,
// `gpumem diff --at` take one of:
//   oom         the last OOM of the trace (the failed request; its oom entry and what follows are
//               undone)
//   peak        the peak of reserved bytes (the first entry after which reserved is highest,
//               moved on while reserved stays there to where the most is allocated)
//   alloc-peak  the peak of allocated bytes (live blocks, each its request rounded to 512 bytes
//               or the snapshot's exact size, as the viewer counts them)
//   entry:N     after the first N trace entries (the viewer's cursor N)
//   time:T      after the last entry at most T after the trace's first entry (T with a unit:
//               s, ms or us)
// and by default (MomentSpec::Kind::automatic) the OOM when the trace records one, else the peak
// of reserved bytes. A moment is `applied` entries: the state after the trace's first `applied`
// entries (0..entries); an OOM moment applies the entries before its oom entry.
//
// Thread-safety: free functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

struct MomentSpec {
  enum class Kind : std::uint8_t { automatic, oom, peak_reserved, peak_allocated, entry, time };
  Kind kind = Kind::automatic;
  std::size_t entry = 0;     // Kind::entry
  std::int64_t time_us = 0;  // Kind::time: after the trace's first entry
};

// Parses the forms above; nullopt with *error set ("'x' is not a moment; ...") otherwise.
std::optional<MomentSpec> parse_moment(std::string_view text, std::string* error);
// The accepted forms, for --help and errors.
std::string_view moment_forms() noexcept;

struct Moment {
  MomentSpec::Kind kind = MomentSpec::Kind::peak_reserved;  // never automatic once resolved
  std::size_t applied = 0;                // trace entries applied
  std::size_t entries = 0;                // trace entries in all
  std::optional<std::size_t> oom_entry;   // the oom entry, for an OOM moment
  std::int64_t time_us = 0;               // of the moment's last entry (the oom entry's for an OOM)
  std::int64_t elapsed_us = 0;            // time_us minus the trace's first entry's time

  // "the OOM (trace entry 16095 of 16096, +2.345 s)", "the peak of reserved bytes (after entry
  // 51234 of 104387, +12.3 s)", ...
  std::string describe() const;
  // "oom", "peak", "alloc-peak", "entry", "time" (the --at form it came from).
  std::string_view kind_name() const noexcept;
};

// Resolves spec against one device's trace (the snapshot's blocks give exact sizes for the
// allocated peak). Throws ForensicsError naming the file and the fix when the trace cannot have
// that moment (no OOM recorded, an entry or time past its end).
Moment resolve_moment(const Snapshot& snapshot, int device, const MomentSpec& spec);

}  // namespace gpumem::forensics
