// The public functions that allocate host memory (layouts, indexes, configs) return a Status, so
// std::bad_alloc must not leave them: it becomes kOutOfMemory, naming what was being built.
// Host-only common layer.
#pragma once

#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "sciattn/status.h"

namespace sciattn::detail {

// Returns f()'s Status, or kOutOfMemory ("<what>: the host is out of memory") when it throws
// std::bad_alloc (std::length_error too: a vector asked for more than it can address).
template <typename F>
Status status_of_allocating(const char* what, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  return Status(StatusCode::kOutOfMemory,
                std::string(what) +
                    ": the host is out of memory (free some, or use a larger block or a shorter "
                    "length)");
}

}  // namespace sciattn::detail
