#include "gpumem/view/active_memory.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "gpumem/forensics/error.h"
#include "gpumem/forensics/vocabulary.h"

namespace gpumem::view {

using forensics::TraceAction;

ActiveMemory ActiveMemory::build(const ViewerModel& model, GroupBy by, std::size_t top) {
  constexpr std::size_t K = kActiveCheckpointEvery;
  constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();
  ActiveMemory a;
  a.by_ = by;
  const std::size_t n = model.entry_count();
  a.entry_count_ = n;
  if (n >= kNone) {
    throw forensics::ForensicsError(model.source() + ": the Active view handles traces of fewer than 2^32 entries");
  }
  const auto& entries = model.trace().entries;

  // Group ids: one per group name; blocks map to them through their site (or op) index.
  std::vector<std::string> names;
  std::unordered_map<std::string, std::uint32_t> id_of_name;
  std::vector<std::uint32_t> id_of_key;
  const auto group_of = [&](const BlockInfo& b) -> std::uint32_t {
    const std::uint32_t key = by == GroupBy::op ? b.op : b.site;
    if (key >= id_of_key.size()) id_of_key.resize(key + 1, kNone);
    if (id_of_key[key] == kNone) {
      std::string name = group_name(model, b, by);
      const auto [it, inserted] = id_of_name.try_emplace(name, static_cast<std::uint32_t>(names.size()));
      if (inserted) names.push_back(std::move(name));
      id_of_key[key] = it->second;
    }
    return id_of_key[key];
  };

  // One replay of the blocks (as MemoryState::apply does), recording each change with its group.
  std::vector<std::uint64_t> bytes;  // per group, now
  std::vector<std::uint64_t> peak;   // per group
  const auto change = [&](std::uint32_t group, std::int64_t delta) {
    if (group >= bytes.size()) {
      bytes.resize(group + 1, 0);
      peak.resize(group + 1, 0);
    }
    bytes[group] = static_cast<std::uint64_t>(static_cast<std::int64_t>(bytes[group]) + delta);
    peak[group] = std::max(peak[group], bytes[group]);
  };
  struct Live {
    std::uint32_t group;
    std::uint64_t bytes;
  };
  std::unordered_map<std::uint64_t, Live> live;
  const MemoryState initial = model.state_at(0);
  live.reserve(initial.blocks.size() * 2 + 1024);
  for (const auto& [addr, b] : initial.blocks) {
    const std::uint32_t g = group_of(b);
    live[addr] = Live{g, b.size_bytes};
    change(g, static_cast<std::int64_t>(b.size_bytes));
  }
  const std::vector<std::uint64_t> initial_bytes = bytes;
  std::vector<Event> events;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& e = entries[i];
    const auto entry = static_cast<std::uint32_t>(i);
    if (e.action == TraceAction::alloc) {
      BlockInfo b;
      b.site = e.site;
      b.op = model.entry_op(i);
      const std::uint64_t block = model.entry_block_bytes(i) ? model.entry_block_bytes(i) : block_bytes_for(e.size_bytes);
      const std::uint32_t g = group_of(b);
      auto [it, inserted] = live.try_emplace(e.addr, Live{g, block});
      if (!inserted) {  // an alloc over a live block replaces it, as MemoryState::add_block does
        events.push_back(Event{entry, it->second.group, -static_cast<std::int64_t>(it->second.bytes)});
        change(it->second.group, -static_cast<std::int64_t>(it->second.bytes));
        it->second = Live{g, block};
      }
      events.push_back(Event{entry, g, static_cast<std::int64_t>(block)});
      change(g, static_cast<std::int64_t>(block));
    } else if (e.action == TraceAction::free_completed) {
      const auto it = live.find(e.addr);
      if (it == live.end()) continue;  // a free of a block the trace never showed
      events.push_back(Event{entry, it->second.group, -static_cast<std::int64_t>(it->second.bytes)});
      change(it->second.group, -static_cast<std::int64_t>(it->second.bytes));
      live.erase(it);
    }
  }

  // Rank the groups by their own peak; the top ones get a slot each, the rest share "other".
  const std::size_t groups = names.size();
  a.group_count_ = groups;
  a.nothing_recorded_ = groups == 1 && names[0] == forensics::kNotRecorded;
  peak.resize(groups, 0);
  std::vector<std::uint32_t> order(groups);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    if (peak[x] != peak[y]) return peak[x] > peak[y];
    return names[x] < names[y];
  });
  const std::size_t named = groups > top ? top : groups;
  std::vector<std::uint32_t> slot_of(groups, static_cast<std::uint32_t>(named));
  for (std::size_t r = 0; r < named; ++r) {
    slot_of[order[r]] = static_cast<std::uint32_t>(r);
    a.slots_.push_back(ActiveSlot{names[order[r]], peak[order[r]], 1, false});
  }
  if (groups > named) a.slots_.push_back(ActiveSlot{"other", 0, groups - named, true});
  const std::size_t slots = a.slots_.size();
  for (auto& ev : events) ev.slot = slot_of[ev.slot];
  a.events_ = std::move(events);

  // Checkpoints of the slot totals every K entries; the peak of "other" on the way.
  std::vector<std::uint64_t> now(slots, 0);
  for (std::size_t g = 0; g < initial_bytes.size(); ++g) now[slot_of[g]] += initial_bytes[g];
  std::uint64_t other_peak = slots > named ? now[named] : 0;
  std::size_t ei = 0;
  for (std::size_t c = 0; c * K <= n; ++c) {
    const std::size_t at = c * K;
    for (; ei < a.events_.size() && a.events_[ei].entry < at; ++ei) {
      const Event& ev = a.events_[ei];
      now[ev.slot] = static_cast<std::uint64_t>(static_cast<std::int64_t>(now[ev.slot]) + ev.delta_bytes);
      if (ev.slot == named) other_peak = std::max(other_peak, now[ev.slot]);
    }
    a.checkpoint_bytes_.insert(a.checkpoint_bytes_.end(), now.begin(), now.end());
    a.checkpoint_event_.push_back(ei);
  }
  for (; ei < a.events_.size(); ++ei) {
    if (a.events_[ei].slot == named) {
      now[named] = static_cast<std::uint64_t>(static_cast<std::int64_t>(now[named]) + a.events_[ei].delta_bytes);
      other_peak = std::max(other_peak, now[named]);
    }
  }
  if (slots > named) a.slots_.back().peak_bytes = other_peak;
  return a;
}

