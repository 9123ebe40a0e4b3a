"""gpulens collectors package."""
