"""gpulens attribution package."""
