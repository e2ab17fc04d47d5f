"""rlslice component."""
