#include "gpumem/forensics/alloc_context.h"

#include <utility>

namespace gpumem::forensics {
namespace {

thread_local std::shared_ptr<void> t_context;

}  // namespace

const std::shared_ptr<void>& AllocContext::current() noexcept { return t_context; }

void AllocContext::set(std::shared_ptr<void> context) noexcept { t_context = std::move(context); }

AllocContext::Scope::Scope(std::shared_ptr<void> context) noexcept : previous_(std::exchange(t_context, std::move(context))) {}

AllocContext::Scope::~Scope() { t_context = std::move(previous_); }

}  // namespace gpumem::forensics
