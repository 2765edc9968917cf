// Reader of Python pickles (protocols 2 to 5) restricted to plain data: what
// torch.cuda.memory._dump_snapshot writes (pickle.dump of a dict of lists, dicts, str, int, float,
// bool and None), and what libtorch's C++ pickler writes for the same dict (which wraps typed
// lists in torch.jit._pickle.build_*list / restore_type_tag calls; those are unwrapped).
//
// Supported opcodes: PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE INT LONG BININT
// BININT1 BININT2 LONG1 LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE
// SHORT_BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 BYTEARRAY8 EMPTY_DICT DICT SETITEM
// SETITEMS EMPTY_LIST LIST APPEND APPENDS EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_SET ADDITEMS
// FROZENSET GET BINGET LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE, and GLOBAL/STACK_GLOBAL + REDUCE
// for the torch.jit._pickle helpers only. Anything else (objects of Python classes, persistent
// ids, out-of-band buffers) is an error.
//
// Errors: one ForensicsError naming the source and the byte offset of the opcode that failed.
// Bounds (read_limits.h): the values the machine builds (memo references included) are limited by
// ReadLimits::max_records, nesting by kMaxNestingDepth; a container that holds itself is refused.
// Any input gives a value or that error, in time linear in its size.
//
// Thread-safety: free functions; no shared state.
#pragma once

#include <string>
#include <string_view>

#include "gpumem/forensics/pickle_value.h"
#include "gpumem/forensics/read_limits.h"

namespace gpumem::forensics {

// Parses one pickle from bytes; `source` names it in error messages. Bytes after STOP are ignored.
PickleValue parse_pickle(std::string_view bytes, const std::string& source,
                         const ReadLimits& limits = default_read_limits());

// Reads a pickle file (gzip-compressed files are decompressed first).
PickleValue read_pickle_file(const std::string& path, const ReadLimits& limits = default_read_limits());

}  // namespace gpumem::forensics
