"""perfmodel."""
