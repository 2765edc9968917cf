// gpumem/torch/memory_stats.h: statistics, snapshots and engines by c10::Device.
#include "gpumem/torch/memory_stats.h"

#include <c10/util/Exception.h>

#include "c10_stats.h"
#include "engines.h"
#include "gpumem/forensics/engine_snapshot.h"
#include "gpumem/forensics/snapshot_writer.h"

namespace gpumem::torch {
namespace {

detail::DeviceEngine& existing_engine(c10::Device device) {
  detail::DeviceEngine* de = detail::find_engine(device);
  TORCH_CHECK(de != nullptr, "gpumem: no gpumem engine serves ", device.str(),
              device.is_cpu() ? " (call gpumem::torch::install_cpu() first)"
                              : " (install gpumem and allocate on that device first)");
  return *de;
}

}  // namespace

DeviceStats stats(c10::Device device) {
  if (detail::DeviceEngine* de = detail::find_engine(device)) return detail::to_c10_stats(*de);
  return DeviceStats{};
}

void reset_peak_stats(c10::Device device) {
  if (detail::DeviceEngine* de = detail::find_engine(device)) de->stats->reset_peak();
}

void reset_accumulated_stats(c10::Device device) {
  if (detail::DeviceEngine* de = detail::find_engine(device)) de->stats->reset_accumulated();
}

std::map<std::string, std::int64_t> memory_stats(c10::Device device) {
  alloc::DeviceStatsView view;
  if (detail::DeviceEngine* de = detail::find_engine(device)) {
    view = de->stats->stats();
  } else {
    view.max_split_size = -1;
  }
  std::map<std::string, std::int64_t> out;
  for (auto& [key, value] : alloc::to_memory_stats(view)) out.emplace(std::move(key), value);
  for (auto& [key, value] : alloc::to_gpumem_stats(view)) out.emplace(std::move(key), value);
  return out;
}

alloc::EngineSnapshot engine_snapshot(c10::Device device) { return existing_engine(device).engine->snapshot(); }

std::vector<alloc::AllocEvent> trace_events(c10::Device device) {
  std::vector<alloc::AllocEvent> events;
  if (detail::DeviceEngine* de = detail::find_engine(device)) {
    for (const auto& record : de->trace->history()) events.push_back(record.event);
  }
  return events;
}

void write_snapshot(c10::Device device, const std::string& path) {
  detail::DeviceEngine& de = existing_engine(device);
  forensics::Snapshot snap;
  if (de.forensics) {
    snap = de.forensics->snapshot();
  } else {
    forensics::EngineSnapshotExtras extras;
    const alloc::ProviderMemInfo mem = de.source->mem_info();
    extras.device_total_bytes = mem.total_bytes;
    extras.device_free_bytes = mem.free_bytes;
    std::vector<forensics::PoolEngineView> pools;
    if (de.pool_engines) pools = de.pool_engines();
    extras.pools = pools;
    const std::vector<forensics::TraceRecord> records = de.trace->history();
    snap = forensics::snapshot_from_engine(de.engine->snapshot(), records, extras);
    snap.gpumem.settings = to_string(de.config);
  }
  try {
    forensics::write_snapshot(snap, path);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gpumem: cannot write the snapshot of ", device.str(), ": ", e.what());
  }
}

alloc::CachingAllocator* engine(c10::Device device) {
  detail::DeviceEngine* de = detail::find_engine(device);
  return de ? de->engine.get() : nullptr;
}

}  // namespace gpumem::torch
