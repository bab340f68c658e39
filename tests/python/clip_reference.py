"""The adaptive gradient-clipping rule of docs/training.md in plain Python: the specification the
C++ GradClipper (include/sciattn/train/grad_clip.h) is compared with, step by step."""

MAD_TO_SIGMA = 1.4826
TARGET_SPREADS = 3.0
EPSILON = 1e-6


def median(values):
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 == 1 else (s[n // 2 - 1] + s[n // 2]) / 2.0


class AdaptiveClipper:
    """tau starts at `threshold`; each applied step with global norm g:
        c = tau / (g + 1e-6) if that is below 1, else 1
        history += [g] (the last `history_window` kept)
        m = median(history); s = 1.4826 * median(|h - m|)
        tau = min(max(m + 3 s, (1 - a) tau), (1 + a) tau)"""

    def __init__(self, threshold, history_window, adjustment_factor):
        self.tau = threshold
        self.window = history_window
        self.a = adjustment_factor
        self.history = []

    def step(self, norm):
        tau = self.tau
        c = tau / (norm + EPSILON)
        coefficient = c if c < 1.0 else 1.0
        self.history.append(norm)
        self.history = self.history[-self.window:]
        m = median(self.history)
        spread = MAD_TO_SIGMA * median([abs(h - m) for h in self.history])
        target = m + TARGET_SPREADS * spread
        self.tau = min(max(target, (1.0 - self.a) * tau), (1.0 + self.a) * tau)
        return {"norm": norm, "threshold": tau, "coefficient": coefficient,
                "next_threshold": self.tau}
