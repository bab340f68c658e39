// The memory ledger of the trainer. Trainer layer (host code).
#include "sciattn/train/memory_ledger.h"

#include <sys/resource.h>

#include <cstdio>
#include <sstream>

namespace sciattn::train {

void MemoryLedger::add(std::string name, std::string category, Device device, uint64_t bytes,
                       unsigned phases) {
  entries_.push_back({std::move(name), std::move(category), device, bytes, phases});
}

uint64_t MemoryLedger::total(Device device) const {
  uint64_t n = 0;
  for (const LedgerEntry& e : entries_) n += e.device == device ? e.bytes : 0;
  return n;
}

uint64_t MemoryLedger::phase_bytes(Device device, Phase phase) const {
  uint64_t n = 0;
  for (const LedgerEntry& e : entries_) {
    if (e.device == device && (e.phases & phase) != 0) n += e.bytes;
  }
  return n;
}

std::string format_bytes(uint64_t bytes) {
  char text[32];
  const double b = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(text, sizeof text, "%.2f GiB", b / (1u << 30));
  } else if (bytes >= (uint64_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.1f MiB", b / (1u << 20));
  } else if (bytes >= (uint64_t{1} << 10)) {
    std::snprintf(text, sizeof text, "%.1f KiB", b / (1u << 10));
  } else {
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  }
  return text;
}

uint64_t peak_resident_bytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string MemoryLedger::report() const {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-58s %-13s %-5s %12s  %s\n", "buffer", "category", "where",
                "bytes", "phases (F forward, B backward, O optimizer)");
  out << line;
  for (const LedgerEntry& e : entries_) {
    std::string phases;
    phases += (e.phases & kPhaseForward) ? "F" : "-";
    phases += (e.phases & kPhaseBackward) ? "B" : "-";
    phases += (e.phases & kPhaseOptimizer) ? "O" : "-";
    std::snprintf(line, sizeof line, "%-58s %-13s %-5s %12s  %s\n", e.name.c_str(),
                  e.category.c_str(), device_name(e.device), format_bytes(e.bytes).c_str(),
                  phases.c_str());
    out << line;
  }
  for (Device d : {Device::kCpu, Device::kCuda}) {
    if (total(d) == 0) continue;
    std::snprintf(line, sizeof line,
                  "%s: allocated %s; used per phase: forward %s, backward %s, optimizer %s\n",
                  device_name(d), format_bytes(total(d)).c_str(),
                  format_bytes(phase_bytes(d, kPhaseForward)).c_str(),
                  format_bytes(phase_bytes(d, kPhaseBackward)).c_str(),
                  format_bytes(phase_bytes(d, kPhaseOptimizer)).c_str());
    out << line;
  }
  return out.str();
}

}  // namespace sciattn::train
