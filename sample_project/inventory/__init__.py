"""Stock reservation: the first reference system (one counter per SKU, reserved under a row lock)."""
