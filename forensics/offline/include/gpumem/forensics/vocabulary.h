// The words and the number format every gpumem command prints: `gpumem report`, `diff`, `replay`,
// `view` and the OOM postmortem. docs/forensics.md ("Vocabulary") defines each term once; a test
// checks that every term listed here is defined there, so a command cannot print a word the docs
// do not explain.
//
// Memory at a moment (bytes):
//   reserved = requested + rounding + pending free + inactive split + cached free
//   reserved-unallocated = reserved - allocated = pending free + free
// with free = inactive split + cached free, split by the release unit (a classic segment; a 2 MiB
// page of an expandable segment): cached free could be returned to the device as it is,
// inactive split shares its release unit with live bytes.
//
// Bytes print with binary units and two decimals ("692.00 MiB", "7.31 GiB"), plain below 1 KiB
// ("512 B"); a missing op or call site prints as kNotRecorded.
//
// Thread-safety: pure functions and constants.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpumem::forensics {

// "512 B", "4.00 KiB", "692.00 MiB", "7.31 GiB", "1.50 TiB".
std::string format_bytes(std::uint64_t bytes);
// "+4.00 KiB", "-1.00 GiB", "0 B".
std::string format_signed_bytes(std::int64_t bytes);
// "73%" (part of whole, rounded; "0%" when whole is 0).
std::string format_share(std::uint64_t part, std::uint64_t whole);
// "+1.234 s" / "+12.3 ms": a time since the start of a trace.
std::string format_elapsed_us(std::int64_t us);

// What a report prints for an op or call site the file does not record.
inline constexpr std::string_view kNotRecorded = "(not recorded)";
// What it prints for memory reserved before a trace's first entry (no op or site can be known).
inline constexpr std::string_view kBeforeTrace = "(before the trace)";

// The terms of the memory identity above, and the other words reports use for memory, each
// defined in docs/forensics.md.
namespace term {
inline constexpr std::string_view reserved = "reserved";
inline constexpr std::string_view allocated = "allocated";
inline constexpr std::string_view requested = "requested";
inline constexpr std::string_view rounding = "rounding";
inline constexpr std::string_view pending_free = "pending free";
inline constexpr std::string_view free = "free";
inline constexpr std::string_view inactive_split = "inactive split";
inline constexpr std::string_view cached_free = "cached free";
inline constexpr std::string_view reserved_unallocated = "reserved-unallocated";
inline constexpr std::string_view largest_free_extent = "largest free extent";
inline constexpr std::string_view external_fragmentation = "external fragmentation";
inline constexpr std::string_view unmapped = "unmapped";
}  // namespace term

inline constexpr std::array<std::string_view, 12> kTerms = {
    term::reserved,       term::allocated,   term::requested,         term::rounding,
    term::pending_free,   term::free,        term::inactive_split,    term::cached_free,
    term::reserved_unallocated, term::largest_free_extent, term::external_fragmentation, term::unmapped};

// The verdicts of reports, each defined in docs/forensics.md ("Verdicts").
inline constexpr std::array<std::string_view, 8> kVerdicts = {
    // at an OOM
    "fragmentation", "pending_frees", "outside_memory", "capacity",
    // at any other moment (fragmentation and pending_frees too)
    "caching", "rounding", "compact", "empty"};

}  // namespace gpumem::forensics
