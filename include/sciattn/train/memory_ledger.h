// The memory ledger: what the trainer allocated, where, for what, and which phases of a step use
// it; printed by `sciattn train --memory`. Public API of the trainer (plain C++17).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sciattn/device.h"

namespace sciattn::train {

// Phases of a training step, as bits.
enum Phase : unsigned {
  kPhaseForward = 1u,
  kPhaseBackward = 2u,
  kPhaseOptimizer = 4u,
  kPhaseAll = 7u,
};

struct LedgerEntry {
  std::string name;      // "activations: layer inputs (checkpoints)", ...
  std::string category;  // "model states", "activations", "scratch"
  Device device = Device::kCpu;
  uint64_t bytes = 0;
  unsigned phases = kPhaseAll;  // the phases that read or write it
};

class MemoryLedger {
 public:
  void add(std::string name, std::string category, Device device, uint64_t bytes, unsigned phases);
  const std::vector<LedgerEntry>& entries() const { return entries_; }
  uint64_t total(Device device) const;
  // Bytes of the entries used in `phase` on `device`: what a phase needs at its peak when
  // everything else could be released or offloaded.
  uint64_t phase_bytes(Device device, Phase phase) const;
  // A table: one line per entry, then totals and per-phase sums per device.
  std::string report() const;

 private:
  std::vector<LedgerEntry> entries_;
};

// "1.50 GiB", "12.0 MiB", "640 B".
std::string format_bytes(uint64_t bytes);
// The process's peak resident set size in bytes (getrusage); 0 where unknown.
uint64_t peak_resident_bytes();

}  // namespace sciattn::train
