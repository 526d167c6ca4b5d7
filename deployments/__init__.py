"""deployments package."""
