// Feeds gradient norms (one per line on stdin) through the adaptive clipper and prints what each
// step did as JSON lines, for tests/python/test_trainer.py to compare with its own implementation
// of the rule. Test layer (cpu).
//   train_clip_trace <threshold> <history_window> <adjustment_factor> < norms.txt
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "sciattn/train/grad_clip.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: train_clip_trace <threshold> <history_window> <adjustment_factor>\n";
    return 2;
  }
  sciattn::train::GradClipConfig c;
  c.mode = sciattn::train::ClipMode::kAdaptive;
  c.threshold = std::strtod(argv[1], nullptr);
  c.history_window = std::strtoll(argv[2], nullptr, 10);
  c.adjustment_factor = std::strtod(argv[3], nullptr);
  sciattn::Status s = sciattn::train::validate_grad_clip(c);
  if (!s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
  sciattn::train::GradClipper clipper(c);
  double norm;
  while (std::cin >> norm) {
    const sciattn::train::ClipStep step = clipper.step(norm);
    std::printf(
        "{\"norm\": %.17g, \"threshold\": %.17g, \"coefficient\": %.17g, "
        "\"next_threshold\": %.17g}\n",
        step.norm, step.threshold, step.coefficient, step.next_threshold);
  }
  return 0;
}
