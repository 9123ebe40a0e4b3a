"""The gpulens rightsizing analyzer (installed as `gpulens.analyzer`)."""
