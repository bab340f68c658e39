// SCIATTN_TRY(expr): evaluate a Status expression and return it from the calling function when it
// is an error. The trainer's host code chains many fallible steps (allocations, back-end calls,
// file I/O); this keeps each step one line. Trainer layer (internal header, src/train only).
#pragma once

#include "sciattn/status.h"

#define SCIATTN_TRY(expr)               \
  do {                                  \
    ::sciattn::Status status_ = (expr); \
    if (!status_.ok()) return status_;  \
  } while (0)
