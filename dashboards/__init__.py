"""gpulens dashboards package."""
