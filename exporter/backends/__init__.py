"""gpulens backends package."""
