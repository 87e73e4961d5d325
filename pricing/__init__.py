"""The shipped, dated, sourced price and hardware snapshot (data, not code)."""
