"""Shared fixtures. Tests run with PYTHONSAFEPATH so the repository root (which holds a
folder named `operator`) never shadows the standard library."""
