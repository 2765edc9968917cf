// gpumem's private jemalloc: the declarations of the few entry points the pinned allocator calls,
// under the names the build gave them (pinned/cmake/rename_jemalloc.cmake renames every public
// symbol of Debian's libjemalloc_pic.a to gpumem_je_*). jemalloc's own header provides the types
// and flags (extent_hooks_t, MALLOCX_*); JEMALLOC_NO_RENAME keeps it from mapping je_* names to the
// unprefixed malloc/free, and the defines below map them to the renamed symbols instead.
//
// Only src/ of this module includes this header.
#pragma once

#define JEMALLOC_NO_RENAME
#define je_mallocx gpumem_je_mallocx
#define je_dallocx gpumem_je_dallocx
#define je_sdallocx gpumem_je_sdallocx
#define je_nallocx gpumem_je_nallocx
#define je_sallocx gpumem_je_sallocx
#define je_mallctl gpumem_je_mallctl
#define je_mallctlnametomib gpumem_je_mallctlnametomib
#define je_mallctlbymib gpumem_je_mallctlbymib
#define je_malloc_conf gpumem_je_malloc_conf
#define je_malloc_message gpumem_je_malloc_message
// Declared by the header but never called here; mapped so no declaration names a libc function.
#define je_malloc gpumem_je_malloc
#define je_calloc gpumem_je_calloc
#define je_posix_memalign gpumem_je_posix_memalign
#define je_aligned_alloc gpumem_je_aligned_alloc
#define je_realloc gpumem_je_realloc
#define je_free gpumem_je_free
#define je_rallocx gpumem_je_rallocx
#define je_xallocx gpumem_je_xallocx
#define je_malloc_stats_print gpumem_je_malloc_stats_print
#define je_malloc_usable_size gpumem_je_malloc_usable_size
#define je_memalign gpumem_je_memalign
#define je_valloc gpumem_je_valloc
#include <jemalloc/jemalloc.h>
