"""Real-GPU conformance: record pynvml behaviour on a real GPU and diff the simulator against it."""