std::size_t ActiveMemory::advance(std::vector<std::uint64_t>& bytes, std::size_t from, std::size_t to) const {
  constexpr std::size_t K = kActiveCheckpointEvery;
  const std::size_t slots = slots_.size();
  std::size_t ei = 0;
  const std::size_t c = to / K;
  if (c * K > from || from == to) {
    // The checkpoint at or before `to` is past `from`: start there instead of replaying from `from`.
    std::copy_n(checkpoint_bytes_.begin() + static_cast<std::ptrdiff_t>(c * slots), slots, bytes.begin());
    ei = checkpoint_event_[c];
  } else {
    // Replay from `from`: its first event is at or after the checkpoint before it.
    ei = checkpoint_event_[from / K];
    while (ei < events_.size() && events_[ei].entry < from) ++ei;
  }
  std::size_t applied = 0;
  for (; ei < events_.size() && events_[ei].entry < to; ++ei, ++applied) {
    const Event& ev = events_[ei];
    bytes[ev.slot] = static_cast<std::uint64_t>(static_cast<std::int64_t>(bytes[ev.slot]) + ev.delta_bytes);
  }
  return applied;
}

std::vector<std::uint64_t> ActiveMemory::live_at(std::size_t applied) const {
  applied = std::min(applied, entry_count_);
  std::vector<std::uint64_t> bytes(slots_.size(), 0);
  advance(bytes, applied, applied);
  return bytes;
}

std::vector<ActiveSample> ActiveMemory::sample(std::span<const std::size_t> applied, std::size_t* events_replayed) const {
  std::vector<ActiveSample> out;
  out.reserve(applied.size());
  std::vector<std::uint64_t> bytes(slots_.size(), 0);
  std::size_t replayed = 0;
  // The state at the first moment comes from its checkpoint; each later one from the one before
  // (or its own checkpoint when that is closer).
  std::size_t at = SIZE_MAX;
  for (std::size_t k = 0; k < applied.size(); ++k) {
    const std::size_t to = std::min(applied[k], entry_count_);
    replayed += at == SIZE_MAX ? advance(bytes, to, to) : advance(bytes, std::min(at, to), to);
    at = to;
    ActiveSample s;
    s.applied = to;
    s.slot_bytes = bytes;
    s.total_bytes = std::accumulate(bytes.begin(), bytes.end(), std::uint64_t{0});
    out.push_back(std::move(s));
  }
  if (events_replayed) *events_replayed = replayed;
  return out;
}

bool ActiveMemory::check_invariants(const ViewerModel& model) const {
  constexpr std::size_t K = kActiveCheckpointEvery;
  const std::size_t slots = slots_.size();
  if (model.entry_count() != entry_count_ || checkpoint_event_.size() != entry_count_ / K + 1) return false;
  for (std::size_t c = 0; c < checkpoint_event_.size(); ++c) {
    std::uint64_t sum = 0;
    for (std::size_t s = 0; s < slots; ++s) sum += checkpoint_bytes_[c * slots + s];
    if (sum != model.allocated_at(c * K)) return false;
  }
  std::size_t ei = 0;
  for (std::size_t i = 0; i < entry_count_; ++i) {
    std::int64_t delta = 0;
    for (; ei < events_.size() && events_[ei].entry == i; ++ei) delta += events_[ei].delta_bytes;
    if (static_cast<std::int64_t>(model.allocated_at(i + 1) - model.allocated_at(i)) != delta) return false;
  }
  if (ei != events_.size()) return false;
  for (std::size_t s = 0; s + 1 < slots; ++s) {
    if (slots_[s].other) return false;
    if (!slots_[s + 1].other && slots_[s].peak_bytes < slots_[s + 1].peak_bytes) return false;
  }
  return true;
}

}  // namespace gpumem::view

namespace gpumem::view {

const ActiveMemory& ViewerModel::active_memory(GroupBy by) const {
  ActiveMemoryCache& cache = *active_cache_;
  const auto i = static_cast<std::size_t>(by);
  std::call_once(cache.once[i], [&] { cache.memory[i].emplace(ActiveMemory::build(*this, by)); });
  return *cache.memory[i];
}

}  // namespace gpumem::view
