"""A module of declarations that fails to import (its import names a module that does not exist)."""

import lockkit_tests.tasks.hx_decl.no_such_module  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401
