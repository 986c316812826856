"""A module whose import raises: the implementation cannot be loaded (exit 2)."""

raise RuntimeError("this module cannot be imported")
