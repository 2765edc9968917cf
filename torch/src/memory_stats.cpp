// gpumem/torch/memory_stats.h: statistics, snapshots and engines by c10::Device.
#include "gpumem/torch/memory_stats.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "c10_stats.h"
#include "engines.h"
#include "gpumem/forensics/engine_snapshot.h"
#include "gpumem/forensics/snapshot_writer.h"
#if defined(GPUMEM_HAVE_CUDA)
#include "gpumem/alloc/cuda_sources.h"
#endif

namespace gpumem::torch {
namespace {

detail::DeviceEngine& existing_engine(c10::Device device) {
  detail::DeviceEngine* de = detail::find_engine(device);
  TORCH_CHECK(de != nullptr, "gpumem: no gpumem engine serves ", device.str(),
              device.is_cpu() ? " (call gpumem::torch::install_cpu() first)"
                              : " (install gpumem and allocate on that device first)");
  return *de;
}

// Note [Driver and wait keys]: where a step's time goes in the driver and in stream waits.
// gpumem.driver.<call>.{calls,ns,max_ns}: the CUDA VMM source's driver calls (CudaVmmCallTimes);
// gpumem.wait.{sync_stream,sync_event}.* and gpumem.event.{record,query}.*: the device's CUDA
// stream events (CudaEventCallTimes). Host wall time, cumulative since the engine was made (the
// device's private pools share its source and events, so they are included); not reset by
// reset_accumulated_stats, so readers take differences. gpumem.driver.timed / gpumem.wait.timed
// say whether the numbers are measured (1) or the source / events are not CUDA ones (0: the keys
// are present and zero: source:cuda_malloc, source:sim, the CPU engine, no engine yet).
struct CallTime {
  std::uint64_t calls = 0, total_ns = 0, max_ns = 0;
};

#if defined(GPUMEM_HAVE_CUDA)
CallTime copy(const alloc::CudaCallTime& t) { return {t.calls, t.total_ns, t.max_ns}; }
#endif

void add_call_keys(std::map<std::string, std::int64_t>& out, const std::string& prefix,
                   std::initializer_list<std::pair<const char*, CallTime>> keys) {
  for (const auto& [name, time] : keys) {
    const std::string base = prefix + name;
    out[base + ".calls"] = static_cast<std::int64_t>(time.calls);
    out[base + ".ns"] = static_cast<std::int64_t>(time.total_ns);
    out[base + ".max_ns"] = static_cast<std::int64_t>(time.max_ns);
  }
}

void add_driver_and_wait_keys(const detail::DeviceEngine* de, std::map<std::string, std::int64_t>& out) {
  CallTime reserve, address_free, create, release, map, set_access, unmap;
  CallTime sync_stream, sync_event, record, query;
  bool driver_timed = false, waits_timed = false;
#if defined(GPUMEM_HAVE_CUDA)
  if (de != nullptr) {
    if (const auto* vmm = dynamic_cast<const alloc::CudaVmmSource*>(&de->source->inner())) {
      const alloc::CudaVmmCallTimes t = vmm->call_times();
      reserve = copy(t.address_reserve);
      address_free = copy(t.address_free);
      create = copy(t.create);
      release = copy(t.release);
      map = copy(t.map);
      set_access = copy(t.set_access);
      unmap = copy(t.unmap);
      driver_timed = true;
    }
    if (const auto* events = dynamic_cast<const alloc::CudaStreamEvents*>(de->device_events.get())) {
      const alloc::CudaEventCallTimes t = events->call_times();
      sync_stream = copy(t.synchronize_stream);
      sync_event = copy(t.synchronize);
      record = copy(t.record);
      query = copy(t.query);
      waits_timed = true;
    }
  }
#else
  (void)de;
#endif
  out["gpumem.driver.timed"] = driver_timed ? 1 : 0;
  out["gpumem.wait.timed"] = waits_timed ? 1 : 0;
  add_call_keys(out, "gpumem.driver.",
                {{"address_reserve", reserve},
                 {"address_free", address_free},
                 {"create", create},
                 {"release", release},
                 {"map", map},
                 {"set_access", set_access},
                 {"unmap", unmap}});
  add_call_keys(out, "gpumem.wait.", {{"sync_stream", sync_stream}, {"sync_event", sync_event}});
  add_call_keys(out, "gpumem.event.", {{"record", record}, {"query", query}});
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
  detail::DeviceEngine* de = detail::find_engine(device);
  if (de != nullptr) {
    view = de->stats->stats();
  } else {
    view.max_split_size = -1;
  }
  std::map<std::string, std::int64_t> out;
  for (auto& [key, value] : alloc::to_memory_stats(view)) out.emplace(std::move(key), value);
  for (auto& [key, value] : alloc::to_gpumem_stats(view)) out.emplace(std::move(key), value);
  add_driver_and_wait_keys(de, out);
  // Whether thread caches came on (Note [Thread caches]): with them on, a growth may pass up to
  // max(64 MiB, 0.5% of reserved) of their free memory, so a run's peak can depend on it. And how
  // often allocate/free took the engine's lock, and found it taken. Loads only: no engine lock.
  out["gpumem.thread_caches.on"] = de != nullptr && de->engine->thread_caches_on() ? 1 : 0;
  const alloc::EngineLockCounts locks = de != nullptr ? de->engine->lock_counts() : alloc::EngineLockCounts{};
  out["gpumem.engine_lock.acquisitions"] = static_cast<std::int64_t>(locks.acquisitions);
  out["gpumem.engine_lock.contended"] = static_cast<std::int64_t>(locks.contended);
  // Engines serving the device (arenas:N; 1 until a thread moved to an arena of its own).
  out["gpumem.arenas"] = de != nullptr ? static_cast<std::int64_t>(de->engine->arenas()) : 1;
  // recycle_churn: times the churn allowance opened (0 while the key is off). A load, no lock.
  out["gpumem.recycle_churn.openings"] = de != nullptr ? static_cast<std::int64_t>(de->engine->churn_openings()) : 0;
  // The step planner (step_plan:True): whether it is on, and what it did (counts since the engine
  // was made; arena_bytes is the arena in use now, 0 when none).
  const std::optional<alloc::StepPlanCounters> plan =
      de != nullptr ? de->engine->step_plan_counters() : std::optional<alloc::StepPlanCounters>{};
  const alloc::StepPlanCounters none;
  const alloc::StepPlanCounters& c = plan ? *plan : none;
  out["gpumem.step_plan.on"] = plan ? 1 : 0;
  out["gpumem.step_plan.marks"] = static_cast<std::int64_t>(c.marks);
  out["gpumem.step_plan.steps_found"] = static_cast<std::int64_t>(c.detected_steps);
  out["gpumem.step_plan.plans"] = static_cast<std::int64_t>(c.plans);
  out["gpumem.step_plan.fallbacks"] = static_cast<std::int64_t>(c.fallbacks);
  out["gpumem.step_plan.served_allocations"] = static_cast<std::int64_t>(c.served_allocations);
  out["gpumem.step_plan.served_steps"] = static_cast<std::int64_t>(c.served_steps);
  out["gpumem.step_plan.arena_bytes"] = static_cast<std::int64_t>(c.arena_bytes);
  // 1 once the planner stopped for good: plans that kept falling back, or threads that allocate at
  // the same time (the steps then have no order to repeat); calls then go straight to the engine.
  out["gpumem.step_plan.stopped"] = c.stopped ? 1 : 0;
  // Detection rests where nothing repeats (7 in 8 of the time at first, 112 in 113 after four
  // rests in a row): how often, and now.
  out["gpumem.step_plan.dormant_periods"] = static_cast<std::int64_t>(c.dormant_periods);
  out["gpumem.step_plan.dormant"] = c.dormant ? 1 : 0;
  // Steps laid out (on a thread of its own), how long the last layout took, and whether one is at
  // work now.
  out["gpumem.step_plan.layouts"] = static_cast<std::int64_t>(c.layouts);
  out["gpumem.step_plan.last_layout_us"] = static_cast<std::int64_t>(c.last_layout_us);
  out["gpumem.step_plan.laying_out"] = c.laying_out ? 1 : 0;
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
