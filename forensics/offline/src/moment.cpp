#include "gpumem/forensics/moment.h"

#include <charconv>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "gpumem/forensics/error.h"
#include "gpumem/forensics/vocabulary.h"

namespace gpumem::forensics {
namespace {

using Kind = MomentSpec::Kind;

std::uint64_t block_bytes_for(std::uint64_t requested) noexcept {
  return requested < 512 ? 512 : (requested + 511) / 512 * 512;
}

std::optional<std::int64_t> parse_time_us(std::string_view v) {
  double number = 0;
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, number);
  if (ec != std::errc() || number < 0 || !std::isfinite(number)) return std::nullopt;
  const std::string_view unit(p, static_cast<std::size_t>(end - p));
  double scale = 0;
  if (unit == "s") scale = 1e6;
  else if (unit == "ms") scale = 1e3;
  else if (unit == "us") scale = 1;
  else return std::nullopt;
  return static_cast<std::int64_t>(std::llround(number * scale));
}

}  // namespace

std::string_view moment_forms() noexcept {
  return "oom, peak, alloc-peak, entry:N (after the first N trace entries) or time:T (T after the first entry, "
         "with a unit: 2.5s, 300ms, 120us)";
}

std::optional<MomentSpec> parse_moment(std::string_view text, std::string* error) {
  MomentSpec m;
  auto fail = [&](std::string_view why) -> std::optional<MomentSpec> {
    if (error) *error = fmt::format("'{}' is not a moment{}; give {}", text, why, moment_forms());
    return std::nullopt;
  };
  if (text == "oom") {
    m.kind = Kind::oom;
  } else if (text == "peak") {
    m.kind = Kind::peak_reserved;
  } else if (text == "alloc-peak") {
    m.kind = Kind::peak_allocated;
  } else if (text.starts_with("entry") && text.size() > 6 && (text[5] == ':' || text[5] == ' ' || text[5] == '=')) {
    const std::string_view v = text.substr(6);
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), m.entry);
    if (ec != std::errc() || end != v.data() + v.size()) return fail(" (N is a whole number of entries)");
    m.kind = Kind::entry;
  } else if (text.starts_with("time") && text.size() > 5 && (text[4] == ':' || text[4] == ' ' || text[4] == '=')) {
    const auto us = parse_time_us(text.substr(5));
    if (!us) return fail(" (T is a time with a unit)");
    m.kind = Kind::time;
    m.time_us = *us;
  } else {
    return fail("");
  }
  return m;
}

std::string_view Moment::kind_name() const noexcept {
  switch (kind) {
    case Kind::automatic:
    case Kind::oom: return "oom";
    case Kind::peak_reserved: return "peak";
    case Kind::peak_allocated: return "alloc-peak";
    case Kind::entry: return "entry";
    case Kind::time: return "time";
  }
  return "peak";
}

std::string Moment::describe() const {
  const std::string when = format_elapsed_us(elapsed_us);
  switch (kind) {
    case Kind::automatic:
    case Kind::oom:
      return fmt::format("the OOM (trace entry {} of {}, {})", oom_entry.value_or(applied), entries, when);
    case Kind::peak_reserved:
      return fmt::format("the peak of reserved bytes (after entry {} of {}, {})", applied, entries, when);
    case Kind::peak_allocated:
      return fmt::format("the peak of allocated bytes (after entry {} of {}, {})", applied, entries, when);
    case Kind::entry: return fmt::format("after entry {} of {} ({})", applied, entries, when);
    case Kind::time: return fmt::format("after entry {} of {} ({})", applied, entries, when);
  }
  return {};
}

