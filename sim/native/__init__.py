"""The native simulated NVML library (C) and the publisher that feeds it."""
