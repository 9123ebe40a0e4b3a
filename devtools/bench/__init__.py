"""Benchmarks: gpulens-exporter side by side with a peer on the same simulated node (`make bench`)."""
