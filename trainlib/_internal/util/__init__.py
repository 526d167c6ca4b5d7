"""Small helpers shared by the rest of trainlib, each defined once. Driver and workers."""
