"""Pipeline steps (flows/ -> tasks/ -> trainlib/)."""
