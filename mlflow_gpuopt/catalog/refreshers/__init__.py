"""catalog/refreshers."""
