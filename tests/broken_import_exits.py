"""A module whose import calls exit: the implementation cannot be loaded (exit 2)."""

import sys

print("importing broken_import_exits")
sys.exit(0)
