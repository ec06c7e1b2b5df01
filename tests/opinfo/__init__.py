"""OpInfo differential harness (see README.md)."""