Moment resolve_moment(const Snapshot& snap, int device, const MomentSpec& spec) {
  static const std::vector<SnapshotTraceEntry> kEmpty;
  const auto& trace = device >= 0 && static_cast<std::size_t>(device) < snap.device_traces.size()
                          ? snap.device_traces[static_cast<std::size_t>(device)]
                          : kEmpty;
  const std::size_t n = trace.size();
  Moment m;
  m.entries = n;
  std::optional<std::size_t> last_oom;
  for (std::size_t i = n; i-- > 0;) {
    if (trace[i].action == TraceAction::oom) {
      last_oom = i;
      break;
    }
  }
  Kind kind = spec.kind;
  if (kind == Kind::automatic) kind = last_oom ? Kind::oom : Kind::peak_reserved;
  m.kind = kind;
  switch (kind) {
    case Kind::automatic:
    case Kind::oom:
      if (!last_oom) {
        throw ForensicsError(fmt::format("{}: the trace of device {} records no OOM (no oom entry); leave out "
                                         "--at oom, or give {}",
                                         snap.source, device, moment_forms()));
      }
      m.oom_entry = last_oom;
      m.applied = *last_oom;
      break;
    case Kind::peak_reserved: {
      // Reserved relative to before the trace; the first entry after which it is highest (the
      // start when it only falls; the end when the trace records no segment entries), moved on
      // while reserved stays there to where the most is allocated (a segment is reserved for the
      // allocation that follows it).
      std::int64_t reserved = 0, best = 0, allocated = 0, best_allocated = 0;
      std::unordered_map<std::uint64_t, std::int64_t> live;  // addr -> requested bytes
      bool any_segment = false, at_peak = false;
      m.applied = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const auto& e = trace[i];
        const auto size = static_cast<std::int64_t>(e.size_bytes);
        if (e.action == TraceAction::alloc) {
          if (auto old = live.find(e.addr); old != live.end()) allocated -= old->second;
          live[e.addr] = size;
          allocated += size;
          if (at_peak && allocated > best_allocated) {
            best_allocated = allocated;
            m.applied = i + 1;
          }
          continue;
        }
        if (e.action == TraceAction::free_completed) {
          if (auto it = live.find(e.addr); it != live.end()) {
            allocated -= it->second;
            live.erase(it);
          }
          continue;
        }
        if (e.action == TraceAction::segment_alloc || e.action == TraceAction::segment_map) reserved += size;
        else if (e.action == TraceAction::segment_free || e.action == TraceAction::segment_unmap) reserved -= size;
        else continue;
        any_segment = true;
        at_peak = false;
        if (reserved > best) {
          best = reserved;
          best_allocated = allocated;
          m.applied = i + 1;
          at_peak = true;
        }
      }
      if (!any_segment) m.applied = n;
      break;
    }
    case Kind::peak_allocated: {
      // Exact block sizes where the snapshot still holds the block (as the viewer counts them).
      std::unordered_map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> exact;  // addr -> request, size
      for (const auto& seg : snap.segments) {
        if (seg.device != device) continue;
        for (const auto& b : seg.blocks)
          if (b.state != "inactive") exact[b.address] = {b.requested_bytes, b.size_bytes};
      }
      std::unordered_map<std::uint64_t, std::uint64_t> live;  // addr -> block bytes
      std::uint64_t allocated = 0, best = 0;
      m.applied = n;
      bool any = false;
      for (std::size_t i = 0; i < n; ++i) {
        const auto& e = trace[i];
        if (e.action == TraceAction::alloc) {
          std::uint64_t bytes = block_bytes_for(e.size_bytes);
          if (auto it = exact.find(e.addr); it != exact.end() && it->second.first == e.size_bytes) bytes = it->second.second;
          if (auto old = live.find(e.addr); old != live.end()) allocated -= old->second;
          live[e.addr] = bytes;
          allocated += bytes;
          if (allocated > best || !any) {
            best = allocated;
            m.applied = i + 1;
            any = true;
          }
        } else if (e.action == TraceAction::free_completed) {
          if (auto it = live.find(e.addr); it != live.end()) {
            allocated -= it->second;
            live.erase(it);
          }
        }
      }
      break;
    }
    case Kind::entry:
      if (spec.entry > n) {
        throw ForensicsError(fmt::format("{}: entry:{} is past the end of device {}'s trace, which has {} entries; "
                                         "give entry:0 to entry:{}",
                                         snap.source, spec.entry, device, n, n));
      }
      m.applied = spec.entry;
      break;
    case Kind::time: {
      if (n == 0) {
        throw ForensicsError(fmt::format("{}: device {} has no trace, so time:T has no meaning; leave out --at",
                                         snap.source, device));
      }
      const std::int64_t start = trace.front().time_us;
      const std::int64_t last = trace.back().time_us - start;
      if (spec.time_us > last) {
        throw ForensicsError(fmt::format("{}: time:{} is past the end of device {}'s trace, which lasts {}; give "
                                         "a time up to that",
                                         snap.source, format_elapsed_us(spec.time_us).substr(1), device,
                                         format_elapsed_us(last).substr(1)));
      }
      std::size_t applied = 0;
      while (applied < n && trace[applied].time_us - start <= spec.time_us) ++applied;
      m.applied = applied;
      break;
    }
  }
  if (n > 0) {
    const std::size_t at = m.oom_entry ? *m.oom_entry : (m.applied == 0 ? 0 : m.applied - 1);
    m.time_us = trace[at].time_us;
    m.elapsed_us = m.time_us - trace.front().time_us;
  }
  return m;
}

}  // namespace gpumem::forensics
