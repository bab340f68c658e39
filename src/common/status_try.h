// SCIATTN_TRY(expr): evaluate a Status expression and return it from the calling function when it
// is an error. Host code that chains many fallible steps (argument checks, allocations, back-end
// calls, file I/O) keeps each step one line. Internal header of src/ (the checks in src/common and
// the trainer).
#pragma once

#include "sciattn/status.h"

#define SCIATTN_TRY(expr)               \
  do {                                  \
    ::sciattn::Status status_ = (expr); \
    if (!status_.ok()) return status_;  \
  } while (0)
