"""Reading one section of a DeepSpeed config (a dict) the way the trainer's parser does: known keys
only, "auto" refused by name, types checked, every error naming the key."""
import math

_MISSING = object()


class Section:
    """The keys of one config object, read one by one; finish() rejects the keys left over."""

    def __init__(self, value, path):
        if not isinstance(value, dict):
            raise ValueError(f"{path} must be an object (a dict); got {type(value).__name__}")
        self.value = value
        self.path = path
        self.read = set()

    def _get(self, key):
        self.read.add(key)
        v = self.value.get(key, _MISSING)
        if v == "auto":
            raise ValueError(f'{self.path}.{key} is "auto", which only a trainer can fill; give a '
                             "value")
        return v

    def number(self, key, default):
        v = self._get(key)
        if v is _MISSING or v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{self.path}.{key} must be a finite number; got {v!r}")
        return float(v)

    def integer(self, key, default, minimum=None):
        v = self._get(key)
        if v is _MISSING or v is None:
            return default
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{self.path}.{key} must be an integer; got {v!r}")
        if minimum is not None and v < minimum:
            raise ValueError(f"{self.path}.{key} must be >= {minimum}; got {v}")
        return v

    def boolean(self, key, default):
        v = self._get(key)
        if v is _MISSING or v is None:
            return default
        if not isinstance(v, bool):
            raise ValueError(f"{self.path}.{key} must be true or false; got {v!r}")
        return v

    def string(self, key, default, choices):
        v = self._get(key)
        if v is _MISSING or v is None:
            return default
        if v not in choices:
            raise ValueError(f"{self.path}.{key} must be one of {list(choices)}; got {v!r}")
        return v

    def finish(self, accepted, ignored=()):
        """Keys that exist in DeepSpeed but do nothing here (`ignored`) pass; others are errors."""
        for key in self.value:
            if key not in self.read and key not in ignored:
                raise ValueError(f"{self.path}.{key} is not a key this section reads; the keys "
                                 f"are {accepted}")
