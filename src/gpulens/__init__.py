"""gpulens: GPU observability for shared NVIDIA fleets."""

__version__ = "0.1.0"
