"""gpulens sim package."""
